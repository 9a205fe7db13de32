import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker } from "./harness.mjs";

let worker;
before(async () => { worker = await startWorker(); });
after(async () => { await worker?.mf.dispose(); });

test("health answers under workerd", async () => {
  const res = await fetch(`${worker.url}/health`);
  assert.equal(res.status, 200);
  assert.equal((await res.json()).status, "ok");
});

test("unknown route is a JSON 404 in OpenAI's error shape", async () => {
  const res = await fetch(`${worker.url}/nope`);
  assert.equal(res.status, 404);
  assert.equal(res.headers.get("content-type"), "application/json");
  const body = await res.json();
  assert.equal(body.error.type, "not_found");
});
