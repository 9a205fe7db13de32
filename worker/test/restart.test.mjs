// workerd killed in the middle of a run, then started again on the same storage: the cost
// records written before are all there, and the holds of the requests that died with it are
// reclaimed by the budget's alarm once they expire — with no new request to trigger it.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { startWorker, chat, admin } from "./harness.mjs";
import { startFakeUpstream } from "./fake-upstream.mjs";

const HOLD_TTL_MS = 3000;
const persist = fs.mkdtempSync(path.join(os.tmpdir(), "straddle-worker-restart-"));
let upstream, worker;
after(async () => {
  upstream?.openGate();
  await worker?.mf.dispose();
  await upstream?.close();
  fs.rmSync(persist, { recursive: true, force: true });
});

const start = () => startWorker(
  { UPSTREAM_URL: upstream.url, PRICE_IN_PER_1K: "1", PRICE_OUT_PER_1K: "1", HOLD_TTL_MS: String(HOLD_TTL_MS) },
  { durableObjectsPersist: persist },
);
const usage = async () => (await admin(worker.url, "GET", "/v1/tenants/acme/usage")).json();
const hi = { messages: [{ role: "user", content: "hi" }], max_tokens: 100 };
const until = async (what, check, ms) => {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
};

test("a restart loses no record and leaks no hold", async () => {
  upstream = await startFakeUpstream();
  worker = await start();
  assert.equal((await admin(worker.url, "PUT", "/v1/tenants/acme", { daily_tokens: 5000 })).status, 200);
  for (let i = 0; i < 3; i++) {
    const res = await chat(worker.url, hi);
    assert.equal(res.status, 200);
    await res.json();
  }
  // Four requests in flight when workerd dies: held, never settled.
  upstream.closeGate();
  const dying = Array.from({ length: 4 }, () => chat(worker.url, { ...hi, stream: true }).then((r) => r.text()).catch(() => "cut"));
  await until("four requests at the upstream", () => upstream.state.waiting === 4, 10_000);
  const during = await usage();
  assert.equal(during.in_flight, 4);
  assert.equal(during.groups[0].requests, 3);
  await worker.mf.dispose();
  worker = null;
  await Promise.all(dying);
  upstream.openGate();

  worker = await start();
  const restarted = await usage();
  assert.equal(restarted.groups[0].requests, 3, "every record written before the restart is there");
  assert.deepEqual(restarted.today, { usd: 0.09, tokens: 90 });
  assert.equal(restarted.tenant.daily_tokens, 5000, "the tenant record survived");
  // Only reads from here on: the alarm, not a new hold, must reclaim the dead requests' holds.
  const reclaimed = await until("the dead holds to be reclaimed", async () => {
    const u = await usage();
    return u.in_flight === 0 ? u : null;
  }, HOLD_TTL_MS + 15_000);
  assert.deepEqual(reclaimed.held, { usd: 0, tokens: 0 });
  const res = await chat(worker.url, hi);
  assert.equal(res.status, 200, "the budget admits again");
  await res.json();
});
