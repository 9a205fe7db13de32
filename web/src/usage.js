// What the page tells the worker about answers the worker did not carry, so the tenant's
// usage covers both tiers: edge answers' counts, timings and versions (never text), sent in
// batches, and the user's feedback.
import { routerVersion } from "../pkg/straddle.js";
import { resolveToken } from "./cloud.js";
import { cloudUsable } from "./routing.js";

/** Edge usage is sent to the worker in batches of this many, or after this long. */
const USAGE_BATCH = 20;
const USAGE_FLUSH_MS = 10_000;
/** The most answers one report carries (the worker's limit). */
const USAGE_BATCH_MAX = 100;

/**
 * Queues an edge answer's usage for the worker (counts, timings and versions; never text),
 * sent in batches so usage by user, feature and session covers both tiers.
 */
export function reportEdgeAnswer(client, id, end, meta) {
  if (!client.worker || client.options.reportUsage === false) return;
  const d = end.decision;
  client.usageQueue.push({
    id, prompt_tokens: end.usage.prompt_tokens, completion_tokens: end.usage.completion_tokens,
    latency_ms: meta.latency_ms, ...(meta.ttft_ms !== null && { ttft_ms: meta.ttft_ms }), reasons: meta.reasons,
    router_version: routerVersion(), policy_version: d.trace.policy_version, quality_model_version: d.quality?.model_version ?? "",
    edge_model_sha256: client.edge?.sha256 ?? "", model: client.edge?.name ?? "",
  });
  // Never more than a report's worth kept: the oldest go first while the cloud is away.
  client.usageQueue.splice(0, Math.max(0, client.usageQueue.length - USAGE_BATCH_MAX));
  if (client.usageQueue.length >= USAGE_BATCH) flushUsage(client);
  else client.usageTimer ??= setTimeout(() => flushUsage(client), USAGE_FLUSH_MS);
}

/** Sends the queued edge usage; what fails stays queued (the worker counts an id once). */
export async function flushUsage(client) {
  clearTimeout(client.usageTimer);
  client.usageTimer = null;
  if (!client.usageQueue.length || !cloudUsable(client)) return;
  const answers = client.usageQueue.splice(0);
  try {
    const token = await resolveToken(client.options.token);
    const headers = { "content-type": "application/json", ...(token && { authorization: `Bearer ${token}` }) };
    const r = await fetch(`${client.worker}/v1/usage/edge`, { method: "POST", headers, body: JSON.stringify({ answers }), keepalive: true });
    if (!r.ok && r.status >= 500) throw new Error(`the worker answered ${r.status}`);
  } catch {
    client.usageQueue.unshift(...answers.slice(0, USAGE_BATCH_MAX - client.usageQueue.length));
  }
}

/**
 * Tells the worker the user's reward for answer `id`, so usage by version reports it. Kept
 * locally either way: a worker that cannot be reached loses only the tenant's copy.
 */
export async function reportFeedback(client, id, reward) {
  if (!client.worker || client.options.reportUsage === false) return;
  // An edge answer's record must exist before its rating can find it.
  await flushUsage(client);
  try {
    const token = await resolveToken(client.options.token);
    const resp = await fetch(`${client.worker}/v1/feedback`, {
      method: "POST", body: JSON.stringify({ feedback: [{ id, reward }] }), signal: AbortSignal.timeout(5000),
      headers: { "content-type": "application/json", ...(token && { authorization: `Bearer ${token}` }) },
    });
    if (!resp.ok) console.warn(`straddle: the worker refused the feedback (${resp.status})`);
  } catch (e) {
    console.warn("straddle: the feedback did not reach the worker:", e.message ?? e);
  }
}
