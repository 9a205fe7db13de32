// The tenant record under local workerd: its own page origins (CORS and requests), the models
// it allows, its privacy threshold, monthly limits and per-user and per-feature sub-limits.
// Prices are 1 USD per 1,000 tokens each way; a request of "hi" with max_tokens 100 holds
// 109 tokens (0.109 USD) and the fake upstream reports 10 + 20 used.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, chat, admin, mintToken, ORIGIN } from "./harness.mjs";
import { startFakeUpstream } from "./fake-upstream.mjs";

const tenants = ["shop", "models", "private", "users", "features", "monthly", "tokens", "growing", "worst", "grows", "burst", "versions", "overshoot"];
let upstream, worker;
before(async () => {
  upstream = await startFakeUpstream();
  const secrets = Object.fromEntries(tenants.map((t) => [`TENANT_SECRET_${t.toUpperCase()}`, `${t}-secret`]));
  worker = await startWorker({ UPSTREAM_URL: upstream.url, PRICE_IN_PER_1K: "1", PRICE_OUT_PER_1K: "1", ...secrets });
});
after(async () => { await worker?.mf.dispose(); await upstream?.close(); });

const hi = { messages: [{ role: "user", content: "hi" }], max_tokens: 100 };
const tokenFor = (ten, claims = {}) => mintToken({ ten, ...claims }, `${ten}-secret`);
const put = async (ten, record) => {
  const res = await admin(worker.url, "PUT", `/v1/tenants/${ten}`, record);
  assert.equal(res.status, 200, await res.clone().text());
  return res.json();
};
const usage = async (ten, query = "") => (await admin(worker.url, "GET", `/v1/tenants/${ten}/usage${query}`)).json();
/** Sends `body` and reads the whole answer (so its hold is settled before the next). */
const send = async (ten, body = hi, claims = {}, origin = ORIGIN) => {
  const res = await chat(worker.url, body, { token: tokenFor(ten, { origin, ...claims }), origin });
  return { status: res.status, headers: res.headers, body: await res.json() };
};
const preflight = (origin) => fetch(`${worker.url}/v1/chat/completions`, { method: "OPTIONS", headers: { origin } });

test("a tenant's own origins replace the deployment's, for preflights and for requests", async () => {
  const shop = "https://shop.example.test";
  assert.equal((await preflight(shop)).headers.get("access-control-allow-origin"), null, "unknown before the record");
  await put("shop", { allowed_origins: [shop] });
  const pre = await preflight(shop);
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get("access-control-allow-origin"), shop);
  const ok = await send("shop", hi, {}, shop);
  assert.equal(ok.status, 200);
  assert.equal(ok.headers.get("access-control-allow-origin"), shop);
  // The deployment's origin is no longer this tenant's, even with a token bound to it.
  const before = upstream.state.requests;
  const refused = await send("shop", hi, {}, ORIGIN);
  assert.equal(refused.status, 403);
  assert.equal(refused.body.error.code, "origin_not_allowed");
  assert.equal(upstream.state.requests, before, "nothing was forwarded");
  assert.equal((await preflight("https://evil.test")).headers.get("access-control-allow-origin"), null);
  // Dropping the list takes the origin out of the registry too.
  await put("shop", {});
  assert.equal((await preflight(shop)).headers.get("access-control-allow-origin"), null);
  assert.equal((await send("shop", hi, {}, ORIGIN)).status, 200, "back on the deployment's list");
});

test("a model the tenant does not allow is a 403 and is not forwarded", async () => {
  await put("models", { allowed_models: ["small"] });
  const before = upstream.state.requests;
  const refused = await send("models", { ...hi, model: "large" });
  assert.equal(refused.status, 403);
  assert.equal(refused.body.error.code, "model_not_allowed");
  assert.equal(upstream.state.requests, before);
  assert.equal((await send("models", { ...hi, model: "small" })).status, 200);
});

test("the tenant's privacy threshold decides which classes get a 451", async () => {
  const mail = { ...hi, messages: [{ role: "user", content: "draft a reply to jane.doe@example.com" }] };
  assert.equal((await send("private", mail)).status, 200, "an e-mail is medium; the default keeps high");
  await put("private", { keep_on_device_at: "medium" });
  const before = upstream.state.requests;
  const refused = await send("private", mail);
  assert.equal(refused.status, 451);
  assert.match(refused.body.error.message, /email/);
  assert.doesNotMatch(refused.body.error.message, /jane/);
  assert.equal(upstream.state.requests, before);
});

