// The router's side of the page: the context it decides from (the network, the device, the
// cloud's load, the budget), the decision with what a page or the bandit may change, and the
// check after prefill. The decisions themselves are the wasm router's.
import { firstToken, route as routeWasm } from "../pkg/straddle.js";
import { measureRtt } from "./cloud.js";
import { edgeBusySeconds } from "./edge-queue.js";
import { DEFAULT_MAX_TOKENS, structuredShape } from "./request.js";

const RTT_STALE_MS = 60_000;
/** How old the cloud's load report may be before a decision asks again. */
const LOAD_STALE_MS = 2_000;

/** Where a checked request runs, and why: the router's decision, then the bandit's and the page's say. */
export function decide(client, req) {
  // The last message is the turn being answered; the router reads its language and task
  // from it, and scans the whole conversation for personal data.
  const turns = req.messages.map((m) => m.content);
  const context = { ...routerContext(client), structured: structuredShape(req) };
  const d = JSON.parse(routeWasm(turns, req.max_tokens ?? DEFAULT_MAX_TOKENS, JSON.stringify(context), client.policyJson));
  const want = req.straddle?.route ?? "auto";
  // Once there is feedback, the bandit replaces the fixed score (never a rule). Its cloud
  // arm covers speculation, which is the cloud's answer too.
  const learned = want === "auto" ? client.learner?.choose(JSON.stringify(d)) : undefined;
  if (learned && learned !== d.target && !(learned === "cloud" && d.target === "speculative")) {
    d.reasons = [...d.reasons, `learned from feedback: ${learned} has paid off for requests like this`];
    d.target = learned;
    d.cascade = learned === "edge" ? client.policy.cascade : null;
  }
  // A page may insist on a route, but never past the privacy rule or an edge-only policy.
  const binding = d.trace.rule === "privacy" || (d.trace.rule === "offline" && client.policy.edge_only);
  if (want !== "auto" && want !== d.target && !binding) {
    d.reasons = [`the request asked for ${want}`, ...d.reasons];
    d.target = want;
    d.cascade = null;
  }
  return d;
}

/** What the router is told about this page now (stale measurements are renewed for later). */
function routerContext(client) {
  refreshRtt(client);
  refreshLoad(client);
  const conn = globalThis.navigator?.connection;
  return {
    online: cloudUsable(client),
    edge_available: Boolean(client.edge),
    edge_tokens_per_s: client.edge?.tokensPerS ?? 0,
    // Before a probe returns, the Network Information API's estimate, else a guess.
    rtt_ms: client.rtt.ms ?? conn?.rtt ?? 150,
    edge_languages: client.edge?.languages ?? [],
    cloud_verifies: Boolean(client.cloudVerifies),
    // Counted by the router where present (JSON.stringify drops the undefined ones).
    bandwidth_kbps: conn?.downlink ? conn.downlink * 1000 : undefined,
    edge_prefill_tokens_per_s: client.edge?.prefillTokensPerS,
    edge_context_tokens: client.edge?.contextTokens,
    edge_model_sha256: client.edge?.sha256,
    edge_backend: client.edge?.backend,
    // A BatteryManager is live: its level and charging state are read as they are now.
    battery: client.battery ? { level: client.battery.level, charging: client.battery.charging } : undefined,
    // Once the worker has said the tenant's budget is spent, the rest of the UTC day stays
    // on the device instead of paying a round trip to be refused.
    budget_remaining_usd: client.budgetSpentOn === utcDay() ? 0 : undefined,
    cloud_load: client.cloudLoad.report ?? undefined,
    cloud_ttft_ms: client.cloudTtftMs ?? undefined,
    edge_busy_s: edgeBusySeconds(client) || undefined,
    // The user asked the browser to save data: no speculation, which re-sends its drafts.
    save_data: conn?.saveData === true,
  };
}

/** Re-measures the round trip to the worker when the last measurement is stale. */
export function refreshRtt(client) {
  if (!client.worker || client.rtt.probing || performance.now() - client.rtt.at < RTT_STALE_MS && client.rtt.at) return;
  const probe = (async () => {
    const samples = [];
    for (let i = 0; i < 3; i++) {
      const ms = await measureRtt(client.worker);
      if (ms !== null) samples.push(ms);
    }
    samples.sort((a, b) => a - b);
    // A network change during the probe made its samples stale.
    if (client.rtt.probing !== probe) return;
    client.rtt = { ms: samples.length ? samples[Math.floor(samples.length / 2)] : null, at: performance.now(), probing: null };
  })();
  client.rtt.probing = probe;
}

/** Asks the worker how loaded the cloud is, when the last answer is stale. */
export function refreshLoad(client) {
  if (!client.worker || client.cloudLoad.probing || performance.now() - client.cloudLoad.at < LOAD_STALE_MS && client.cloudLoad.at) return;
  client.cloudLoad.probing = (async () => {
    let report = null;
    try {
      const r = await fetch(`${client.worker}/v1/load`, { cache: "no-store", signal: AbortSignal.timeout(3000) });
      if (r.status === 200) report = await r.json();
    } catch {
      // No report: the measured time to first token stands in.
    }
    client.cloudLoad = { report, at: performance.now(), probing: null };
  })();
  return client.cloudLoad.probing;
}

/** Whether the client may reach the cloud now: a worker, allowed, and a network. */
export function cloudUsable(client) {
  return Boolean(client.worker && client.options.cloud !== false && !client.offline && (globalThis.navigator?.onLine ?? true));
}

/**
 * The check after prefill: the quality model, now with the edge model's own state (its
 * first token's confidence and final hidden state), may send the request to the cloud
 * before any edge text is shown.
 */
export function firstTokenEscalation(decision, look) {
  const signals = JSON.stringify({ entropy: look.entropy, logprob: look.logprob, margin: look.margin });
  const check = JSON.parse(firstToken(JSON.stringify(decision), signals, look.state ?? undefined));
  if (check.estimate) {
    decision.trace.signals.push({ name: "edge_quality_after_prefill", value: check.estimate.p_edge_ok },
      { name: "quality_inputs_after_prefill", value: check.estimate.inputs },
      { name: "quality_drivers_after_prefill", value: check.estimate.drivers });
  }
  return check.escalate ?? null;
}

/** The tokens a request is expected to take on the device: the router's estimate. */
export function expectedTokens(ctx) {
  return traceValue(ctx.decision, "expected_output_tokens") ?? ctx.req.max_tokens ?? DEFAULT_MAX_TOKENS;
}

/** A signal's value from a decision's trace. */
export const traceValue = (decision, name) => decision.trace.signals.find((s) => s.name === name)?.value;

/** Today's date in UTC: budgets reset by UTC day. */
export const utcDay = () => new Date().toISOString().slice(0, 10);
