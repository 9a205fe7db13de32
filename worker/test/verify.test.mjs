// /v1/verify through the worker under local workerd to the real cloud server: tenant auth,
// budget and cost records apply to speculative decoding's verify calls as to chat.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, mintToken, admin, ORIGIN, startCloud, needsEnv } from "./harness.mjs";

const cloudBin = process.env.STRADDLE_CLOUD_BIN;
const model = process.env.STRADDLE_TEST_MODEL;
const skip = needsEnv("STRADDLE_CLOUD_BIN", "STRADDLE_TEST_MODEL");

let cloud, worker, chatOnly;
before(async () => {
  if (skip) return;
  cloud = await startCloud(cloudBin, model);
  const upstream = cloud.url;
  worker = await startWorker({ UPSTREAM_URL: upstream, UPSTREAM_SUPPORTS_VERIFY: "true", PRICE_IN_PER_1K: "0.001", PRICE_OUT_PER_1K: "0.002" });
  chatOnly = await startWorker({ UPSTREAM_URL: upstream });
});
after(async () => {
  await worker?.mf.dispose();
  await chatOnly?.mf.dispose();
  cloud?.kill();
});

const verify = (url, body, token = mintToken()) => fetch(`${url}/v1/verify`, {
  method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${token}`, origin: ORIGIN },
  body: JSON.stringify(body),
});
const messages = [{ role: "user", content: "List three primary colors." }];

test("a draft is verified through the worker: the cloud's greedy token, then a draft of it accepted", { skip }, async () => {
  // A draft the model would never write: rejected at once, and the verifier says what it writes.
  const first = await verify(worker.url, { messages, draft_tokens: [0] });
  assert.equal(first.status, 200);
  const a = await first.json();
  assert.equal(a.accepted, 0);
  // Drafting exactly that token gets it accepted, and the verifier adds the next one.
  const b = await (await verify(worker.url, { messages, draft_tokens: [a.next_token, 0] })).json();
  assert.equal(b.accepted, 1);
  assert.ok(b.usage.prompt_tokens > 0);
  let usage;
  for (let i = 0; i < 50; i++) {
    usage = await (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=outcome")).json();
    if (usage.groups.find((g) => g.key === "ok")?.requests === 2 && usage.in_flight === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  const ok = usage.groups.find((g) => g.key === "ok");
  assert.equal(ok.requests, 2, "both calls recorded");
  assert.ok(ok.usd > 0, "billed at the upstream's price");
});

test("a verify session continues through the worker with the draft alone, billed for what it sends", { skip }, async () => {
  const session = `s-${Date.now()}`;
  const first = await verify(worker.url, { messages, draft_tokens: [0], session });
  assert.equal(first.status, 200);
  const a = await first.json();
  assert.ok(a.session_length > 1);
  // The continuation carries no prefix: the worker must not ask for one, and holds only
  // the pending token and the draft.
  const second = await verify(worker.url, { session, session_length: a.session_length, draft_tokens: [0, 0] });
  assert.equal(second.status, 200, await second.clone().text());
  const b = await second.json();
  assert.equal(b.usage.prompt_tokens, 3, "the pending token and two drafted");
  assert.equal(b.session_length, a.session_length + b.accepted + 1);
  // A continuation the cloud no longer knows is a 409 the client answers with its prefix.
  const lost = await verify(worker.url, { session: `${session}-gone`, session_length: 9, draft_tokens: [1] });
  assert.equal(lost.status, 409);
  assert.equal((await lost.json()).error.code, "session_unknown");
  const unsized = await verify(worker.url, { session, draft_tokens: [1] });
  assert.equal(unsized.status, 400);
  assert.equal((await unsized.json()).error.param, "session_length");
});

test("verify calls carry the page's versions: acceptance per router version, the answer's feedback counted once", { skip }, async () => {
  const straddle = { router_version: "straddle-router/spec-test", policy_version: "low-cost-1", answer_id: "chatcmpl-spec" };
  const token = mintToken({ sid: "spec-page" });
  // The first call learns the cloud's token; the second drafts it and one it rejects.
  const a = await (await verify(worker.url, { messages, draft_tokens: [0], straddle }, token)).json();
  const b = await (await verify(worker.url, { messages, draft_tokens: [a.next_token, 0], straddle }, token)).json();
  assert.equal(a.accepted + b.accepted, 1);
  const rated = await fetch(`${worker.url}/v1/feedback`, { method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${token}`, origin: ORIGIN },
    body: JSON.stringify({ feedback: [{ id: "chatcmpl-spec", reward: 0.25 }] }) });
  assert.deepEqual(await rated.json(), { recorded: 1, unknown: 0 });
  const group = (await (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=router_version")).json())
    .groups.find((g) => g.key === straddle.router_version);
  assert.equal(group.requests, 2);
  assert.ok(Math.abs(group.speculative_acceptance - 1 / 3) < 1e-9, JSON.stringify(group));
  assert.equal(group.feedback_count, 1, "one answer, however many verify calls it took");
  assert.equal(group.feedback_reward, 0.25);
  const byPolicy = (await (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=policy_version")).json())
    .groups.find((g) => g.key === "low-cost-1");
  assert.equal(byPolicy?.requests, 2);
});

test("verify is refused without a token, with a bad draft, without a verify upstream, and past the budget", { skip }, async () => {
  assert.equal((await verify(worker.url, { messages, draft_tokens: [1] }, "")).status, 401);
  const empty = await verify(worker.url, { messages, draft_tokens: [] });
  assert.equal(empty.status, 400);
  assert.equal((await empty.json()).error.param, "draft_tokens");
  const oov = await verify(worker.url, { messages, draft_tokens: [10_000_000] });
  assert.equal(oov.status, 400, "the cloud's own 400 for an out-of-vocabulary id is passed through");
  const none = await verify(chatOnly.url, { messages, draft_tokens: [1] });
  assert.equal(none.status, 503);
  assert.equal((await none.json()).error.code, "verify_unsupported");
  const card = await verify(worker.url, { messages: [{ role: "user", content: "card 4111 1111 1111 1111" }], draft_tokens: [1] });
  assert.equal(card.status, 451);
  assert.equal((await admin(worker.url, "PUT", "/v1/tenants/acme", { daily_tokens: 1 })).status, 200);
  assert.equal((await verify(worker.url, { messages, draft_tokens: [1] })).status, 402);
});
