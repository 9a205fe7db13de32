// An existing serving engine behind the worker: llama.cpp's own `llama-server`, built from
// source by `cargo xtask test` and started for real on 127.0.0.1 with the real model, beside
// our cloud server. Streaming with usage, the official client, failover to it and away from
// it, and its own errors passed through.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startWorker, chat, admin, freePort, startCloud, startLlamaServer, mintToken, ORIGIN, needsEnv } from "./harness.mjs";

const llamaBin = process.env.STRADDLE_LLAMA_SERVER;
const cloudBin = process.env.STRADDLE_CLOUD_BIN;
const model = process.env.STRADDLE_TEST_MODEL;
const skip = needsEnv("STRADDLE_LLAMA_SERVER", "STRADDLE_CLOUD_BIN", "STRADDLE_TEST_MODEL");

const CTX_PER_SLOT = 1024;
let llama, cloud, direct, toLlama, fromLlama;
before(async () => {
  if (skip) return;
  llama = await startLlamaServer(llamaBin, model, { slots: 2, ctxPerSlot: CTX_PER_SLOT });
  cloud = await startCloud(cloudBin, model);
  direct = await startWorker({ UPSTREAM_URL: llama.url });
  // Failover to llama-server: the first choice is a port where nothing listens.
  toLlama = await startWorker({
    UPSTREAMS: JSON.stringify([
      { name: "gone", url: `http://127.0.0.1:${await freePort()}`, priority: 0 },
      { name: "llama-server", url: llama.url, priority: 1 },
    ]),
  });
  // Failover away from it: llama-server first, our cloud server behind it.
  fromLlama = await startWorker({
    UPSTREAMS: JSON.stringify([
      { name: "llama-server", url: llama.url, priority: 0, first_byte_timeout_ms: 1500 },
      { name: "straddle-cloud", url: cloud.url, priority: 1 },
    ]),
  });
});
after(async () => {
  for (const w of [direct, toLlama, fromLlama]) await w?.mf.dispose();
  llama?.kill();
  cloud?.kill();
});

const ask = { messages: [{ role: "user", content: "Name three primary colors." }], max_tokens: 12 };

/** The tenant's usage grouped by `by`, once every hold has settled. */
async function usage(worker, by) {
  for (let i = 0; i < 50; i++) {
    const u = await (await admin(worker.url, "GET", `/v1/tenants/acme/usage?group_by=${by}`)).json();
    if (u.in_flight === 0 && u.groups.length) return u;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("holds did not settle");
}

const events = (text) => text.split("\n").filter((l) => l.startsWith("data: {")).map((l) => JSON.parse(l.slice(6)));

test("a stream through the worker from llama-server carries its usage, and the record bills exactly that", { skip }, async () => {
  const res = await chat(direct.url, { ...ask, stream: true, stream_options: { include_usage: true } });
  assert.equal(res.status, 200);
  const text = await res.text();
  assert.match(text, /data: \[DONE\]/);
  const chunks = events(text);
  const content = chunks.flatMap((c) => c.choices ?? []).map((c) => c.delta?.content ?? "").join("");
  assert.ok(content.length > 0, "streamed text");
  const reported = chunks.findLast((c) => c.usage)?.usage;
  assert.ok(reported?.completion_tokens > 0 && reported.prompt_tokens > 0, JSON.stringify(reported));
  const u = await usage(direct, "outcome");
  assert.deepEqual(u.groups.map((g) => g.key), ["ok"]);
  // Billed as reported, except what llama-server's template added past the worker's prompt
  // bound (SmolLM2's default system turn): capped at the hold, never overshooting, and listed.
  const [record] = (await (await admin(direct.url, "GET", "/v1/tenants/acme/usage?records=1")).json()).records;
  assert.equal(record.tokens_out, reported.completion_tokens);
  assert.equal(record.tokens_in + (record.unbilled_tokens ?? 0), reported.prompt_tokens, JSON.stringify(record));
  assert.equal(record.upstream_model, "smollm2");
});

test("the official openai client talks to llama-server through the worker, whole and streamed", { skip }, async () => {
  const client = new OpenAI({
    baseURL: `${direct.url}/v1`, apiKey: mintToken(), defaultHeaders: { origin: ORIGIN }, maxRetries: 0,
  });
  const whole = await client.chat.completions.create({ model: "smollm2", ...ask });
  assert.ok(whole.choices[0].message.content.length > 0);
  assert.ok(["stop", "length"].includes(whole.choices[0].finish_reason));
  assert.ok(whole.usage.completion_tokens > 0);
  let streamed = "";
  let last;
  for await (const chunk of await client.chat.completions.create({ model: "smollm2", ...ask, stream: true })) {
    streamed += chunk.choices[0]?.delta?.content ?? "";
    last = chunk.choices[0]?.finish_reason ?? last;
  }
  // Greedy by default on neither side, so compare shape, not text.
  assert.ok(streamed.length > 0);
  assert.ok(["stop", "length"].includes(last));
});

test("llama-server's own refusal (a prompt past its context) reaches the caller as its 400, and the hold is released", { skip }, async () => {
  const long = "colour ".repeat(CTX_PER_SLOT * 2);
  const res = await chat(direct.url, { messages: [{ role: "user", content: long }], max_tokens: 4 });
  const body = await res.json();
  assert.equal(res.status, 400, JSON.stringify(body));
  assert.ok(body.error?.message, "the upstream's error is passed on");
  const u = await (await admin(direct.url, "GET", "/v1/tenants/acme/usage")).json();
  assert.equal(u.in_flight, 0);
  assert.equal(u.held.tokens, 0);
});

test("a dead first choice fails over to llama-server, and the record names it and its model", { skip }, async () => {
  const res = await chat(toLlama.url, { ...ask, stream: true });
  assert.equal(res.status, 200);
  assert.match(await res.text(), /\[DONE\]/);
  const upstreams = await usage(toLlama, "upstream");
  assert.deepEqual(upstreams.groups.map((g) => [g.key, g.requests]), [["llama-server", 1]]);
  const degraded = await usage(toLlama, "degraded");
  assert.deepEqual(degraded.groups.map((g) => g.key), ["degraded"]);
});

test("llama-server stopped (SIGSTOP: it accepts but never answers) fails over to our cloud server, and back once it resumes", { skip }, async () => {
  llama.proc.kill("SIGSTOP");
  try {
    const res = await chat(fromLlama.url, ask);
    const body = await res.json();
    assert.equal(res.status, 200, JSON.stringify(body));
    assert.ok(body.choices[0].message.content.length > 0);
  } finally {
    llama.proc.kill("SIGCONT");
  }
  // One failure does not open the breaker: the next request is llama-server's again.
  const res = await chat(fromLlama.url, ask);
  assert.equal(res.status, 200);
  await res.json();
  const upstreams = await usage(fromLlama, "upstream");
  assert.deepEqual(upstreams.groups.map((g) => [g.key, g.requests]), [["llama-server", 1], ["straddle-cloud", 1]]);
});
