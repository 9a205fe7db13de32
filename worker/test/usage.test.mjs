// Edge usage under local workerd: the page's report of the answers it gave on the device
// becomes records beside the cloud's, counted once however often it is sent.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, chat, admin, mintToken, ORIGIN } from "./harness.mjs";
import { startFakeUpstream } from "./fake-upstream.mjs";

let upstream, worker;
before(async () => {
  upstream = await startFakeUpstream();
  worker = await startWorker({ UPSTREAM_URL: upstream.url, PRICE_IN_PER_1K: "1", PRICE_OUT_PER_1K: "2" });
});
after(async () => { await worker?.mf.dispose(); await upstream?.close(); });

const report = (body, { token = mintToken({ sid: "page-1", feat: "summarize" }), origin = ORIGIN } = {}) => {
  const headers = { "content-type": "application/json", origin };
  if (token) headers.authorization = `Bearer ${token}`;
  return fetch(`${worker.url}/v1/usage/edge`, { method: "POST", headers, body: JSON.stringify(body) });
};
const answer = (id) => ({ id, prompt_tokens: 30, completion_tokens: 20, latency_ms: 900, ttft_ms: 120,
  reasons: ["quality: P(edge answer acceptable) 0.81"], router_version: "straddle-router/0.1.0", policy_version: "balanced-1",
  edge_model_sha256: "ab".repeat(32), model: "SmolLM2-135M-Instruct" });
const usage = async (query) => (await admin(worker.url, "GET", `/v1/tenants/acme/usage${query}`)).json();

test("edge answers are recorded once, attributed to the token's user, session and feature, with the cloud spend they saved", async () => {
  const first = await report({ answers: [answer("chatcmpl-1"), answer("chatcmpl-2")] });
  assert.equal(first.status, 200);
  assert.deepEqual(await first.json(), { recorded: 2, duplicates: 0 });
  // A retried batch (the page never heard back) counts nothing twice.
  const again = await report({ answers: [answer("chatcmpl-2"), answer("chatcmpl-3")] });
  assert.deepEqual(await again.json(), { recorded: 1, duplicates: 1 });
  // A cloud answer beside them.
  const cloud = await chat(worker.url, { messages: [{ role: "user", content: "hi" }], max_tokens: 10 }, { token: mintToken({ sid: "page-1", feat: "summarize" }) });
  assert.equal(cloud.status, 200);
  const byRoute = await usage("?group_by=route");
  const edge = byRoute.groups.find((g) => g.key === "edge");
  assert.equal(edge.requests, 3);
  assert.equal(edge.usd, 0, "an edge answer spends nothing");
  // 30 tokens in at $1/1k and 20 out at $2/1k, three times.
  assert.ok(Math.abs(edge.saved_usd - 3 * (0.03 + 0.04)) < 1e-9, JSON.stringify(edge));
  assert.equal(byRoute.groups.find((g) => g.key === "cloud")?.requests, 1);
  const byFeature = await usage("?group_by=feature");
  assert.equal(byFeature.groups.find((g) => g.key === "summarize")?.requests, 4);
  const byModel = await usage("?group_by=edge_model");
  assert.equal(byModel.groups.find((g) => g.key === "ab".repeat(32))?.requests, 3);
  // Edge answers spend none of the tenant's budget.
  assert.ok(byRoute.today.tokens < 100, JSON.stringify(byRoute.today));
  // Per router version: one escalation (handed over mid-stream by the cascade) beside the
  // three edge answers of the same version, so the version's escalation rate is a quarter.
  const escalated = await chat(worker.url, { messages: [{ role: "user", content: "hi" }], max_tokens: 10,
    straddle: { router_version: "straddle-router/0.1.0", escalated_mid_stream: true } }, { token: mintToken({ sid: "page-1" }) });
  assert.equal(escalated.status, 200);
  const byVersion = (await usage("?group_by=router_version")).groups.find((g) => g.key === "straddle-router/0.1.0");
  assert.equal(byVersion.requests, 4, JSON.stringify(byVersion));
  assert.equal(byVersion.cloud_share, 0.25);
  assert.equal(byVersion.cascade_rate, 0.25);
});

test("a report is refused with the field named: text in it, too many answers, no token", async () => {
  const withText = await report({ answers: [{ ...answer("x"), content: "the answer itself" }] });
  assert.equal(withText.status, 400);
  assert.match((await withText.json()).error.message, /content/);
  const many = await report({ answers: Array.from({ length: 101 }, (_, i) => answer(`m${i}`)) });
  assert.equal(many.status, 400);
  assert.equal((await many.json()).error.param, "answers");
  assert.equal((await report({ answers: [answer("y")] }, { token: null })).status, 401);
});

test("feedback rates an answer of this session once, edge or cloud, and usage by version averages it", async () => {
  const token = mintToken({ sid: "page-fb" });
  const version = { router_version: "straddle-router/fb-test", policy_version: "balanced-1" };
  await report({ answers: [{ ...answer("fb-edge"), ...version }] }, { token });
  const cloud = await chat(worker.url, { messages: [{ role: "user", content: "hi" }], max_tokens: 10,
    straddle: { ...version, answer_id: "fb-cloud" } }, { token });
  assert.equal(cloud.status, 200);
  await cloud.text();
  const rate = (feedback, t = token) => fetch(`${worker.url}/v1/feedback`, { method: "POST",
    headers: { "content-type": "application/json", origin: ORIGIN, ...(t && { authorization: `Bearer ${t}` }) },
    body: typeof feedback === "string" ? feedback : JSON.stringify({ feedback }) });
  // Settlement of the cloud answer's record may trail its response.
  let first;
  for (let i = 0; i < 50; i++) {
    first = await (await rate([{ id: "fb-edge", reward: 1 }, { id: "fb-cloud", reward: 0.5 }])).json();
    if (first.recorded === 2) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.deepEqual(first, { recorded: 2, unknown: 0 });
  // Another session cannot rate these answers; an id nobody gave is unknown.
  const stranger = await (await rate([{ id: "fb-edge", reward: 0 }], mintToken({ sid: "someone-else" }))).json();
  assert.deepEqual(stranger, { recorded: 0, unknown: 1 });
  const byVersion = (await usage("?group_by=router_version")).groups.find((g) => g.key === version.router_version);
  assert.equal(byVersion.requests, 2);
  assert.equal(byVersion.feedback_count, 2);
  assert.equal(byVersion.feedback_reward, 0.75);
  assert.equal(byVersion.speculative_acceptance, null, "no verify calls in this version");
  // A second rating replaces the first.
  await rate([{ id: "fb-cloud", reward: 1 }]);
  const again = (await usage("?group_by=router_version")).groups.find((g) => g.key === version.router_version);
  assert.equal(again.feedback_reward, 1);
  assert.equal(again.feedback_count, 2);
  // Bad input: a reward out of range, text beside it, too many, malformed JSON, no token.
  const over = await rate([{ id: "fb-edge", reward: 2 }]);
  assert.equal(over.status, 400);
  assert.equal((await over.json()).error.param, "feedback[0].reward");
  const withText = await rate([{ id: "fb-edge", reward: 1, comment: "the answer was about my divorce" }]);
  assert.equal(withText.status, 400);
  assert.match((await withText.json()).error.message, /comment/);
  const many = await rate(Array.from({ length: 101 }, (_, i) => ({ id: `m${i}`, reward: 1 })));
  assert.equal((await many.json()).error.param, "feedback");
  assert.equal((await rate("{not json")).status, 400);
  assert.equal((await rate([{ id: "fb-edge", reward: 1 }], null)).status, 401);
});
