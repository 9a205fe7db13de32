// Tenant auth, budgets and cost records under local workerd, against the fault-injecting
// upstream. Prices are 1 USD per 1,000 tokens each way so holds are easy to reason about:
// a request of "hi" (a 9-token prompt bound) with max_tokens 100 holds 0.109 USD.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, chat, admin, mintToken, ORIGIN } from "./harness.mjs";
import { startFakeUpstream } from "./fake-upstream.mjs";

let upstream, worker;
before(async () => {
  upstream = await startFakeUpstream();
  worker = await startWorker({
    UPSTREAM_URL: upstream.url, PRICE_IN_PER_1K: "1", PRICE_OUT_PER_1K: "1", TENANT_SECRET_RATED: "rated-secret",
  });
});
after(async () => { await worker?.mf.dispose(); await upstream?.close(); });

const hi = { messages: [{ role: "user", content: "hi" }], max_tokens: 100 };
const usage = async (query = "") => (await admin(worker.url, "GET", `/v1/tenants/acme/usage${query}`)).json();
const settled = async (want) => {
  // Streams settle in waitUntil after the last byte: poll briefly.
  for (let i = 0; i < 50; i++) {
    const u = await usage();
    if ((u.groups[0]?.requests ?? 0) >= want && u.in_flight === 0) return u;
    await new Promise((r) => setTimeout(r, 100));
  }
  return usage();
};

test("tokens: missing, forged, expired, early, unbound, misused, too long-lived, wrong origin and wrong audience are 401", async () => {
  const cases = [
    ["no token", { token: null }],
    ["wrong secret", { token: mintToken({}, "not-the-secret") }],
    ["expired", { token: mintToken({ exp: Math.floor(Date.now() / 1000) - 120 }) }],
    ["not yet valid", { token: mintToken({ nbf: Math.floor(Date.now() / 1000) + 3600 }) }],
    ["other origin", { origin: "https://evil.test" }],
    ["wrong audience", { token: mintToken({ aud: "someone-else" }) }],
    ["unknown tenant", { token: mintToken({ ten: "globex" }) }],
    ["browser token bound to no origin", { token: mintToken({ origin: undefined }) }],
    ["server token sent from a page", { token: mintToken({ origin: undefined, kind: "server" }) }],
    ["server token naming an origin", { token: mintToken({ kind: "server" }), origin: null }],
    ["lives longer than the tenant allows", { token: mintToken({ exp: Math.floor(Date.now() / 1000) + 7200 }) }],
  ];
  for (const [name, opts] of cases) {
    const res = await chat(worker.url, hi, opts);
    assert.equal(res.status, 401, name);
    const body = await res.json();
    assert.equal(body.error.type, "authentication", name);
  }
  assert.equal(upstream.state.requests, 0, "nothing was forwarded");
});

test("admin routes need the admin key and a valid tenant id", async () => {
  assert.equal((await admin(worker.url, "GET", "/v1/tenants/acme/usage", undefined, "wrong")).status, 401);
  assert.equal((await admin(worker.url, "PUT", "/v1/tenants/bad%20id", {})).status, 400);
  const bad = await admin(worker.url, "PUT", "/v1/tenants/acme", { daily_usd: "lots" });
  assert.equal(bad.status, 400);
  const group = await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=password");
  assert.equal(group.status, 400);
});

test("a request is held, forwarded, settled from the upstream's usage and recorded", async () => {
  const res = await chat(worker.url, hi);
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("access-control-allow-origin"), ORIGIN);
  const body = await res.json();
  assert.equal(body.usage.completion_tokens, 20);
  const u = await settled(1);
  assert.equal(u.in_flight, 0, "the hold was released");
  assert.equal(u.groups[0].tokens_in, 10);
  assert.equal(u.groups[0].tokens_out, 20);
  assert.ok(Math.abs(u.groups[0].usd - 0.03) < 1e-9, `charged ${u.groups[0].usd}`);
});

test("a stream is passed through, counted and settled; a stream without usage is counted", async () => {
  let res = await chat(worker.url, { ...hi, stream: true, stream_options: { include_usage: true } });
  assert.equal(res.status, 200);
  assert.match(await res.text(), /data: \[DONE\]/);
  upstream.state.mode = "no-usage";
  res = await chat(worker.url, { ...hi, stream: true });
  await res.text();
  upstream.state.mode = "ok";
  const u = await settled(3);
  const byOutcome = await usage("?group_by=outcome");
  assert.equal(byOutcome.groups.find((g) => g.key === "ok").requests, 3);
  // 10 + 20 reported, then 9 (the prompt bound) + 20 counted chunks.
  assert.equal(u.groups[0].tokens_in, 10 + 10 + 9);
  assert.equal(u.groups[0].tokens_out, 20 + 20 + 20);
});

test("an upstream 5xx and an upstream cut are settled at what was used and recorded", async () => {
  upstream.state.mode = "500";
  let res = await chat(worker.url, hi);
  assert.equal(res.status, 502);
  assert.equal((await res.json()).error.type, "upstream_error");
  upstream.state.mode = "cut";
  res = await chat(worker.url, { ...hi, stream: true });
  assert.equal(res.status, 200, "the first bytes had already gone out");
  const partial = await res.text().catch(() => "");
  assert.doesNotMatch(partial, /\[DONE\]/);
  upstream.state.mode = "ok";
  await settled(5);
  const byOutcome = await usage("?group_by=outcome");
  const outcomes = Object.fromEntries(byOutcome.groups.map((g) => [g.key, g.requests]));
  assert.equal(outcomes.upstream_failed, 1, JSON.stringify(outcomes));
  assert.equal(outcomes.upstream_cut, 1, JSON.stringify(outcomes));
  const cut = byOutcome.groups.find((g) => g.key === "upstream_cut");
  assert.equal(cut.tokens_out, 10, "charged for the half that was streamed");
  assert.equal(byOutcome.in_flight, 0);
});

