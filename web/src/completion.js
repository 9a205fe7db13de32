// `chat.completions.create` in OpenAI's shapes: one `chat.completion`, or a stream of chunks
// the answer fills as it runs. Each finished answer is recorded for the session's stats and
// the user's feedback, and an edge answer's usage queued for the worker.
import { answer } from "./answer.js";
import { validate } from "./request.js";
import { reportEdgeAnswer } from "./usage.js";

const newId = () => `chatcmpl-${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;

/** `chat.completions.create`: an answer, or with `stream: true` an async iterable of chunks. */
export async function createCompletion(client, request) {
  const req = validate(request);
  const started = performance.now();
  // One signal for the caller's abort and for a stream consumer that stops reading.
  const stop = new AbortController();
  if (req.signal) {
    if (req.signal.aborted) stop.abort();
    else req.signal.addEventListener("abort", () => stop.abort(), { once: true });
  }
  const id = newId();
  const created = Math.floor(Date.now() / 1000);
  const call = { id, created, started, stop };
  if (!req.stream) return await whole(client, req, call);
  return streamed(client, req, call);
}

/** The answer as one `chat.completion`. */
async function whole(client, req, { id, created, started, stop }) {
  let text = "";
  const end = await answer(client, req, (t) => { text += t; }, started, stop.signal, id);
  const calls = end.tool_calls?.length ? { tool_calls: end.tool_calls } : {};
  return {
    id, object: "chat.completion", created, model: end.model,
    choices: [{ index: 0, message: { role: "assistant", content: calls.tool_calls && !text ? null : text, ...calls }, finish_reason: end.finish_reason }],
    usage: end.usage, straddle: finishMeta(client, id, end, started),
  };
}

/** The answer as chunks: it runs ahead and fills a queue the iterator drains. */
function streamed(client, req, call) {
  const run = { queue: [], wake: null, outcome: null, first: true };
  const notify = () => { run.wake?.(); run.wake = null; };
  answer(client, req, (t) => { run.queue.push(t); notify(); }, call.started, call.stop.signal, call.id).then(
    (end) => { run.outcome = { end }; notify(); },
    (error) => { run.outcome = { error }; notify(); },
  );
  return chunks(client, run, call);
}

/** The stream's iterator; a consumer that stops reading before the end stops the answer. */
async function* chunks(client, run, call) {
  try {
    yield* drain(client, run, call);
  } finally {
    if (!run.outcome) call.stop.abort();
  }
}

/** Text chunks as the answer shows text, then the closing chunks once it has ended. */
async function* drain(client, run, call) {
  const { id, created } = call;
  for (;;) {
    if (run.queue.length) {
      const content = run.queue.splice(0).join("");
      const delta = run.first ? { role: "assistant", content } : { content };
      run.first = false;
      yield { id, object: "chat.completion.chunk", created, model: modelName(client), choices: [{ index: 0, delta, finish_reason: null }] };
      continue;
    }
    if (run.outcome?.error) throw run.outcome.error;
    if (run.outcome) {
      yield* closing(client, run, call);
      return;
    }
    await new Promise((r) => { run.wake = r; });
  }
}

/** The last chunks: the tool calls if any, then the finish with usage and Straddle's metadata. */
async function* closing(client, run, { id, created, started }) {
  const { end } = run.outcome;
  if (end.tool_calls?.length) {
    // A call streams whole, once complete, as the cloud server streams it.
    const tool_calls = end.tool_calls.map((c, index) => ({ index, ...c }));
    const delta = run.first ? { role: "assistant", content: null, tool_calls } : { tool_calls };
    run.first = false;
    yield { id, object: "chat.completion.chunk", created, model: end.model, choices: [{ index: 0, delta, finish_reason: null }] };
  }
  yield { id, object: "chat.completion.chunk", created, model: end.model,
    choices: [{ index: 0, delta: {}, finish_reason: end.finish_reason }], usage: end.usage,
    straddle: finishMeta(client, id, end, started) };
}

/** The model a text chunk names: the edge model's, before the answer says whose it is. */
function modelName(client) {
  return client.edge?.name ?? "straddle";
}

/** Straddle's metadata for a finished answer, recorded for stats, feedback and edge usage. */
function finishMeta(client, id, end, started) {
  const meta = { ...end.meta, latency_ms: performance.now() - started, ttft_ms: end.ttft_ms ?? null };
  client.sessionStats.record(meta, end.usage.completion_tokens);
  client.answers.set(id, { route: meta.route, decision: end.decision, cost_usd: meta.cost.usd, latency_s: meta.latency_ms / 1000 });
  if (meta.route === "edge") reportEdgeAnswer(client, id, end, meta);
  return meta;
}
