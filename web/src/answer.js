// One request run to its end on the route the router chose. Failover lives here: cloud →
// edge when the worker fails before answering, edge → cloud when the device cannot, never
// past privacy.
import { routerVersion, version } from "../pkg/straddle.js";
import { runCloud } from "./cloud-run.js";
import { runEdge } from "./edge-run.js";
import { StraddleError } from "./errors.js";
import { cloudUsable, decide, utcDay } from "./routing.js";
import { runSpeculative, whyNotSpeculative } from "./speculate.js";

/**
 * Runs a request to its end, handing answer text to `emit`, and resolves to
 * `{meta, usage, finish_reason, model}` with the decision and the time to first token.
 */
export async function answer(client, req, emit, started, signal, id) {
  // A model being loaded again after its device failed is the device's answer soon.
  await client.reloading?.catch(() => {});
  const decision = decide(client, req);
  if (signal?.aborted) throw new StraddleError("aborted", "the request was aborted");
  let firstAt = null;
  const out = (t) => { if (t) { firstAt ??= performance.now(); emit(t); } };
  const ctx = { req, decision, signal, emit: out, id };
  if (decision.target === "speculative") {
    const why = whyNotSpeculative(client, req);
    if (why) {
      decision.target = "cloud";
      decision.reasons = [...decision.reasons, `not speculative: ${why}`];
    }
  }
  const end = await (decision.target === "speculative" ? runSpeculative(client, ctx)
    : decision.target === "cloud" ? cloudFirst(client, ctx)
    : edgeFirst(client, ctx));
  end.ttft_ms = firstAt === null ? null : firstAt - started;
  end.decision = decision;
  const quality = decision.quality?.model_version;
  end.meta.model_versions = [`straddle/${version()}`, routerVersion(), `policy/${decision.trace.policy_version}`,
    ...(quality ? [`quality/${quality}`] : []), ...(end.meta.model_versions ?? [])];
  return end;
}

/** The cloud's answer, or the edge's when the cloud fails before showing anything. */
async function cloudFirst(client, ctx) {
  const { decision } = ctx;
  try {
    const end = await runCloud(client, ctx, { reasons: decision.reasons });
    // The device was meant to take part and could not: say so, as for any failover.
    if (decision.trace.rule === "edge_unavailable" && client.edgeError) {
      end.meta.degraded = `the on-device model is unavailable (${client.edgeError.code}): ${client.edgeError.message}`;
    }
    return end;
  } catch (e) {
    if (e.code === "budget_exhausted") client.budgetSpentOn = utcDay();
    if (e.code === "aborted" || ctx.emitted || !client.edge) throw e;
    const end = await runEdge(client, ctx, { cascade: false });
    end.meta.degraded = `the cloud failed (${e.code}): ${e.message}`;
    end.meta.reasons = [...decision.reasons, `fell back to the edge: ${e.code}`];
    return end;
  }
}

/**
 * The edge's answer (under the cascade when the decision has one and the cloud is there), or
 * the cloud's when the model is not loaded and the request may leave the device.
 */
async function edgeFirst(client, ctx) {
  const { decision } = ctx;
  const privateData = decision.trace.rule === "privacy";
  if (!client.edge && client.options.waitForModel === false && client.ready && privateData) await client.ready;
  if (client.edge) return runEdge(client, ctx, { cascade: Boolean(decision.cascade) && cloudUsable(client) });
  const why = client.edgeError?.message ?? "the on-device model is not loaded";
  if (privateData || !cloudUsable(client)) {
    throw new StraddleError(privateData ? "privacy_no_route" : "edge_unavailable",
      privateData ? `this request must stay on the device (${decision.reasons.join("; ")}), but ${why}` : why);
  }
  const end = await runCloud(client, ctx, { reasons: [...decision.reasons, "edge unavailable"] });
  end.meta.degraded = `the edge could not answer: ${why}`;
  return end;
}
