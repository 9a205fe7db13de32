// The device answers one request at a time. The queue lives on the client (`edgeJobs`, the
// answers waiting or running, and `edgeTail`, the promise the next one waits on), so the
// router can weigh how long a new request would wait.

/**
 * Runs `work` on the device once the answers ahead of it are done: one at a time, so two
 * requests never interleave on the engine. `work` gets its job, whose `done` it counts up.
 */
export async function onEdge(client, expectedTokens, work) {
  const job = { expected: expectedTokens, done: 0 };
  client.edgeJobs.push(job);
  const ahead = client.edgeTail;
  let release;
  client.edgeTail = new Promise((r) => { release = r; });
  try {
    await ahead;
    return await work(job);
  } finally {
    client.edgeJobs.splice(client.edgeJobs.indexOf(job), 1);
    release();
  }
}

/** Seconds of answers ahead of a new request on the device, at its measured speed. */
export function edgeBusySeconds(client) {
  const tokens = client.edgeJobs.reduce((sum, j) => sum + Math.max(0, j.expected - j.done), 0);
  return client.edge && tokens > 0 ? tokens / client.edge.tokensPerS : 0;
}
