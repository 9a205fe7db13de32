// A chat request checked the way the cloud checks it, so the edge path refuses the same
// things, and what the engines and the router read from it.
import { StraddleError } from "./errors.js";

/** The answer's length limit when a request sets no `max_tokens`. */
export const DEFAULT_MAX_TOKENS = 256;

const ROLES = new Set(["system", "user", "assistant", "tool"]);
const IDENTIFIER = /^[A-Za-z0-9_-]{1,64}$/;

/** An `invalid_request` error naming the field at fault. */
export function invalid(param, message) {
  return new StraddleError("invalid_request", `${param}: ${message}`, { param });
}

/**
 * Checks a request the way the cloud would, so the edge path refuses the same things, and
 * returns it with every message's content as text.
 */
export function validate(req) {
  if (!req || typeof req !== "object") throw invalid("request", "expected an object");
  const { messages } = req;
  if (!Array.isArray(messages) || messages.length === 0) throw invalid("messages", "at least one message is required");
  const texts = messages.map((m, i) => {
    if (!m || !ROLES.has(m.role)) throw invalid(`messages[${i}].role`, "must be system, user, assistant or tool");
    if (m.role === "tool" && typeof m.tool_call_id !== "string") throw invalid(`messages[${i}].tool_call_id`, "a tool message must say which call it answers");
    if (m.tool_calls !== undefined && m.role !== "assistant") throw invalid(`messages[${i}].tool_calls`, "only an assistant message calls tools");
    return { ...m, content: contentText(m.content, i) };
  });
  const num = (name, lo, hi, int = false) => {
    const v = req[name];
    if (v === undefined || v === null) return;
    if (typeof v !== "number" || !Number.isFinite(v) || v < lo || v > hi || (int && !Number.isInteger(v))) {
      throw invalid(name, `must be ${int ? "an integer" : "a number"} in ${lo}..${hi}`);
    }
  };
  num("max_tokens", 1, 32768, true);
  num("temperature", 0, 2);
  num("top_p", Number.MIN_VALUE, 1);
  num("seed", 0, Number.MAX_SAFE_INTEGER, true);
  num("presence_penalty", -2, 2);
  num("frequency_penalty", -2, 2);
  if (req.logit_bias !== undefined && req.logit_bias !== null) {
    const ok = typeof req.logit_bias === "object" && Object.entries(req.logit_bias)
      .every(([k, v]) => /^\d+$/.test(k) && typeof v === "number" && v >= -100 && v <= 100);
    if (!ok) throw invalid("logit_bias", "must map token ids to biases in -100..100");
  }
  checkResponseFormat(req.response_format);
  checkTools(req.tools, req.tool_choice);
  if (req.stop !== undefined && req.stop !== null) {
    const stops = typeof req.stop === "string" ? [req.stop] : req.stop;
    if (!Array.isArray(stops) || stops.length > 4 || stops.some((s) => typeof s !== "string" || !s)) {
      throw invalid("stop", "must be a string or up to 4 non-empty strings");
    }
  }
  if (req.signal !== undefined && !(req.signal instanceof AbortSignal)) throw invalid("signal", "must be an AbortSignal");
  const want = req.straddle?.route;
  if (want !== undefined && !["auto", "edge", "cloud", "speculative"].includes(want)) {
    throw invalid("straddle.route", "must be auto, edge, cloud or speculative");
  }
  return { ...req, messages: texts };
}

/** A message's text: a string, or (as many clients send it) an array of text parts. */
function contentText(content, i) {
  if (typeof content === "string") return content;
  if (content === null || content === undefined) return "";
  if (!Array.isArray(content)) throw invalid(`messages[${i}].content`, "must be a string or an array of text parts");
  return content.map((part) => {
    if (part?.type !== "text") {
      throw invalid(`messages[${i}].content`, `unsupported content part \`${part?.type}\`: only text parts are supported`);
    }
    if (typeof part.text !== "string") throw invalid(`messages[${i}].content`, "a text part needs a string `text`");
    return part.text;
  }).join("");
}

