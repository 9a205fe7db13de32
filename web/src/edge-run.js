// An answer from the model on this device, in its turn on the engine. When the cloud may take
// over, the cascade holds the first tokens back and watches them (and the first-token check
// looks after prefill). An engine that fails mid-answer (its GPU device lost, its worker
// crashed) is loaded again on the CPU kernels and the answer goes on from the text shown; one
// that cannot be loaded again leaves the answer to the cloud when nothing was shown. Each
// answer's measured speed is what the router counts on next.
import { Cascade } from "../pkg/straddle.js";
import { runCloud } from "./cloud-run.js";
import { onEdge } from "./edge-queue.js";
import { StraddleError } from "./errors.js";
import { DEFAULT_MAX_TOKENS, edgeParams } from "./request.js";
import { cloudUsable, expectedTokens, firstTokenEscalation } from "./routing.js";
import { reloadEdge } from "./startup.js";

/** The edge answer, in its turn on the device. */
export function runEdge(client, ctx, options) {
  return onEdge(client, expectedTokens(ctx), (job) => runEdgeNow(client, ctx, options, job));
}

/** The edge answer, watched by the cascade when the cloud may take over. */
async function runEdgeNow(client, ctx, { cascade }, job) {
  const { req, decision, signal } = ctx;
  await client.reloading?.catch(() => {});
  if (!client.edge) return edgeFailed(client, ctx, client.edgeError ?? new StraddleError("edge_unavailable", "the on-device model is not loaded"));
  const { host, backend } = client.edge;
  const monitor = cascade ? new Cascade(JSON.stringify(decision.cascade)) : null;
  // `shown` is the text the caller has seen, `shownTokens` its tokens: where a fresh engine
  // would go on from.
  const run = { held: monitor ? [] : null, count: 0, shown: "", shownTokens: 0, prefillMs: null, degraded: null, reasons: [...decision.reasons] };
  let gen = null;
  const onAbort = () => gen?.cancel();
  signal?.addEventListener("abort", onAbort, { once: true });
  let finished = false;
  try {
    gen = host.generate(req.messages, edgeParams(req));
    const handed = await showTokens(client, ctx, gen, monitor, run, job);
    if (handed) return handed;
    finished = true;
  } catch (e) {
    // The engine itself is gone (its device lost, its worker crashed or trapped): a fresh one
    // goes on. Any other failure (a prompt too long, a refused schema) would fail again.
    const gone = host.crashed || e.code === "device_lost";
    if (gone && !signal?.aborted) return await resumeOnCpu(client, ctx, run, { host, backend }, e);
    return await edgeFailed(client, ctx, e);
  } finally {
    // Escalated, aborted or failed: the device stops working on this answer.
    if (!finished) gen?.cancel();
    signal?.removeEventListener("abort", onAbort);
    monitor?.free();
  }
  const c = await gen.completion;
  if (signal?.aborted) throw new StraddleError("aborted", "the request was aborted");
  if (c.rest) {
    // A tool call cut short: the text it is, never passed off as a call.
    ctx.emitted = true;
    ctx.emit(c.rest);
  }
  measureSpeed(client.edge, c);
  return edgeEnd(client.edge, c, run);
}

/**
 * Shows the edge tokens as they come, or, under the cascade, once it has settled on them.
 * Resolves to the cloud's answer when the cascade or the first-token check handed the
 * request up, else to null (the edge answer stands; `run` says what happened on the way).
 */
async function showTokens(client, ctx, gen, monitor, run, job) {
  for await (const t of gen.tokens) {
    if (t.type === "look") {
      // After prefill, before any token: the edge model's own state may send it up.
      run.prefillMs = t.prefill_ms;
      const up = monitor && firstTokenEscalation(ctx.decision, t);
      const handed = up && await handUp(client, ctx, ctx.decision, up, run);
      if (handed?.end) return handed.end;
      if (handed) noteHandUpFailed(run, handed);
      continue;
    }
    run.count += 1;
    job.done = run.count;
    if (!run.held) {
      show(ctx, run, t.text, 1);
      continue;
    }
    run.held.push(t.text);
    const escalateFor = monitor.push(t.text, t.logprob, t.entropy);
    if (escalateFor) {
      const handed = await handUp(client, ctx, ctx.decision, escalateFor, run);
      if (handed.end) return handed.end;
      noteHandUpFailed(run, handed);
    } else if (run.count < monitor.settles_after) {
      continue;
    }
    show(ctx, run, run.held.join(""), run.held.length);
    run.held = null;
  }
  if (run.held?.length) show(ctx, run, run.held.join(""), run.held.length);
  return null;
}

/** Hands `text` (`tokens` of the answer) to the caller, and remembers it as shown. */
function show(ctx, run, text, tokens) {
  ctx.emitted = true;
  ctx.emit(text);
  run.shown += text;
  run.shownTokens += tokens;
}

/**
 * The engine failed mid-answer: the model is loaded again on the CPU kernels in a fresh
 * worker and the answer goes on from the text shown, as the same turn, so nothing is shown
 * twice and nothing is lost; the reasons say so. Where the model cannot be loaded again,
 * the device failed: the cloud answers if nothing was shown and policy allows.
 */
