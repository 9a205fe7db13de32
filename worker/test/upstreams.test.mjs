// What each upstream is sent: the caller's model under the upstream's own name (and only to
// upstreams that serve it), its API key from a secret, no Straddle envelope; and an answer
// that outlasts the upstream's total timeout is ended with an error the client can read.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, chat, admin } from "./harness.mjs";
import { startFakeUpstream } from "./fake-upstream.mjs";

let fast, any, worker;
before(async () => {
  fast = await startFakeUpstream();
  any = await startFakeUpstream();
  const upstreams = [
    {
      name: "fast-host", url: fast.url, models: { fast: "llama-3.1-8b-instruct" }, api_key_secret: "FAST_HOST_KEY",
      first_byte_timeout_ms: 1000, total_timeout_ms: 1500, price_in_per_1k: 1, price_out_per_1k: 1,
    },
    { name: "any-host", url: any.url, priority: 1, price_in_per_1k: 1, price_out_per_1k: 1 },
  ];
  worker = await startWorker({ UPSTREAMS: JSON.stringify(upstreams), FAST_HOST_KEY: "sk-fast-host-secret" });
});
after(async () => { await worker?.mf.dispose(); await fast?.close(); await any?.close(); });

const ask = (model, extra = {}) => ({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 50, ...extra });
const settledUsage = async (query) => {
  for (let i = 0; i < 50; i++) {
    const u = await (await admin(worker.url, "GET", "/v1/tenants/acme/usage")).json();
    if (u.in_flight === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  return (await admin(worker.url, "GET", `/v1/tenants/acme/usage${query}`)).json();
};

test("a mapped model goes to its upstream under that upstream's name, with its key, without the envelope", async () => {
  const straddle = { reasons: ["long_output", "budget_ok"], router_version: "r1", policy_version: "p1", quality_model_version: "q1" };
  const res = await chat(worker.url, ask("fast", { straddle }));
  assert.equal(res.status, 200);
  await res.json();
  assert.equal(fast.state.requests, 1);
  assert.equal(any.state.requests, 0);
  assert.equal(fast.state.last.body.model, "llama-3.1-8b-instruct");
  assert.equal(fast.state.last.body.straddle, undefined, "the envelope stays with the worker");
  assert.equal(fast.state.last.headers.authorization, "Bearer sk-fast-host-secret");
  const byModel = await settledUsage("?group_by=model");
  assert.deepEqual(byModel.groups.map((g) => g.key), ["fast"], "usage keeps the caller's model name");
  // The record itself carries the page's reasons and versions, and who answered.
  const [record] = (await settledUsage("?records=5")).records;
  assert.equal(record.route_reason, "long_output; budget_ok");
  assert.equal(record.router_version, "r1");
  assert.equal(record.quality_model_version, "q1");
  assert.equal(record.policy_version, "p1");
  assert.equal(record.upstream, "fast-host");
  assert.equal(record.degraded, false);
  assert.equal(record.outcome, "ok");
});

test("other models go to the upstream that takes any, named as the caller named them", async () => {
  const res = await chat(worker.url, ask("some-other-model"));
  assert.equal(res.status, 200);
  await res.json();
  assert.equal(any.state.requests, 1);
  assert.equal(any.state.last.body.model, "some-other-model");
  assert.equal(any.state.last.headers.authorization, undefined, "no key configured, none sent");
});

test("the model list names every model, the deployment's default first", async () => {
  const list = await (await fetch(`${worker.url}/v1/models`)).json();
  assert.deepEqual(list.data.map((m) => m.id), ["default", "fast"]);
});

test("a stream that outlasts the total timeout ends with an error event and is billed for what came", async () => {
  fast.state.mode = "stall";
  const started = Date.now();
  const res = await chat(worker.url, ask("fast", { stream: true, stream_options: { include_usage: true } }));
  assert.equal(res.status, 200);
  const text = await res.text();
  fast.state.mode = "ok";
  assert.ok(Date.now() - started < 5000, "ended near the 1.5 s total timeout");
  const events = text.split("\n\n").filter((e) => e.startsWith("data: ")).map((e) => e.slice(6));
  assert.equal(events.length, 11, "ten content chunks, then the error");
  assert.equal(JSON.parse(events.at(-1)).error.type, "upstream_timeout");
  assert.doesNotMatch(text, /\[DONE\]/);
  const byOutcome = await settledUsage("?group_by=outcome");
  const timedOut = byOutcome.groups.find((g) => g.key === "upstream_timeout");
  assert.equal(timedOut.requests, 1);
  assert.equal(timedOut.tokens_out, 10, "the chunks that reached the client");
});

test("a whole answer that outlasts the total timeout is a 504", async () => {
  fast.state.mode = "stall";
  const res = await chat(worker.url, ask("fast"));
  fast.state.mode = "ok";
  assert.equal(res.status, 504);
  assert.match((await res.json()).error.message, /within 1500 ms/);
});

test("too many messages is a 400 naming the field, before anything is held", async () => {
  assert.equal((await admin(worker.url, "PUT", "/v1/tenants/acme", { max_messages: 3 })).status, 200);
  const long = { model: "x", max_tokens: 5, messages: Array.from({ length: 4 }, () => ({ role: "user", content: "hi" })) };
  const before = any.state.requests;
  const res = await chat(worker.url, long);
  assert.equal(res.status, 400);
  assert.equal((await res.json()).error.param, "messages");
  assert.equal(any.state.requests, before);
  assert.equal((await admin(worker.url, "PUT", "/v1/tenants/acme", {})).status, 200);
});

test("oversized, truncated, mistyped and unknown-field bodies are refused before anything is sent", async () => {
  const before = any.state.requests + fast.state.requests;
  const huge = JSON.stringify(ask("x", { messages: [{ role: "user", content: "a".repeat(1_100_000) }] }));
  let res = await chat(worker.url, huge);
  assert.equal(res.status, 413);
  assert.equal((await res.json()).error.type, "too_large");
  res = await chat(worker.url, '{"model":"x","messages":[{"role":"user","content":"hi"}');
  assert.equal(res.status, 400);
  assert.equal((await res.json()).error.code, "invalid_json");
  res = await chat(worker.url, ask("x", { max_tokens: "five" }));
  assert.equal(res.status, 400);
  assert.match((await res.json()).error.message, /invalid type/);
  res = await chat(worker.url, ask("x", { temprature: 0.2 }));
  assert.equal(res.status, 400);
  assert.equal((await res.json()).error.param, "temprature");
  assert.equal(any.state.requests + fast.state.requests, before, "nothing was forwarded");
});
