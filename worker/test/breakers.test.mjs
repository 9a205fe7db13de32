// Circuit breakers shared by every isolate: the deployment's health object keeps them, so a
// primary that tripped stays skipped by a fresh isolate (a worker restarted on the same
// state), and after its open period one probe, not a crowd, half-opens it.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { startWorker, chat } from "./harness.mjs";
import { startFakeUpstream } from "./fake-upstream.mjs";

const persist = fs.mkdtempSync(path.join(os.tmpdir(), "straddle-worker-breakers-"));
const OPEN_MS = 1500;
let primary, backup, worker;
const start = () => startWorker({ UPSTREAMS: JSON.stringify([
  { name: "primary", url: primary.url, priority: 0, first_byte_timeout_ms: 1000, breaker_open_ms: OPEN_MS },
  { name: "backup", url: backup.url, priority: 1 },
]) }, { durableObjectsPersist: persist });
before(async () => {
  primary = await startFakeUpstream();
  backup = await startFakeUpstream();
  worker = await start();
});
after(async () => {
  await worker?.mf.dispose();
  await primary?.close();
  await backup?.close();
  fs.rmSync(persist, { recursive: true, force: true });
});

const hi = { messages: [{ role: "user", content: "hi" }], max_tokens: 5 };
const ask = async () => {
  const res = await chat(worker.url, hi);
  assert.equal(res.status, 200);
  await res.json();
};

test("a breaker tripped in one isolate keeps a fresh isolate off the upstream", async () => {
  primary.state.mode = "500";
  for (let i = 0; i < 3; i++) await ask();
  assert.equal(primary.state.requests, 3, "three failures in a row, each failed over");
  // A new isolate on the same deployment state: it has never seen the primary fail.
  await worker.mf.dispose();
  worker = await start();
  const backupBefore = backup.state.requests;
  await ask();
  assert.equal(primary.state.requests, 3, "the shared breaker kept the request off the primary");
  assert.equal(backup.state.requests, backupBefore + 1);
});

test("after the open period one probe goes through; its success closes the breaker for all", async () => {
  primary.state.mode = "ok";
  primary.state.delayMs = 300;
  await new Promise((r) => setTimeout(r, OPEN_MS + 100));
  const before = primary.state.requests;
  // Five at once: one probes the primary, the rest go to the backup while the probe is out.
  await Promise.all(Array.from({ length: 5 }, ask));
  assert.equal(primary.state.requests, before + 1, "exactly one probe");
  primary.state.delayMs = 0;
  await Promise.all(Array.from({ length: 3 }, ask));
  assert.equal(primary.state.requests, before + 4, "closed: the primary takes the traffic again");
});
