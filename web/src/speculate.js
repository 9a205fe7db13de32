// Speculative decoding from the page: the edge drafts in its turn on the device and the
// worker's cloud verifies each draft (the engine worker runs the loop). What the drafts
// yielded teaches the policy; a reply whose drafts keep being rejected is handed to plain
// cloud streaming, and a failed hand-off leaves the edge to finish the same turn.
import { piiKinds } from "../pkg/straddle.js";
import { resolveToken } from "./cloud.js";
import { cloudCost, runCloud, versions } from "./cloud-run.js";
import { onEdge } from "./edge-queue.js";
import { continueOnEdge } from "./edge-run.js";
import { StraddleError } from "./errors.js";
import { DEFAULT_MAX_TOKENS, constrained, edgeParams } from "./request.js";
import { expectedTokens } from "./routing.js";

/** Why a request the router sent to speculation cannot speculate, or null when it can. */
export function whyNotSpeculative(client, req) {
  // Drafts travel as token ids the worker cannot scan or redact: a request with any
  // personal data goes the plain cloud way, redacted.
  const found = req.messages.some((m) => piiKinds(m.content).length > 0);
  return found ? "personal data present: the plain cloud path redacts it, speculation could not"
    : !client.edge ? "the on-device model is not loaded"
    : constrained(req) ? "the answer must be JSON or a tool call, and the verifier does not follow a grammar" : null;
}

/**
 * Speculative decoding: the edge drafts, the worker's cloud verifies each draft, and the
 * answer is the cloud's, token for token at temperature 0. A failed verify call leaves the
 * edge to finish alone, marked `degraded`.
 */
export function runSpeculative(client, ctx) {
  return onEdge(client, expectedTokens(ctx), (job) => runSpeculativeNow(client, ctx, job));
}

/** Speculation in its turn on the device (see `runSpeculative`). */
async function runSpeculativeNow(client, ctx, job) {
  const { req, decision, signal } = ctx;
  const token = await resolveToken(client.options.token);
  const gen = client.edge.host.speculate(req.messages, edgeParams(req), {
    url: client.worker, token, tokenizerHash: client.edge.tokenizerHash, timeoutMs: client.options.firstByteTimeoutMs,
    handOffBelow: client.policy.speculative_min_acceptance, envelope: versions(decision, ctx.id, client.edge),
  });
  const degraded = await showTokens(ctx, gen, job);
  const c = await gen.completion;
  if (signal?.aborted) throw new StraddleError("aborted", "the request was aborted");
  if (c.calls > 0 && !degraded) learnYield(client, c);
  return speculativeEnd(client, ctx, c, degraded);
}

/** Shows the verified tokens as they come; resolves to why the verifier failed, or null. */
async function showTokens(ctx, gen, job) {
  const onAbort = () => gen.cancel();
  ctx.signal?.addEventListener("abort", onAbort, { once: true });
  let degraded = null;
  try {
    for await (const t of gen.tokens) {
      if (t.type === "degraded") {
        degraded = t.reason;
        continue;
      }
      job.done += 1;
      ctx.emitted = true;
      ctx.emit(t.text);
    }
  } finally {
    ctx.signal?.removeEventListener("abort", onAbort);
  }
  return degraded;
}

/**
 * The measured yield replaces the policy's prior, so the router stops choosing speculation
 * where drafts are seldom accepted.
 */
function learnYield(client, c) {
  const perCall = c.tokens / c.calls;
  const prior = client.policy.speculative_tokens_per_call;
  client.policy.speculative_tokens_per_call = client.speculativeMeasured ? 0.7 * prior + 0.3 * perCall : perCall;
  client.speculativeMeasured = true;
  client.policyJson = JSON.stringify(client.policy);
}

/** A finished speculative answer as the client reports it, the cloud's hand-off included. */
async function speculativeEnd(client, ctx, c, degraded) {
  const { req, decision } = ctx;
  // What the worker billed: the prompt once, every draft and each call's pending token as
  // input, one token a call as output.
  const billedIn = c.prompt_tokens + c.drafted + Math.max(0, c.calls - 1);
  const usd = cloudCost(client.policy, billedIn, c.calls);
  const cost = { usd, prompt_tokens: billedIn, completion_tokens: c.calls };
  let reasons = degraded ? [...decision.reasons, "the verifier failed; the edge finished alone"] : decision.reasons;
  let tokens = c.tokens;
  let finish = c.cancelled ? "stop" : c.finish;
  let handOff = null;
  if (c.handed_off) {
    // Drafts kept being rejected: the cloud streams the rest of this same turn, continuing
    // the text shown so far (`continue_final_message`), as plain streaming.
    handOff = await continueInCloud(client, ctx, c.text, (req.max_tokens ?? DEFAULT_MAX_TOKENS) - c.tokens);
    reasons = [...reasons, `speculation handed to plain streaming after ${c.tokens} tokens: draft acceptance ${c.acceptance.toFixed(2)} below ${client.policy.speculative_min_acceptance}`];
    degraded = handOff.degraded;
    tokens += handOff.tokens;
    finish = handOff.finish;
    cost.usd += handOff.cost.usd;
    cost.prompt_tokens += handOff.cost.prompt_tokens;
    cost.completion_tokens += handOff.cost.completion_tokens;
  }
  return {
    model: client.edge.name ?? "edge",
    finish_reason: finish,
    usage: { prompt_tokens: c.prompt_tokens, completion_tokens: tokens, total_tokens: c.prompt_tokens + tokens },
    meta: {
      route: "speculative", reasons, confidence: null, degraded, cost,
      model_versions: [`edge/${client.edge.name ?? "model"}@${client.edge.sha256.slice(0, 12)}`, "cloud/verify"],
      redacted: false, escalated_mid_stream: false, edge_tokens: null,
      speculative: { verify_calls: c.calls, drafted: c.drafted, accepted: c.accepted, acceptance: c.acceptance,
        edge_alone_tokens: c.edge_alone + (handOff?.edgeTokens ?? 0), session_restarts: c.restarts,
        handed_off_after_tokens: c.handed_off ? c.tokens : null },
    },
  };
}

/**
 * The rest of a speculative reply as plain cloud streaming: the conversation with the text so
 * far as the assistant's unfinished turn. If the cloud fails part-way, the edge continues the
 * same turn from everything shown (nothing repeated, nothing dropped), marked degraded.
 */
async function continueInCloud(client, ctx, shown, maxTokens) {
  const { req, signal } = ctx;
  let sent = "";
  const cont = (text) => ({ ...req, max_tokens: maxTokens, continue_final_message: true,
    messages: [...req.messages, { role: "assistant", content: text }] });
  const tap = { ...ctx, emit: (t) => { sent += t; ctx.emit(t); } };
  try {
    const r = await runCloud(client, { ...tap, req: cont(shown) }, { reasons: [], continuing: true });
    return { tokens: r.usage.completion_tokens, finish: r.finish_reason, cost: r.meta.cost, degraded: null, edgeTokens: 0 };
  } catch (e) {
    if (signal?.aborted) throw e;
    // A failed stream reports no usage: its tokens are estimated at four characters each.
    const left = Math.max(1, maxTokens - Math.ceil(sent.length / 4));
    const { tokens: n, completion: done } = await continueOnEdge(client, ctx, shown + sent, left);
    return { tokens: n, finish: done.finish, cost: { usd: 0, prompt_tokens: 0, completion_tokens: 0 }, edgeTokens: n,
      degraded: `the hand-off to the cloud failed (${e.code ?? "error"}): ${e.message ?? e}; the edge finished the reply` };
  }
}