/** `response_format`: checked for shape here; the schema itself by the engine that runs it. */
function checkResponseFormat(rf) {
  if (rf === undefined || rf === null) return;
  if (!["text", "json_object", "json_schema"].includes(rf?.type)) {
    throw invalid("response_format", "type must be text, json_object or json_schema");
  }
  if (rf.type !== "json_schema") return;
  const js = rf.json_schema;
  if (!js || typeof js.name !== "string" || !/^[A-Za-z0-9_-]{1,64}$/.test(js.name)) {
    throw invalid("response_format.json_schema.name", "must be 1 to 64 letters, digits, underscores or dashes");
  }
  if (js.schema !== undefined && (typeof js.schema !== "object" || js.schema === null || Array.isArray(js.schema)) && typeof js.schema !== "boolean") {
    throw invalid("response_format.json_schema.schema", "must be a JSON Schema object");
  }
}

/** `tools` and `tool_choice`: names are identifiers, and a choice names an offered function. */
function checkTools(tools, choice) {
  if (tools !== undefined && tools !== null && !Array.isArray(tools)) throw invalid("tools", "must be an array of tools");
  const names = (tools ?? []).map((t, i) => {
    if (t?.type !== "function" || typeof t.function !== "object" || t.function === null) throw invalid(`tools[${i}]`, "must be {type: \"function\", function: {...}}");
    if (typeof t.function.name !== "string" || !IDENTIFIER.test(t.function.name)) {
      throw invalid(`tools[${i}].function.name`, "must be 1 to 64 letters, digits, underscores or dashes");
    }
    return t.function.name;
  });
  if (choice === undefined || choice === null || choice === "auto" || choice === "none") return;
  if (choice !== "required" && typeof choice?.function?.name !== "string") {
    throw invalid("tool_choice", "must be none, auto, required or {type: \"function\", function: {name}}");
  }
  if (!names.length) throw invalid("tool_choice", "a tool must be called, but `tools` offers none");
  if (choice !== "required" && !names.includes(choice.function.name)) {
    throw invalid("tool_choice", `names \`${choice.function.name}\`, which is not among \`tools\``);
  }
}

/** The OpenAI fields both engines take beyond the basics, only those the request sets. */
export function samplingExtras(req) {
  const extras = {};
  for (const name of ["presence_penalty", "frequency_penalty", "logit_bias", "response_format", "tools", "tool_choice", "parallel_tool_calls"]) {
    if (req[name] !== undefined && req[name] !== null) extras[name] = req[name];
  }
  return extras;
}

/** The device engine's settings for a request. */
export function edgeParams(req) {
  const stop = req.stop === undefined || req.stop === null ? [] : typeof req.stop === "string" ? [req.stop] : req.stop;
  return { max_tokens: req.max_tokens ?? DEFAULT_MAX_TOKENS, temperature: req.temperature ?? undefined, top_p: req.top_p ?? undefined, seed: req.seed ?? undefined, stop, ...samplingExtras(req) };
}

/** Whether the tools are offered: the answer may then be a call. */
const offersTools = (req) => Array.isArray(req.tools) && req.tools.length > 0 && req.tool_choice !== "none";

/** Whether the answer is held to a grammar: JSON, or a possible tool call (which speculation cannot keep to). */
export const constrained = (req) => (Boolean(req.response_format) && req.response_format.type !== "text") || offersTools(req);

/**
 * What the router needs of a request held to a schema or a tool call: the schema's size
 * (the answer's length follows it). Undefined for free text.
 */
export function structuredShape(req) {
  if (offersTools(req)) return { schema_bytes: JSON.stringify(req.tools).length, tool_call: true };
  const rf = req.response_format;
  if (!rf || rf.type === "text") return undefined;
  return { schema_bytes: rf.type === "json_schema" ? JSON.stringify(rf.json_schema.schema ?? {}).length : 0, tool_call: false };
}
