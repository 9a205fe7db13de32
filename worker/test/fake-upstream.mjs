// A fault-injecting OpenAI-compatible upstream for the worker's tests: the failure modes a
// real GPU server shows only by accident (slow answers, 5xx, cut or stalled streams, no
// usage) on demand, and the last request it got (`state.last`) for the tests to inspect. A test double of an upstream, never of the worker or its runtime.
import http from "node:http";

/** Starts the server; `mode()` is read per request so a test can change it. */
export async function startFakeUpstream(opts = {}) {
  const state = { mode: "ok", delayMs: 0, completionTokens: 20, promptTokens: 10, requests: 0, waiting: 0, ...opts };
  // While a gate is set, requests wait at it (counted in `waiting`) until it is opened.
  let gate = null;
  const server = http.createServer(async (req, res) => {
    let body = "";
    for await (const chunk of req) body += chunk;
    state.requests += 1;
    const parsed = JSON.parse(body || "{}");
    state.last = { headers: req.headers, body: parsed };
    if (gate) {
      state.waiting += 1;
      await gate.opened;
      state.waiting -= 1;
    }
    await new Promise((r) => setTimeout(r, state.mode === "hang" ? 60_000 : state.delayMs));
    if (state.mode === "429") {
      res.writeHead(429, { "content-type": "application/json", "retry-after": "1" });
      res.end(JSON.stringify({ error: { type: "rate_limited", message: "injected fault" } }));
      return;
    }
    if (state.mode === "500") {
      res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { type: "internal", message: "injected fault" } }));
      return;
    }
    const usage = { prompt_tokens: state.promptTokens, completion_tokens: state.completionTokens, total_tokens: state.promptTokens + state.completionTokens };
    if (!parsed.stream && state.mode === "stall") {
      // Headers at once, then no body until the caller gives up.
      res.writeHead(200, { "content-type": "application/json" });
      res.flushHeaders();
      await new Promise((r) => { res.on("close", r); });
      return;
    }
    if (!parsed.stream) {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({
        id: "chatcmpl-fake", object: "chat.completion", created: 0, model: "fake",
        choices: [{ index: 0, message: { role: "assistant", content: "word ".repeat(state.completionTokens).trim() }, finish_reason: "stop" }],
        usage,
      }));
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.flushHeaders();
    const n = ["cut", "stall"].includes(state.mode) ? Math.floor(state.completionTokens / 2) : state.completionTokens;
    for (let i = 0; i < n && !res.destroyed; i++) {
      res.write(`data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", created: 0, model: "fake", choices: [{ index: 0, delta: { content: "w " }, finish_reason: null }] })}\n\n`);
      // "drip": one chunk every dripMs, like a server decoding slowly.
      if (state.mode === "drip") await new Promise((r) => setTimeout(r, state.dripMs ?? 100));
    }
    if (state.mode === "stall") {
      // Half the answer, then nothing more until the caller gives up.
      await new Promise((r) => { res.on("close", r); });
      return;
    }
    if (state.mode === "cut") {
      // Let the first half reach the client, then drop the connection mid-stream.
      await new Promise((r) => setTimeout(r, 100));
      res.destroy();
      return;
    }
    const reportUsage = state.mode !== "no-usage" && parsed.stream_options?.include_usage;
    if (reportUsage) res.write(`data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", created: 0, model: "fake", choices: [], usage })}\n\n`);
    res.end("data: [DONE]\n\n");
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    state,
    /** Holds every request that arrives from now on until `open()`. */
    closeGate: () => { let open; gate = { opened: new Promise((r) => { open = r; }) }; gate.open = open; },
    openGate: () => { gate?.open(); gate = null; },
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => { server.closeAllConnections(); return new Promise((r) => server.close(r)); },
  };
}