async function resumeOnCpu(client, ctx, run, failed, e) {
  await reloadEdge(client, failed.host).catch(() => {});
  if (!client.edge) return edgeFailed(client, ctx, e);
  const left = Math.max(1, (ctx.req.max_tokens ?? DEFAULT_MAX_TOKENS) - run.shownTokens);
  let tokens, c;
  try {
    ({ tokens, completion: c } = await continueOnEdge(client, ctx, run.shown, left));
  } catch (again) {
    return edgeFailed(client, ctx, again);
  }
  if (ctx.signal?.aborted) throw new StraddleError("aborted", "the request was aborted");
  run.reasons.push(`the ${failed.backend} engine failed after ${run.shownTokens} tokens shown (${e.code}: ${e.message}); `
    + `the model was loaded again on the CPU kernels and went on from the text shown`);
  const end = edgeEnd(client.edge, { ...c, tokens: run.shownTokens + tokens }, run);
  end.meta.edge.resumed = { from: failed.backend, to: client.edge.backend, after_tokens: run.shownTokens, after_chars: run.shown.length, error: e.code };
  return end;
}

/**
 * The rest of a turn on the device from the text already shown (the assistant's unfinished
 * message, `continue_final_message`; none shown: the turn from its start). Resolves to the
 * tokens streamed and the engine's completion.
 */
export async function continueOnEdge(client, ctx, shown, maxTokens) {
  const { req, signal } = ctx;
  const messages = shown ? [...req.messages, { role: "assistant", content: shown }] : req.messages;
  const gen = client.edge.host.generate(messages, { ...edgeParams(req), max_tokens: maxTokens, ...(shown && { continue_final_message: true }) });
  const onAbort = () => gen.cancel();
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    let tokens = 0;
    for await (const t of gen.tokens) {
      if (t.type === "look") continue;
      tokens += 1;
      ctx.emitted = true;
      ctx.emit(t.text);
    }
    return { tokens, completion: await gen.completion };
  } finally {
    signal?.removeEventListener("abort", onAbort);
  }
}

/** The edge answer stands after a failed hand-up: it says why. */
function noteHandUpFailed(run, handed) {
  run.degraded = handed.degraded;
  run.reasons.push(handed.reason);
}

/**
 * The device failed (out of memory, device lost): the cloud's answer when it may still give
 * one (nothing shown yet, and neither privacy nor an offline policy keeps the request here),
 * else the failure as a StraddleError.
 */
async function edgeFailed(client, ctx, e) {
  const { decision, signal } = ctx;
  if (signal?.aborted) throw new StraddleError("aborted", "the request was aborted");
  if (e.code === "aborted") throw e;
  if (!ctx.emitted && cloudUsable(client) && decision.trace.rule !== "privacy" && decision.trace.rule !== "offline") {
    const end = await runCloud(client, ctx, { reasons: [...decision.reasons, "edge failed"] });
    end.meta.degraded = `the edge failed (${e.code ?? "edge_failed"}): ${e.message}`;
    return end;
  }
  throw e instanceof StraddleError ? e : new StraddleError("edge_failed", String(e.message ?? e));
}

/**
 * The cascade hands a held edge answer to the cloud (the `run`'s edge tokens so far are
 * discarded, its prefill time reported as spent): `{end}` with the cloud's answer, or, when
 * the cloud fails, `{degraded, reason}` and the edge answer stands. The edge keeps
 * generating while the cloud is asked: its tokens are the fallback.
 */
async function handUp(client, ctx, decision, why, run) {
  try {
    const end = await runCloud(client, ctx, { reasons: [...decision.reasons, `cascade: ${why}`], midStream: true });
    end.meta.escalated_mid_stream = true;
    end.meta.edge_tokens = "discarded";
    end.meta.edge_tokens_discarded = run.count;
    end.meta.edge_prefill_ms = run.prefillMs ?? null;
    return { end };
  } catch (e) {
    if (e.code === "aborted" || ctx.emitted) throw e;
    return {
      degraded: `the cascade asked for the cloud (${why}) but it failed (${e.code}): ${e.message}`,
      reason: `cascade: ${why}; the cloud failed, so the edge answer stands`,
    };
  }
}

/** Measured speed replaces the prior; later answers smooth it. */
function measureSpeed(edge, c) {
  if (c.tokens > 1 && c.decode_ms > 0) {
    const speed = c.decode_tokens_per_s;
    edge.tokensPerS = edge.measured ? 0.7 * edge.tokensPerS + 0.3 * speed : speed;
    edge.measured = true;
  }
  if (c.prompt_tokens > 0 && c.prefill_ms > 0) {
    const prefill = c.prompt_tokens / (c.prefill_ms / 1000);
    edge.prefillTokensPerS = edge.prefillTokensPerS ? 0.7 * edge.prefillTokensPerS + 0.3 * prefill : prefill;
  }
}

/** A finished edge answer as the client reports it. */
function edgeEnd(edge, c, { reasons, degraded }) {
  return {
    model: edge.name ?? "edge",
    finish_reason: c.finish === "cancelled" ? "stop" : c.finish,
    tool_calls: c.tool_calls,
    usage: { prompt_tokens: c.prompt_tokens, completion_tokens: c.tokens, total_tokens: c.prompt_tokens + c.tokens },
    meta: {
      route: "edge", reasons, confidence: Math.exp(c.mean_logprob), degraded,
      cost: { usd: 0, prompt_tokens: c.prompt_tokens, completion_tokens: c.tokens },
      model_versions: [`edge/${edge.name ?? "model"}@${edge.sha256.slice(0, 12)}`, `backend/${edge.backend}`],
      redacted: false, escalated_mid_stream: false, edge_tokens: null,
      edge: { backend: edge.backend, prefill_ms: c.prefill_ms, decode_ms: c.decode_ms, grammar_ms: c.grammar_ms,
        decode_tokens_per_s: c.decode_tokens_per_s },
    },
  };
}
