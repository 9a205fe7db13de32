// Several upstreams: weighted choice, failover on 5xx, 429, refused connections and
// first-byte timeouts (never after bytes reached the client), and circuit breakers.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, chat, admin, freePort } from "./harness.mjs";
import { startFakeUpstream } from "./fake-upstream.mjs";

let primary, backup, worker, deadPort;
before(async () => {
  primary = await startFakeUpstream();
  backup = await startFakeUpstream();
  deadPort = await freePort();
  const upstreams = [
    { name: "primary", url: primary.url, priority: 0, first_byte_timeout_ms: 400, price_in_per_1k: 1, price_out_per_1k: 1 },
    { name: "backup", url: backup.url, priority: 1, first_byte_timeout_ms: 2000, price_in_per_1k: 2, price_out_per_1k: 2 },
  ];
  worker = await startWorker({ UPSTREAMS: JSON.stringify(upstreams) });
});
after(async () => { await worker?.mf.dispose(); await primary?.close(); await backup?.close(); });

const hi = { messages: [{ role: "user", content: "hi" }], max_tokens: 50 };
const byUpstream = async () => {
  for (let i = 0; i < 50; i++) {
    const u = await (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=outcome")).json();
    if (u.in_flight === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  return (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=model")).json();
};

test("the primary answers while it is healthy", async () => {
  const res = await chat(worker.url, hi);
  assert.equal(res.status, 200);
  await res.json();
  assert.equal(primary.state.requests, 1);
  assert.equal(backup.state.requests, 0);
});

test("a 5xx, a 429 and a hang each fail over to the backup before any byte is sent", async () => {
  for (const mode of ["500", "429", "hang"]) {
    primary.state.mode = mode;
    const before = backup.state.requests;
    const res = await chat(worker.url, { ...hi, stream: true, stream_options: { include_usage: true } });
    assert.equal(res.status, 200, mode);
    assert.match(await res.text(), /\[DONE\]/, mode);
    assert.equal(backup.state.requests, before + 1, mode);
    primary.state.mode = "ok";
  }
  await byUpstream();
  // The cost records say which upstream answered and that a failover did.
  const degraded = await (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=degraded")).json();
  assert.deepEqual(degraded.groups.map((g) => [g.key, g.requests]), [["degraded", 3], ["first_choice", 1]]);
  const upstreams = await (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=upstream")).json();
  assert.deepEqual(upstreams.groups.map((g) => [g.key, g.requests]), [["backup", 3], ["primary", 1]]);
});

test("after three failures the primary's breaker opens and it is skipped", async () => {
  // The previous test left three failures in a row on the primary.
  const seen = primary.state.requests;
  const res = await chat(worker.url, hi);
  assert.equal(res.status, 200);
  await res.json();
  assert.equal(primary.state.requests, seen, "the open breaker kept the request off the primary");
});

test("every upstream failing is a 502 naming each attempt, and the hold is released", async () => {
  primary.state.mode = "500";
  backup.state.mode = "500";
  const res = await chat(worker.url, hi);
  primary.state.mode = "ok";
  backup.state.mode = "ok";
  assert.equal(res.status, 502);
  const body = await res.json();
  assert.match(body.error.message, /backup answered 500/);
  const usage = await (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=outcome")).json();
  assert.equal(usage.in_flight, 0);
  assert.equal(usage.groups.find((g) => g.key === "upstream_failed")?.requests, 1);
});

test("the hold prices at the dearest upstream; the record at the one that answered", async () => {
  // backup: 2 USD per 1k each way, 10 + 20 tokens reported -> 0.06.
  const res = await chat(worker.url, hi);
  assert.equal(res.status, 200);
  await res.json();
  const usage = await (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=outcome")).json();
  const ok = usage.groups.find((g) => g.key === "ok");
  assert.ok(ok.usd > 0);
  // Every successful answer so far came from the backup (2/1k) or the primary (1/1k).
  assert.ok(ok.usd <= ok.requests * 0.06 + 1e-9, `${ok.usd}`);
});