test("per-user limits: one user's day is used up, another's is not, the tenant's is untouched", async () => {
  await put("users", { per_user: { daily_tokens: 120 } });
  assert.equal((await send("users", hi, { sub: "alice" })).status, 200);
  // 30 used; the next worst case (109) is over the 90 left.
  const refused = await send("users", hi, { sub: "alice" });
  assert.equal(refused.status, 402);
  assert.match(refused.body.error.message, /this user's daily budget/);
  assert.match(refused.body.error.message, /90 tokens/);
  assert.equal((await send("users", hi, { sub: "bob" })).status, 200);
  const byUser = await usage("users", "?group_by=user");
  assert.deepEqual(byUser.groups.map((g) => [g.key, g.requests]), [["alice", 1], ["bob", 1]]);
});

test("per-feature limits apply to requests tagged with the feature only, by the month", async () => {
  await put("features", { per_feature: { summarize: { monthly_usd: 0.12 } } });
  assert.equal((await send("features", hi, { feat: "summarize" })).status, 200);
  const refused = await send("features", hi, { feat: "summarize", sub: "someone-else" });
  assert.equal(refused.status, 402);
  assert.match(refused.body.error.message, /this feature's monthly budget; remaining this month: 0.09/);
  assert.equal((await send("features", hi, { feat: "chat" })).status, 200);
  assert.equal((await send("features", hi)).status, 200, "untagged requests have no feature limit");
});

test("a monthly limit of the tenant refuses once the month's spend leaves no room", async () => {
  await put("monthly", { monthly_tokens: 120, daily_tokens: 1000 });
  assert.equal((await send("monthly", hi)).status, 200);
  const refused = await send("monthly", hi);
  assert.equal(refused.status, 402);
  assert.match(refused.body.error.message, /this tenant's monthly budget/);
  const u = await usage("monthly");
  assert.deepEqual(u.this_month, { usd: 0.03, tokens: 30 });
  assert.deepEqual(u.today, { usd: 0.03, tokens: 30 });
  assert.equal(u.tenant.monthly_tokens, 120);
});

test("bad tenant records are 400s that name the field, and change nothing", async () => {
  await put("monthly", { monthly_tokens: 120 });
  const cases = [
    [{ per_user: { daily_usd: -1 } }, "per_user.daily_usd"],
    [{ per_feature: { x: { tokens_per_minute: -2 } } }, "per_feature.x.tokens_per_minute"],
    [{ allowed_origins: ["not an origin"] }, "allowed_origins"],
    [{ daily_limit: 5 }, "daily_limit"],
  ];
  for (const [record, field] of cases) {
    const res = await admin(worker.url, "PUT", "/v1/tenants/monthly", record);
    assert.equal(res.status, 400, JSON.stringify(record));
    assert.equal((await res.json()).error.param, field);
  }
  const wrongType = await admin(worker.url, "PUT", "/v1/tenants/monthly", { keep_on_device_at: "secret" });
  assert.equal(wrongType.status, 400);
  assert.equal((await usage("monthly")).tenant.monthly_tokens, 120, "the saved record is unchanged");
});

test("a server token calls without a page, and a tenant's record sets how long tokens may live", async () => {
  const now = Math.floor(Date.now() / 1000);
  const server = tokenFor("tokens", { origin: undefined, kind: "server" });
  let res = await chat(worker.url, hi, { token: server, origin: null });
  assert.equal(res.status, 200, await res.clone().text());
  await res.json();
  const twoHours = tokenFor("tokens", { exp: now + 7200 });
  res = await chat(worker.url, hi, { token: twoHours });
  assert.equal(res.status, 401);
  assert.match((await res.json()).error.message, /longer than this tenant's maximum of 3600 s/);
  await put("tokens", { max_token_lifetime_s: 7200 });
  res = await chat(worker.url, hi, { token: twoHours });
  assert.equal(res.status, 200, await res.clone().text());
  await res.json();
  const tooShort = await admin(worker.url, "PUT", "/v1/tenants/tokens", { max_token_lifetime_s: 10 });
  assert.equal(tooShort.status, 400);
});

/** Streams `max_tokens` 512 for `ten` and reads every event's JSON (`[DONE]` as the string). */
const stream = async (ten) => {
  const body = { ...hi, max_tokens: 512, stream: true, stream_options: { include_usage: true } };
  const res = await chat(worker.url, body, { token: tokenFor(ten) });
  if (res.status !== 200) return { status: res.status, events: [] };
  const text = await res.text();
  const events = text.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6))
    .map((d) => (d === "[DONE]" ? d : JSON.parse(d)));
  return { status: 200, events };
};
/** The tenant's usage once no hold is in flight. */
const settledUsage = async (ten, query = "") => {
  for (let i = 0; i < 50; i++) {
    const u = await usage(ten, query);
    if (u.in_flight === 0) return u;
    await new Promise((r) => setTimeout(r, 100));
  }
  return usage(ten, query);
};

test("a growing hold admits a stream its worst case would not fit, and ends it cleanly when the budget runs out", async () => {
  await put("growing", { holds: "growing", daily_tokens: 120 });
  upstream.state.completionTokens = 200;
  try {
    const { status, events } = await stream("growing");
    assert.equal(status, 200);
    assert.equal(events.at(-1), "[DONE]");
    const last = events.at(-2);
    assert.equal(last.choices[0].finish_reason, "length");
    assert.equal(last.straddle.budget_exhausted, true);
    const delivered = events.filter((e) => e.choices?.[0]?.delta?.content).length;
    // 120 tokens pay for the 9-token prompt bound and three 32-token chunks.
    assert.equal(delivered, 96);
    const u = await settledUsage("growing", "?records=1");
    const spent = u.groups[0].tokens_in + u.groups[0].tokens_out;
    assert.ok(spent <= 120, `billed ${spent} of 120 tokens`);
    assert.equal(u.records[0].outcome, "budget_exhausted");
    // The day's budget is spent: the next stream is refused before anything is sent.
    assert.equal((await stream("growing")).status, 402);
  } finally {
    upstream.state.completionTokens = 20;
  }
});

test("answers far shorter than max_tokens: worst-case holds refuse them, growing holds serve what the budget pays for", async () => {
  // 40 answers of 10 + 20 tokens (the fake upstream's usage), asked for with max_tokens 512.
  const k = 40;
  const served = {};
  for (const [ten, holds] of [["worst", "worst_case"], ["grows", "growing"]]) {
    await put(ten, { holds, daily_tokens: 30 * k });
    served[ten] = 0;
    for (let i = 0; i < k; i++) {
      const { status, events } = await stream(ten);
      if (status === 200 && events.at(-2)?.usage) served[ten] += 1;
    }
    const u = await settledUsage(ten);
    assert.ok((u.groups[0]?.tokens_in ?? 0) + (u.groups[0]?.tokens_out ?? 0) <= 30 * k, ten);
  }
  // A 521-token worst case fits only while 521 tokens are left: 23 answers.
  assert.equal(served.worst, 23);
  // The last answers are refused while 30 tokens remain: a first chunk (32) must fit.
  assert.ok(served.grows >= 0.95 * k, `served ${served.grows} of ${k}`);
});

test("a burst against a growing budget waits for holds in flight instead of refusing while money remains", async () => {
  // 20 answers at once, each 30 tokens (10 + 20) of a 41-token first hold, for a budget of 10.
  await put("burst", { holds: "growing", daily_tokens: 300 });
  upstream.state.delayMs = 200;
  try {
    const results = await Promise.all(Array.from({ length: 20 }, () => stream("burst")));
    const served = results.filter((r) => r.status === 200 && r.events.at(-2)?.usage).length;
    const refused = results.filter((r) => r.status === 402).length;
    assert.equal(served + refused, 20);
    // Only 7 first holds fit at once; the rest wait, and are refused only once fewer than 41
    // tokens remain: after the ninth answer.
    assert.equal(served, 9);
    const u = await settledUsage("burst");
    assert.equal(u.groups[0].tokens_in + u.groups[0].tokens_out, 270);
  } finally {
    upstream.state.delayMs = 0;
  }
});

test("500 concurrent streams against a growing budget: billed spend never passes the limit, and no stream reads more than a chunk past its hold", async () => {
  // Answers of 100 tokens, dripping, so that streams are cut mid-way as the budget runs out.
  await put("overshoot", { holds: "growing", daily_tokens: 3000 });
  Object.assign(upstream.state, { mode: "drip", dripMs: 5, completionTokens: 100 });
  try {
    const results = await Promise.all(Array.from({ length: 500 }, () => stream("overshoot")));
    const u = await settledUsage("overshoot", "?records=1000");
    const billed = u.groups.reduce((sum, g) => sum + g.tokens_in + g.tokens_out, 0);
    assert.ok(billed <= 3000, `billed ${billed} of 3000 tokens`);
    assert.equal(u.held.tokens, 0);
    const admitted = results.filter((r) => r.status === 200).length;
    assert.equal(u.records.length, admitted);
    assert.ok(u.records.some((r) => r.outcome === "budget_exhausted"), JSON.stringify({ admitted, billed, outcomes: u.records.map((r) => r.outcome).slice(0, 20), statuses: [...new Set(results.map((r) => r.status))] }));
    // What the worker read from the upstream past a stream's hold: at most one chunk.
    const past = Math.max(...u.records.map((r) => r.unbilled_tokens));
    assert.ok(past <= 32, `a stream read ${past} tokens past its hold`);
  } finally {
    Object.assign(upstream.state, { mode: "ok", dripMs: 0, completionTokens: 20 });
  }
});

test("usage groups by router, policy, quality-model, edge-model and upstream-model version", async () => {
  const envelope = (router, edge) => ({ router_version: router, policy_version: "balanced-1", edge_model_sha256: edge });
  for (const [router, edge] of [["r1", "aa"], ["r1", "aa"], ["r2", "bb"]]) {
    const r = await send("versions", { ...hi, straddle: envelope(router, edge) });
    assert.equal(r.status, 200, JSON.stringify(r.body));
  }
  const groups = async (by) => Object.fromEntries((await settledUsage("versions", `?group_by=${by}`)).groups.map((g) => [g.key, g.requests]));
  assert.deepEqual(await groups("router_version"), { r1: 2, r2: 1 });
  assert.deepEqual(await groups("edge_model"), { aa: 2, bb: 1 });
  assert.deepEqual(await groups("policy_version"), { "balanced-1": 3 });
  assert.deepEqual(await groups("upstream_model"), { fake: 3 });
  const bad = await admin(worker.url, "GET", "/v1/tenants/versions/usage?group_by=color");
  assert.equal(bad.status, 400);
  assert.match(await bad.text(), /edge_model/);
});
