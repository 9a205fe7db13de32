// A client that walks away mid-stream under local workerd: the stream's hold is settled at
// what reached the client, within the deployment's idle limit, not left to the hold's TTL.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, admin, mintToken, ORIGIN } from "./harness.mjs";
import { startFakeUpstream } from "./fake-upstream.mjs";

let upstream, worker;
before(async () => {
  // 300 chunks, one every 100 ms: half a minute of answer.
  upstream = await startFakeUpstream({ mode: "drip", dripMs: 100, completionTokens: 300 });
  worker = await startWorker({ UPSTREAM_URL: upstream.url, PRICE_IN_PER_1K: "1", PRICE_OUT_PER_1K: "1", STREAM_IDLE_MS: "1500" });
});
after(async () => { await worker?.mf.dispose(); await upstream?.close(); });

test("an abandoned stream is settled as client_gone at what it delivered, seconds after the client left", async () => {
  const controller = new AbortController();
  const res = await fetch(`${worker.url}/v1/chat/completions`, {
    method: "POST", signal: controller.signal,
    headers: { "content-type": "application/json", authorization: `Bearer ${mintToken({ sid: "walks-away" })}`, origin: ORIGIN },
    body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 400, stream: true }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  let seen = "";
  while ((seen.match(/"content"/g) ?? []).length < 5) seen += new TextDecoder().decode((await reader.read()).value);
  const left = Date.now();
  controller.abort();
  let u;
  for (let i = 0; i < 100; i++) {
    u = await (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=outcome")).json();
    if (u.in_flight === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(u.in_flight, 0, `still held ${Date.now() - left} ms after the client left`);
  const gone = u.groups.find((g) => g.key === "client_gone");
  assert.equal(gone?.requests, 1, JSON.stringify(u.groups));
  assert.ok(gone.tokens_out >= 5 && gone.tokens_out < 300, JSON.stringify(gone));
  assert.ok(u.held.tokens === 0 && u.held.usd === 0, JSON.stringify(u.held));
});

test("a client that reads a slow stream to its end is not taken for gone", async () => {
  // Three seconds of answer, twice the idle limit: the client waits on every chunk.
  upstream.state.completionTokens = 30;
  const res = await fetch(`${worker.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${mintToken({ sid: "stays" })}`, origin: ORIGIN },
    body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 100, stream: true, stream_options: { include_usage: true } }),
  });
  const text = await res.text();
  assert.equal((text.match(/"content":"w "/g) ?? []).length, 30);
  assert.match(text, /data: \[DONE\]/);
  let u;
  for (let i = 0; i < 50; i++) {
    u = await (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=outcome")).json();
    if (u.in_flight === 0 && u.groups.some((g) => g.key === "ok")) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  const ok = u.groups.find((g) => g.key === "ok");
  assert.equal(ok?.requests, 1, JSON.stringify(u.groups));
  assert.equal(ok.tokens_out, 30);
});