test("max_tokens over the tenant's cap is a 400 naming the field", async () => {
  assert.equal((await admin(worker.url, "PUT", "/v1/tenants/acme", { max_tokens_cap: 50 })).status, 200);
  const res = await chat(worker.url, hi);
  assert.equal(res.status, 400);
  assert.equal((await res.json()).error.param, "max_tokens");
  assert.equal((await admin(worker.url, "PUT", "/v1/tenants/acme", {})).status, 200);
});

test("500 concurrent requests against a budget for exactly 7: 7 admitted, the rest 402, no overshoot", async () => {
  const before = await usage();
  const spent = before.groups[0]?.usd ?? 0;
  const K = 7;
  const N = 500;
  // Room for exactly K holds of 0.109 on top of today's spend.
  const limit = spent + K * 0.109 + 0.05;
  assert.equal((await admin(worker.url, "PUT", "/v1/tenants/acme", { daily_usd: limit })).status, 200);
  // Admitted requests wait at the upstream until every request has been answered or is
  // waiting there: every hold is taken before any settles, however slow the machine.
  upstream.closeGate();
  let answered = 0;
  const results = Promise.all(Array.from({ length: N }, (_, i) =>
    chat(worker.url, hi, { token: mintToken({ sub: `user-${i % 5}` }) })
      .then(async (r) => ({ status: r.status, body: await r.json() }))
      .finally(() => { answered += 1; })));
  while (answered + upstream.state.waiting < N) await new Promise((r) => setTimeout(r, 20));
  const waiting = upstream.state.waiting;
  upstream.openGate();
  const all = await results;
  const admitted = all.filter((r) => r.status === 200).length;
  const refused = all.filter((r) => r.status === 402);
  assert.equal(waiting, K, "the upstream saw exactly K requests");
  assert.equal(admitted, K);
  assert.equal(refused.length, N - K);
  assert.match(refused[0].body.error.message, /remaining today/);
  const after = await settled(before.groups[0].requests + K);
  assert.equal(after.groups[0].requests, before.groups[0].requests + K, "every admitted request has a record");
  assert.ok(after.groups[0].usd <= limit + 1e-9, `spent ${after.groups[0].usd} of ${limit}`);
  const perUser = await usage("?group_by=user");
  assert.ok(perUser.groups.length >= 1);
  assert.equal((await admin(worker.url, "PUT", "/v1/tenants/acme", {})).status, 200);
});

test("concurrency limit: a tenant's streams over its cap get 429 with Retry-After", async () => {
  assert.equal((await admin(worker.url, "PUT", "/v1/tenants/acme", { max_concurrent: 2 })).status, 200);
  upstream.state.delayMs = 800;
  const results = await Promise.all(Array.from({ length: 6 }, () => chat(worker.url, hi)));
  upstream.state.delayMs = 0;
  const limited = results.filter((r) => r.status === 429);
  assert.equal(results.filter((r) => r.status === 200).length, 2);
  assert.equal(limited.length, 4);
  assert.equal(limited[0].headers.get("retry-after"), "1");
  await Promise.all(results.map((r) => r.text()));
  assert.equal((await admin(worker.url, "PUT", "/v1/tenants/acme", {})).status, 200);
});

test("requests per minute: the fourth of three is a 429 with a Retry-After inside the minute", async () => {
  // A tenant of its own, so the window holds only this test's requests.
  const token = () => mintToken({ ten: "rated" }, "rated-secret");
  const rated = (body) => admin(worker.url, "PUT", "/v1/tenants/rated", body);
  assert.equal((await rated({ requests_per_minute: 3 })).status, 200);
  const statuses = [];
  let last;
  for (let i = 0; i < 5; i++) {
    last = await chat(worker.url, hi, { token: token() });
    statuses.push(last.status);
    await last.text();
  }
  assert.deepEqual(statuses, [200, 200, 200, 429, 429]);
  const wait = Number(last.headers.get("retry-after"));
  assert.ok(wait >= 1 && wait <= 60, `retry-after ${wait}`);
  assert.equal((await rated({ tokens_per_minute: 1 })).status, 200);
  const res = await chat(worker.url, hi, { token: token() });
  assert.equal(res.status, 429, "a token-per-minute limit below one request's worst case");
  assert.equal((await rated({})).status, 200);
});

test("a CORS preflight from an allowed origin is answered; others get no CORS headers", async () => {
  let res = await fetch(`${worker.url}/v1/chat/completions`, { method: "OPTIONS", headers: { origin: ORIGIN } });
  assert.equal(res.status, 204);
  assert.equal(res.headers.get("access-control-allow-origin"), ORIGIN);
  res = await fetch(`${worker.url}/v1/chat/completions`, { method: "OPTIONS", headers: { origin: "https://evil.test" } });
  assert.equal(res.headers.get("access-control-allow-origin"), null);
});
