// An answer from the cloud through the tenant's worker: the request (redacted when it holds
// personal data and the client redacts), the stream read back and re-identified, and what it
// cost at the policy's prices.
import { cloudCostUsd, piiKinds, redactAll, routerVersion } from "../pkg/straddle.js";
import { escalate, resolveToken } from "./cloud.js";
import { StraddleError } from "./errors.js";
import { DEFAULT_MAX_TOKENS, samplingExtras } from "./request.js";
import { cloudUsable, traceValue } from "./routing.js";

/**
 * What the worker's records carry of a decision: the versions that made it and the answer's
 * id, which the user's feedback names.
 */
export function versions(decision, id, edge) {
  return {
    router_version: routerVersion(), policy_version: decision.trace.policy_version,
    ...(decision.quality && { quality_model_version: decision.quality.model_version }),
    ...(edge?.sha256 && { edge_model_sha256: edge.sha256 }),
    ...(id && { answer_id: id }),
  };
}

/** What the cloud charges for these tokens at the policy's prices (the router's formula). */
export function cloudCost(policy, tokensIn, tokensOut) {
  return cloudCostUsd(policy.cloud_price_in_per_1k, policy.cloud_price_out_per_1k, tokensIn, tokensOut);
}

/** The cloud answer through the worker: redacted when asked, re-identified here. */
export async function runCloud(client, ctx, { reasons, midStream = false, continuing = false }) {
  if (!cloudUsable(client)) throw new StraddleError("cloud_unavailable", client.worker ? "the cloud is switched off or the network is down" : "no worker is configured");
  const how = { reasons, midStream, continuing };
  const personal = findPersonal(client, ctx.req, continuing);
  const body = requestBody(client, ctx, how, personal);
  const reid = personal.redaction?.stream();
  try {
    const token = await resolveToken(client.options.token);
    const asked = performance.now();
    const { stream } = await escalate({ worker: client.worker, token, body, signal: ctx.signal, firstByteTimeoutMs: client.options.firstByteTimeoutMs });
    const read = await readStream(client, ctx, stream, reid, asked);
    return cloudEnd(client, read, how, personal);
  } finally {
    reid?.free();
    personal.redaction?.free();
  }
}

/** The personal data found in what the user sent, and its redaction when the client redacts. */
function findPersonal(client, req, continuing) {
  // A continued reply's own text came from the cloud (each token verified there): it tells
  // the cloud nothing new, and a name in it taken for personal data and redacted would
  // change what the cloud continues. Only what the user sent is checked.
  const sent = continuing ? req.messages.slice(0, -1) : req.messages;
  const found = [...new Set(sent.flatMap((m) => piiKinds(m.content)))];
  const redaction = client.options.redact && found.length ? redactAll(req.messages.map((m) => m.content), []) : null;
  return { found, redaction };
}

/** The chat request the worker gets: OpenAI's fields and what Straddle's records need. */
function requestBody(client, ctx, { reasons, midStream, continuing }, { found, redaction }) {
  const { req, decision } = ctx;
  const parts = redaction?.parts();
  const messages = req.messages.map((m, i) => ({ ...m, content: parts ? parts[i] : m.content }));
  return {
    model: client.options.cloudModel ?? "default", messages, stream: true, stream_options: { include_usage: true },
    max_tokens: req.max_tokens ?? DEFAULT_MAX_TOKENS,
    ...(continuing && { continue_final_message: true }),
    ...(req.temperature !== undefined && { temperature: req.temperature }),
    ...(req.top_p !== undefined && { top_p: req.top_p }),
    ...(req.seed !== undefined && { seed: req.seed }),
    ...(req.stop !== undefined && req.stop !== null && { stop: req.stop }),
    ...samplingExtras(req),
    straddle: {
      session: client.session, reasons, ...versions(decision, ctx.id, client.edge),
      privacy: { entities: found, redacted: Boolean(redaction) },
      prompt_tokens_estimate: traceValue(decision, "prompt_tokens_estimate"),
      ...(client.options.feature && { feature: client.options.feature }),
      escalated_mid_stream: midStream,
    },
  };
}

/** Shows the cloud's stream as it comes (re-identified), and gathers its model, usage, finish and calls. */
async function readStream(client, ctx, stream, reid, asked) {
  let firstToken = null;
  let usage = null;
  let finish = "stop";
  let model = "cloud";
  const calls = [];
  for await (const chunk of stream) {
    model = chunk.model ?? model;
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices?.[0];
    if (choice?.finish_reason) finish = choice.finish_reason;
    for (const d of choice?.delta?.tool_calls ?? []) gatherCall(calls, d);
    const text = choice?.delta?.content;
    if (text && firstToken === null) {
      // The cloud's time to first token, smoothed: what the router counts as its queue
      // where the worker relays no load report.
      firstToken = performance.now() - asked;
      client.cloudTtftMs = client.cloudTtftMs === null ? firstToken : 0.7 * client.cloudTtftMs + 0.3 * firstToken;
    }
    if (text) {
      const shown = reid ? reid.push(text) : text;
      if (shown) {
        ctx.emitted = true;
        ctx.emit(shown);
      }
    }
  }
  if (reid) {
    const rest = reid.finish();
    if (rest) {
      ctx.emitted = true;
      ctx.emit(rest);
    }
  }
  return { model, usage, finish, calls };
}

/** A finished cloud answer as the client reports it. */
function cloudEnd(client, { model, usage, finish, calls }, { reasons, midStream }, { found, redaction }) {
  usage ??= { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
  const usd = cloudCost(client.policy, usage.prompt_tokens, usage.completion_tokens);
  return {
    model, finish_reason: finish, usage, tool_calls: calls.length ? calls : undefined,
    meta: {
      route: "cloud", reasons, confidence: null, degraded: null,
      cost: { usd, prompt_tokens: usage.prompt_tokens, completion_tokens: usage.completion_tokens },
      model_versions: [`cloud/${model}`], redacted: Boolean(redaction), redacted_entities: redaction ? found : [],
      escalated_mid_stream: midStream, edge_tokens: null,
      // The whole conversation went up again: the cloud cannot reuse the device's KV cache.
      resent_history_tokens: midStream ? usage.prompt_tokens : 0,
    },
  };
}

/** Adds a streamed tool-call delta to the calls so far (pieces with one `index` concatenate). */
function gatherCall(calls, d) {
  const call = (calls[d.index ?? 0] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
  if (d.id) call.id = d.id;
  if (d.function?.name) call.function.name += d.function.name;
  if (d.function?.arguments) call.function.arguments += d.function.arguments;
}
