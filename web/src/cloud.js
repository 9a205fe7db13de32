// Escalation: the OpenAI body plus the `straddle` envelope, sent to the edge worker; answers
// come back whole or as server-sent events parsed as they arrive.
import { StraddleError } from "./errors.js";

/** Why a cloud attempt failed before any answer byte, in the words the router reports. */
const STATUS_CODES = { 401: "unauthorized", 402: "budget_exhausted", 403: "forbidden", 413: "too_large",
  429: "rate_limited", 451: "privacy_refused" };

/** Resolves the tenant token: a string, or a function returning one (or a promise of one). */
export async function resolveToken(token) {
  const t = typeof token === "function" ? await token() : token;
  if (t !== undefined && t !== null && typeof t !== "string") {
    throw new StraddleError("invalid_options", "token must be a string or a function returning one");
  }
  return t ?? null;
}

/**
 * Sends `body` to `${worker}/v1/chat/completions`. Resolves once the headers are in: to
 * `{stream: AsyncIterable<chunk>}` for a streamed answer or `{response}` for a whole one.
 * Rejects with a StraddleError whose `code` says why (`cloud_unreachable`, `timeout`, an
 * HTTP status code name, `upstream_error`).
 */
export async function escalate({ worker, token, body, signal, firstByteTimeoutMs }) {
  const headers = { "content-type": "application/json" };
  if (token) headers.authorization = `Bearer ${token}`;
  const timeout = new AbortController();
  const timer = setTimeout(() => timeout.abort(), firstByteTimeoutMs);
  const onAbort = () => timeout.abort();
  signal?.addEventListener("abort", onAbort, { once: true });
  let resp;
  try {
    resp = await fetch(`${worker}/v1/chat/completions`, { method: "POST", headers, body: JSON.stringify(body), signal: timeout.signal });
  } catch (e) {
    if (signal?.aborted) throw new StraddleError("aborted", "the request was aborted");
    if (timeout.signal.aborted) throw new StraddleError("timeout", `the worker sent no answer within ${firstByteTimeoutMs} ms`);
    throw new StraddleError("cloud_unreachable", `the worker at ${worker} is unreachable: ${e.message ?? e}`);
  } finally {
    clearTimeout(timer);
  }
  if (!resp.ok) {
    signal?.removeEventListener("abort", onAbort);
    let message = `the worker answered ${resp.status}`;
    try {
      const j = await resp.json();
      if (j?.error?.message) message = j.error.message;
    } catch { /* not JSON: the status says enough */ }
    const code = STATUS_CODES[resp.status] ?? (resp.status >= 500 ? "upstream_error" : "cloud_rejected");
    throw new StraddleError(code, message, { status: resp.status });
  }
  const done = () => signal?.removeEventListener("abort", onAbort);
  if (!body.stream) {
    try {
      return { response: await resp.json() };
    } catch (e) {
      throw new StraddleError("upstream_error", `the worker's answer is not JSON: ${e.message}`);
    } finally {
      done();
    }
  }
  return { stream: sseChunks(resp.body, signal, done) };
}

/** Parses server-sent events into JSON chunks; ends at `[DONE]`. */
export async function* sseChunks(body, signal, done = () => {}) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let finished = false;
  try {
    for (;;) {
      let value, end;
      try {
        ({ value, done: end } = await reader.read());
      } catch (e) {
        if (signal?.aborted) throw new StraddleError("aborted", "the request was aborted");
        throw new StraddleError("upstream_cut", `the cloud stream broke off: ${e.message ?? e}`);
      }
      if (end) break;
      buffer += value;
      // Events end with a blank line; keep a trailing partial event for the next read.
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        if (!data) continue;
        if (data === "[DONE]") {
          finished = true;
          return;
        }
        let chunk;
        try {
          chunk = JSON.parse(data);
        } catch {
          throw new StraddleError("upstream_error", "the cloud stream carried an event that is not JSON");
        }
        if (chunk.error) throw new StraddleError("upstream_error", chunk.error.message ?? "the cloud reported an error mid-stream");
        yield chunk;
      }
    }
    if (!finished) throw new StraddleError("upstream_cut", "the cloud stream ended without [DONE]");
  } finally {
    done();
    reader.cancel().catch(() => {});
  }
}

/**
 * Round trip to the worker's /health, in milliseconds; null when it does not answer. A probe
 * that outlasts the timeout reports the timeout: the network is at least that slow, which is
 * what the router needs to know about a satellite or 2G link.
 */
export async function measureRtt(worker, timeoutMs = 10_000) {
  const t0 = performance.now();
  try {
    const r = await fetch(`${worker}/health`, { cache: "no-store", signal: AbortSignal.timeout(timeoutMs) });
    await r.arrayBuffer();
    return r.ok ? performance.now() - t0 : null;
  } catch (e) {
    return e?.name === "TimeoutError" ? timeoutMs : null;
  }
}
