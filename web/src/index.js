// Straddle's JS API: an OpenAI-shaped client whose every request is routed between the
// model on this device (in a Web Worker) and the cloud behind the tenant's edge worker.
import init, { Cascade, Learner, cloudCostUsd, firstToken, piiKinds, policyPreset, redactAll, route as routeWasm, routerVersion, version } from "../pkg/straddle.js";
import { escalate, measureRtt, resolveToken } from "./cloud.js";
import { EdgeHost } from "./edge.js";
import { checkMemory } from "./model-store.js";
import { StraddleError } from "./errors.js";
import { FeedbackStore, SessionStats } from "./stats.js";

export { StraddleError };

const ROLES = new Set(["system", "user", "assistant", "tool"]);
/** Decode speed assumed before the first edge answer measures it, per backend. */
const PRIOR_TOKENS_PER_S = { webgpu: 30, cpu: 10 };
const DEFAULT_MAX_TOKENS = 256;
const RTT_STALE_MS = 60_000;
/** Edge usage is sent to the worker in batches of this many, or after this long. */
const USAGE_BATCH = 20;
const USAGE_FLUSH_MS = 10_000;
/** The most answers one report carries (the worker's limit). */
const USAGE_BATCH_MAX = 100;
/** How old the cloud's load report may be before a decision asks again. */
const LOAD_STALE_MS = 2_000;
/** Why a page that asked for threads runs the CPU model on one. */
const NOT_ISOLATED = "the page is not cross-origin isolated, so it cannot share memory with workers "
  + "(serve it with Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: require-corp)";

let wasmModule = null;

/** Compiles the wasm once per page; the engine worker instantiates the same module. */
async function loadWasm(url) {
  if (!wasmModule) {
    wasmModule = (async () => {
      const resp = await fetch(url);
      if (!resp.ok) throw new StraddleError("wasm_unavailable", `could not fetch ${url}: HTTP ${resp.status}`);
      const module = await WebAssembly.compileStreaming(resp).catch(async () =>
        // Servers that send the wrong content type defeat streaming compilation.
        WebAssembly.compile(await (await fetch(url)).arrayBuffer()));
      await init({ module_or_path: module });
      return module;
    })();
    wasmModule.catch(() => { wasmModule = null; });
  }
  return wasmModule;
}

function invalid(param, message) {
  return new StraddleError("invalid_request", `${param}: ${message}`, { param });
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

const IDENTIFIER = /^[A-Za-z0-9_-]{1,64}$/;

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

/**
 * Checks a request the way the cloud would, so the edge path refuses the same things, and
 * returns it with every message's content as text.
 */
function validate(req) {
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

/** The OpenAI fields both engines take beyond the basics, only those the request sets. */
function samplingExtras(req) {
  const extras = {};
  for (const name of ["presence_penalty", "frequency_penalty", "logit_bias", "response_format", "tools", "tool_choice", "parallel_tool_calls"]) {
    if (req[name] !== undefined && req[name] !== null) extras[name] = req[name];
  }
  return extras;
}

/** Whether the tools are offered: the answer may then be a call. */
const offersTools = (req) => Array.isArray(req.tools) && req.tools.length > 0 && req.tool_choice !== "none";

/** Whether the answer is held to a grammar: JSON, or a possible tool call (which speculation cannot keep to). */
const constrained = (req) => (Boolean(req.response_format) && req.response_format.type !== "text") || offersTools(req);

/**
 * What the router needs of a request held to a schema or a tool call: the schema's size
 * (the answer's length follows it). Undefined for free text.
 */
function structuredShape(req) {
  if (offersTools(req)) return { schema_bytes: JSON.stringify(req.tools).length, tool_call: true };
  const rf = req.response_format;
  if (!rf || rf.type === "text") return undefined;
  return { schema_bytes: rf.type === "json_schema" ? JSON.stringify(rf.json_schema.schema ?? {}).length : 0, tool_call: false };
}

/** Adds a streamed tool-call delta to the calls so far (pieces with one `index` concatenate). */
function gatherCall(calls, d) {
  const call = (calls[d.index ?? 0] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
  if (d.id) call.id = d.id;
  if (d.function?.name) call.function.name += d.function.name;
  if (d.function?.arguments) call.function.arguments += d.function.arguments;
}

/** The tokens a request is expected to take on the device: the router's estimate. */
function expectedTokens(ctx) {
  return traceValue(ctx.decision, "expected_output_tokens") ?? ctx.req.max_tokens ?? DEFAULT_MAX_TOKENS;
}

/** A signal's value from a decision's trace. */
const traceValue = (decision, name) => decision.trace.signals.find((s) => s.name === name)?.value;

/** Today's date in UTC: budgets reset by UTC day. */
const utcDay = () => new Date().toISOString().slice(0, 10);

const newId = () => `chatcmpl-${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;

/**
 * The device's battery: `source` (an option, for pages that know better or for tests), else
 * the Battery Status API where the browser has it; `null` where neither reports one, which
 * the router reads as mains power.
 */
async function readBattery(source) {
  try {
    const read = source ?? globalThis.navigator?.getBattery?.bind(globalThis.navigator);
    const b = read ? await read() : null;
    return b && Number.isFinite(b.level) ? b : null;
  } catch {
    return null;
  }
}

/** A hybrid edge–cloud client; make one with `await Straddle.create(options)`. */
export class Straddle {
  /**
   * Loads the wasm, starts the engine worker and loads the model (progress through
   * `onProgress`), and measures the way to the worker. See index.d.ts for the options.
   */
  static async create(options = {}) {
    // An option given as `undefined` means "the default", as in most JS APIs.
    const given = Object.fromEntries(Object.entries(options ?? {}).filter(([, v]) => v !== undefined));
    const o = { backend: "auto", policy: "balanced", cloud: true, redact: true, cacheModel: true,
      firstByteTimeoutMs: 15_000, waitForModel: true, learn: false, ...given };
    if (!o.model && !o.worker) throw new StraddleError("invalid_options", "give a model, a worker, or both");
    if (!["auto", "webgpu", "cpu"].includes(o.backend)) throw new StraddleError("invalid_options", "backend must be auto, webgpu or cpu");
    o.threads ??= "auto";
    if (o.threads !== "auto" && !(Number.isInteger(o.threads) && o.threads >= 1)) {
      throw new StraddleError("invalid_options", "threads must be \"auto\" or a whole number ≥ 1");
    }
    const wasmUrl = o.wasmUrl ?? new URL("../pkg/straddle_bg.wasm", import.meta.url);
    const module = await loadWasm(wasmUrl);
    const s = new Straddle(o, module);
    s.setPolicyNow(o.policy);
    s.feedbackStore = await FeedbackStore.open();
    if (o.learn) await s.restoreLearner();
    if (o.worker) {
      s.refreshRtt();
      s.refreshLoad();
    }
    s.battery = await readBattery(o.battery);
    s.ready = o.model ? s.loadModel() : Promise.resolve();
    if (o.waitForModel) await s.ready;
    return s;
  }

  constructor(options, module) {
    this.options = options;
    this.module = module;
    this.worker = options.worker ? String(options.worker).replace(/\/$/, "") : null;
    this.session = options.session ?? crypto.randomUUID();
    this.edge = null; // {host, backend, languages, name, tokensPerS}
    this.edgeError = null;
    this.rtt = { ms: null, at: 0, probing: null };
    // A new network (Wi-Fi to cellular, a tunnel) makes the last round trip stale: until it
    // is measured again, the Network Information API's estimate stands in.
    globalThis.navigator?.connection?.addEventListener?.("change", () => {
      this.rtt = { ms: null, at: 0, probing: null };
    });
    // The cloud's load as the worker relays it, and its measured time to first token.
    this.cloudLoad = { report: null, at: 0, probing: null };
    this.cloudTtftMs = null;
    // The device answers one request at a time: those waiting, and the promise the next one
    // waits on.
    this.edgeJobs = [];
    // Edge answers' usage not yet sent to the worker.
    this.usageQueue = [];
    this.usageTimer = null;
    this.edgeTail = Promise.resolve();
    this.offline = false;
    this.sessionStats = new SessionStats();
    this.answers = new Map(); // id -> what feedback needs
    const completions = { create: (req) => this.createCompletion(req) };
    this.chat = { completions };
  }

  resolvePolicy(policy) {
    try {
      if (typeof policy === "string") return policyPreset(policy);
      const base = JSON.parse(policyPreset(policy.preset ?? "balanced"));
      const { preset, ...rest } = policy;
      const json = JSON.stringify({ ...base, ...rest });
      routeWasm([""], 1, JSON.stringify({ online: true, edge_available: true, edge_tokens_per_s: 1, rtt_ms: 1, edge_languages: [] }), json);
      return json;
    } catch (e) {
      throw new StraddleError("invalid_options", `policy: ${e.message ?? e}`);
    }
  }

  /** The bandit's state for this policy version, from IndexedDB (a fresh one if unusable). */
  async restoreLearner() {
    this.learnerKey = `bandit:${this.policy.version}`;
    const saved = await this.feedbackStore.getState(this.learnerKey).catch(() => undefined);
    try {
      this.learner = new Learner(saved);
    } catch (e) {
      console.warn("straddle: saved routing feedback is unusable, starting afresh:", e.message);
      this.learner = new Learner(undefined);
    }
  }

  async loadModel() {
    const o = this.options;
    try {
      // Threads only where the browser allows shared memory; the WebGPU backend needs none.
      const cores = globalThis.navigator?.hardwareConcurrency ?? 1;
      const wanted = o.backend === "webgpu" ? 1 : o.threads === "auto" ? Math.min(cores, 8) : Math.min(o.threads, cores);
      const isolated = Boolean(globalThis.crossOriginIsolated);
      const url = new URL(o.model, globalThis.location?.href);
      await checkMemory(url, o.cacheModel !== false);
      const host = await EdgeHost.start(this.module, isolated ? wanted : 1);
      const loaded = await host.load({ url, sha256: o.sha256, backend: o.backend, cache: o.cacheModel }, o.onProgress);
      // The worker can only say why its pool failed; a page without isolation never asks it
      // for one, so the reason is ours to give.
      const threadsError = loaded.backend !== "cpu" ? null
        : loaded.threadsError ?? (!isolated && wanted > 1 ? NOT_ISOLATED : null);
      // "auto" on a plain page is the common case, not a mistake worth a warning.
      if (threadsError && (o.threads !== "auto" || loaded.threadsError)) console.warn("straddle: the CPU backend runs on one thread:", threadsError);
      this.edge = { host, ...loaded, threadsError, tokensPerS: PRIOR_TOKENS_PER_S[loaded.backend] ?? 10, measured: false };
      this.edgeError = null;
      await this.probeVerifier();
    } catch (e) {
      this.edgeError = e instanceof StraddleError ? e : new StraddleError("edge_unavailable", String(e.message ?? e));
      // Without the model the cloud may still answer; with neither, say so now.
      if (!this.cloudUsable()) throw this.edgeError;
      console.warn("straddle: the on-device model is unavailable; answers come from the cloud:", this.edgeError.message);
    }
  }

  /**
   * Whether the worker's cloud can verify this model's drafts: it says it supports
   * `/v1/verify` and its tokenizer hash is ours. Asked once, after the model loads.
   */
  async probeVerifier() {
    this.cloudVerifies = false;
    if (!this.worker || !this.edge || this.options.speculative === false) return;
    try {
      const resp = await fetch(`${this.worker}/v1/models`, { signal: AbortSignal.timeout(5000) });
      const model = resp.ok ? (await resp.json()).data?.[0] : null;
      this.cloudVerifies = Boolean(model?.supports_verify && model.tokenizer_hash === this.edge.tokenizerHash);
    } catch {
      // No answer: no speculation; plain cloud streaming still works.
    }
  }

  cloudUsable() {
    return Boolean(this.worker && this.options.cloud !== false && !this.offline && (globalThis.navigator?.onLine ?? true));
  }

  /** Re-measures the round trip to the worker when the last measurement is stale. */
  refreshRtt() {
    if (!this.worker || this.rtt.probing || performance.now() - this.rtt.at < RTT_STALE_MS && this.rtt.at) return;
    const probe = (async () => {
      const samples = [];
      for (let i = 0; i < 3; i++) {
        const ms = await measureRtt(this.worker);
        if (ms !== null) samples.push(ms);
      }
      samples.sort((a, b) => a - b);
      // A network change during the probe made its samples stale.
      if (this.rtt.probing !== probe) return;
      this.rtt = { ms: samples.length ? samples[Math.floor(samples.length / 2)] : null, at: performance.now(), probing: null };
    })();
    this.rtt.probing = probe;
  }

  /** Asks the worker how loaded the cloud is, when the last answer is stale. */
  refreshLoad() {
    if (!this.worker || this.cloudLoad.probing || performance.now() - this.cloudLoad.at < LOAD_STALE_MS && this.cloudLoad.at) return;
    this.cloudLoad.probing = (async () => {
      let report = null;
      try {
        const r = await fetch(`${this.worker}/v1/load`, { cache: "no-store", signal: AbortSignal.timeout(3000) });
        if (r.status === 200) report = await r.json();
      } catch {
        // No report: the measured time to first token stands in.
      }
      this.cloudLoad = { report, at: performance.now(), probing: null };
    })();
    return this.cloudLoad.probing;
  }

  /**
   * Runs `work` on the device once the answers ahead of it are done: one at a time, so two
   * requests never interleave on the engine. `work` gets its job, whose `done` it counts up.
   */
  async onEdge(expectedTokens, work) {
    const job = { expected: expectedTokens, done: 0 };
    this.edgeJobs.push(job);
    const ahead = this.edgeTail;
    let release;
    this.edgeTail = new Promise((r) => { release = r; });
    try {
      await ahead;
      return await work(job);
    } finally {
      this.edgeJobs.splice(this.edgeJobs.indexOf(job), 1);
      release();
    }
  }

  /** Seconds of answers ahead of a new request on the device, at its measured speed. */
  edgeBusySeconds() {
    const tokens = this.edgeJobs.reduce((sum, j) => sum + Math.max(0, j.expected - j.done), 0);
    return this.edge && tokens > 0 ? tokens / this.edge.tokensPerS : 0;
  }

  setPolicyNow(policy) {
    this.policyJson = this.resolvePolicy(policy);
    this.policy = JSON.parse(this.policyJson);
    this.speculativeMeasured = false;
  }

  /** Switches the routing policy (a preset name or overrides) for the requests that follow. */
  setPolicy(policy) {
    this.setPolicyNow(policy);
    // What the bandit learned belongs to the policy it learned under.
    if (this.learner) return this.restoreLearner();
  }

  /** Treat the network as down (a user's "never use the cloud", a demo's offline switch). */
  setOffline(offline) {
    this.offline = Boolean(offline);
  }

  context() {
    this.refreshRtt();
    this.refreshLoad();
    const conn = globalThis.navigator?.connection;
    return {
      online: this.cloudUsable(),
      edge_available: Boolean(this.edge),
      edge_tokens_per_s: this.edge?.tokensPerS ?? 0,
      // Before a probe returns, the Network Information API's estimate, else a guess.
      rtt_ms: this.rtt.ms ?? conn?.rtt ?? 150,
      edge_languages: this.edge?.languages ?? [],
      cloud_verifies: Boolean(this.cloudVerifies),
      // Counted by the router where present (JSON.stringify drops the undefined ones).
      bandwidth_kbps: conn?.downlink ? conn.downlink * 1000 : undefined,
      edge_prefill_tokens_per_s: this.edge?.prefillTokensPerS,
      edge_context_tokens: this.edge?.contextTokens,
      edge_model_sha256: this.edge?.sha256,
      edge_backend: this.edge?.backend,
      // A BatteryManager is live: its level and charging state are read as they are now.
      battery: this.battery ? { level: this.battery.level, charging: this.battery.charging } : undefined,
      // Once the worker has said the tenant's budget is spent, the rest of the UTC day stays
      // on the device instead of paying a round trip to be refused.
      budget_remaining_usd: this.budgetSpentOn === utcDay() ? 0 : undefined,
      cloud_load: this.cloudLoad.report ?? undefined,
      cloud_ttft_ms: this.cloudTtftMs ?? undefined,
      edge_busy_s: this.edgeBusySeconds() || undefined,
      // The user asked the browser to save data: no speculation, which re-sends its drafts.
      save_data: conn?.saveData === true,
    };
  }

  /** Where `request` would run, and why, without running it. */
  route(request) {
    return this.decide(validate(request));
  }

  decide(req) {
    // The last message is the turn being answered; the router reads its language and task
    // from it, and scans the whole conversation for personal data.
    const turns = req.messages.map((m) => m.content);
    const context = { ...this.context(), structured: structuredShape(req) };
    const d = JSON.parse(routeWasm(turns, req.max_tokens ?? DEFAULT_MAX_TOKENS, JSON.stringify(context), this.policyJson));
    const want = req.straddle?.route ?? "auto";
    // Once there is feedback, the bandit replaces the fixed score (never a rule). Its cloud
    // arm covers speculation, which is the cloud's answer too.
    const learned = want === "auto" ? this.learner?.choose(JSON.stringify(d)) : undefined;
    if (learned && learned !== d.target && !(learned === "cloud" && d.target === "speculative")) {
      d.reasons = [...d.reasons, `learned from feedback: ${learned} has paid off for requests like this`];
      d.target = learned;
      d.cascade = learned === "edge" ? this.policy.cascade : null;
    }
    // A page may insist on a route, but never past the privacy rule or an edge-only policy.
    const binding = d.trace.rule === "privacy" || (d.trace.rule === "offline" && this.policy.edge_only);
    if (want !== "auto" && want !== d.target && !binding) {
      d.reasons = [`the request asked for ${want}`, ...d.reasons];
      d.target = want;
      d.cascade = null;
    }
    return d;
  }

  /** `chat.completions.create`: an answer, or with `stream: true` an async iterable of chunks. */
  async createCompletion(request) {
    const req = validate(request);
    const started = performance.now();
    // One signal for the caller's abort and for a stream consumer that stops reading.
    const stop = new AbortController();
    if (req.signal) {
      if (req.signal.aborted) stop.abort();
      else req.signal.addEventListener("abort", () => stop.abort(), { once: true });
    }
    const id = newId();
    const created = Math.floor(Date.now() / 1000);
    if (!req.stream) {
      let text = "";
      const end = await this.answer(req, (t) => { text += t; }, started, stop.signal, id);
      const calls = end.tool_calls?.length ? { tool_calls: end.tool_calls } : {};
      return {
        id, object: "chat.completion", created, model: end.model,
        choices: [{ index: 0, message: { role: "assistant", content: calls.tool_calls && !text ? null : text, ...calls }, finish_reason: end.finish_reason }],
        usage: end.usage, straddle: this.finishMeta(id, end, started),
      };
    }
    // Streaming: the answer runs ahead and fills a queue the iterator drains.
    const queue = [];
    let wake = null;
    let outcome = null;
    const notify = () => { wake?.(); wake = null; };
    this.answer(req, (t) => { queue.push(t); notify(); }, started, stop.signal, id).then(
      (end) => { outcome = { end }; notify(); },
      (error) => { outcome = { error }; notify(); },
    );
    const self = this;
    let first = true;
    async function* chunks() {
      try {
        yield* drain();
      } finally {
        if (!outcome) stop.abort();
      }
    }
    async function* drain() {
      for (;;) {
        if (queue.length) {
          const content = queue.splice(0).join("");
          const delta = first ? { role: "assistant", content } : { content };
          first = false;
          yield { id, object: "chat.completion.chunk", created, model: self.modelName(), choices: [{ index: 0, delta, finish_reason: null }] };
          continue;
        }
        if (outcome?.error) throw outcome.error;
        if (outcome) {
          const { end } = outcome;
          if (end.tool_calls?.length) {
            // A call streams whole, once complete, as the cloud server streams it.
            const tool_calls = end.tool_calls.map((c, index) => ({ index, ...c }));
            const delta = first ? { role: "assistant", content: null, tool_calls } : { tool_calls };
            first = false;
            yield { id, object: "chat.completion.chunk", created, model: end.model, choices: [{ index: 0, delta, finish_reason: null }] };
          }
          yield { id, object: "chat.completion.chunk", created, model: end.model,
            choices: [{ index: 0, delta: {}, finish_reason: end.finish_reason }], usage: end.usage,
            straddle: self.finishMeta(id, end, started) };
          return;
        }
        await new Promise((r) => { wake = r; });
      }
    }
    return chunks();
  }

  /**
   * What the worker's records carry of a decision: the versions that made it and the answer's
   * id, which the user's feedback names.
   */
  versions(decision, id) {
    return {
      router_version: routerVersion(), policy_version: decision.trace.policy_version,
      ...(decision.quality && { quality_model_version: decision.quality.model_version }),
      ...(this.edge?.sha256 && { edge_model_sha256: this.edge.sha256 }),
      ...(id && { answer_id: id }),
    };
  }

  /** What the cloud charges for these tokens at the policy's prices (the router's formula). */
  cloudCost(tokensIn, tokensOut) {
    return cloudCostUsd(this.policy.cloud_price_in_per_1k, this.policy.cloud_price_out_per_1k, tokensIn, tokensOut);
  }

  modelName() {
    return this.edge?.name ?? "straddle";
  }

  finishMeta(id, end, started) {
    const meta = { ...end.meta, latency_ms: performance.now() - started, ttft_ms: end.ttft_ms ?? null };
    this.sessionStats.record(meta, end.usage.completion_tokens);
    this.answers.set(id, { route: meta.route, decision: end.decision, cost_usd: meta.cost.usd, latency_s: meta.latency_ms / 1000 });
    if (meta.route === "edge") this.reportEdgeAnswer(id, end, meta);
    return meta;
  }

  /**
   * Queues an edge answer's usage for the worker (counts, timings and versions; never text),
   * sent in batches so usage by user, feature and session covers both tiers.
   */
  reportEdgeAnswer(id, end, meta) {
    if (!this.worker || this.options.reportUsage === false) return;
    const d = end.decision;
    this.usageQueue.push({
      id, prompt_tokens: end.usage.prompt_tokens, completion_tokens: end.usage.completion_tokens,
      latency_ms: meta.latency_ms, ...(meta.ttft_ms !== null && { ttft_ms: meta.ttft_ms }), reasons: meta.reasons,
      router_version: routerVersion(), policy_version: d.trace.policy_version, quality_model_version: d.quality?.model_version ?? "",
      edge_model_sha256: this.edge?.sha256 ?? "", model: this.edge?.name ?? "",
    });
    // Never more than a report's worth kept: the oldest go first while the cloud is away.
    this.usageQueue.splice(0, Math.max(0, this.usageQueue.length - USAGE_BATCH_MAX));
    if (this.usageQueue.length >= USAGE_BATCH) this.flushUsage();
    else this.usageTimer ??= setTimeout(() => this.flushUsage(), USAGE_FLUSH_MS);
  }

  /** Sends the queued edge usage; what fails stays queued (the worker counts an id once). */
  async flushUsage() {
    clearTimeout(this.usageTimer);
    this.usageTimer = null;
    if (!this.usageQueue.length || !this.cloudUsable()) return;
    const answers = this.usageQueue.splice(0);
    try {
      const token = await resolveToken(this.options.token);
      const headers = { "content-type": "application/json", ...(token && { authorization: `Bearer ${token}` }) };
      const r = await fetch(`${this.worker}/v1/usage/edge`, { method: "POST", headers, body: JSON.stringify({ answers }), keepalive: true });
      if (!r.ok && r.status >= 500) throw new Error(`the worker answered ${r.status}`);
    } catch {
      this.usageQueue.unshift(...answers.slice(0, USAGE_BATCH_MAX - this.usageQueue.length));
    }
  }

  /**
   * Runs a request to its end, handing answer text to `emit`, and resolves to
   * `{meta, usage, finish_reason, model}`. Failover lives here: cloud → edge when the
   * worker fails before answering, edge → cloud when the device cannot, never past privacy.
   */
  async answer(req, emit, started, signal, id) {
    const decision = this.decide(req);
    if (signal?.aborted) throw new StraddleError("aborted", "the request was aborted");
    let firstAt = null;
    const out = (t) => { if (t) { firstAt ??= performance.now(); emit(t); } };
    const ctx = { req, decision, signal, emit: out, id };
    const privateData = decision.trace.rule === "privacy";
    let end;
    if (decision.target === "speculative") {
      // Drafts travel as token ids the worker cannot scan or redact: a request with any
      // personal data goes the plain cloud way, redacted.
      const found = req.messages.some((m) => piiKinds(m.content).length > 0);
      const why = found ? "personal data present: the plain cloud path redacts it, speculation could not"
        : !this.edge ? "the on-device model is not loaded"
        : constrained(req) ? "the answer must be JSON or a tool call, and the verifier does not follow a grammar" : null;
      if (why) {
        decision.target = "cloud";
        decision.reasons = [...decision.reasons, `not speculative: ${why}`];
      }
    }
    if (decision.target === "speculative") {
      end = await this.runSpeculative(ctx);
    } else if (decision.target === "cloud") {
      try {
        end = await this.runCloud(ctx, { reasons: decision.reasons });
        // The device was meant to take part and could not: say so, as for any failover.
        if (decision.trace.rule === "edge_unavailable" && this.edgeError) {
          end.meta.degraded = `the on-device model is unavailable (${this.edgeError.code}): ${this.edgeError.message}`;
        }
      } catch (e) {
        if (e.code === "budget_exhausted") this.budgetSpentOn = utcDay();
        if (e.code === "aborted" || ctx.emitted || !this.edge) throw e;
        end = await this.runEdge(ctx, { cascade: false });
        end.meta.degraded = `the cloud failed (${e.code}): ${e.message}`;
        end.meta.reasons = [...decision.reasons, `fell back to the edge: ${e.code}`];
      }
    } else {
      if (!this.edge && this.options.waitForModel === false && this.ready && privateData) await this.ready;
      if (!this.edge) {
        const why = this.edgeError?.message ?? "the on-device model is not loaded";
        if (privateData || !this.cloudUsable()) {
          throw new StraddleError(privateData ? "privacy_no_route" : "edge_unavailable",
            privateData ? `this request must stay on the device (${decision.reasons.join("; ")}), but ${why}` : why);
        }
        end = await this.runCloud(ctx, { reasons: [...decision.reasons, "edge unavailable"] });
        end.meta.degraded = `the edge could not answer: ${why}`;
      } else {
        end = await this.runEdge(ctx, { cascade: Boolean(decision.cascade) && this.cloudUsable() });
      }
    }
    end.ttft_ms = firstAt === null ? null : firstAt - started;
    end.decision = decision;
    const quality = decision.quality?.model_version;
    end.meta.model_versions = [`straddle/${version()}`, routerVersion(), `policy/${decision.trace.policy_version}`,
      ...(quality ? [`quality/${quality}`] : []), ...(end.meta.model_versions ?? [])];
    return end;
  }

  edgeParams(req) {
    const stop = req.stop === undefined || req.stop === null ? [] : typeof req.stop === "string" ? [req.stop] : req.stop;
    return { max_tokens: req.max_tokens ?? DEFAULT_MAX_TOKENS, temperature: req.temperature ?? undefined, top_p: req.top_p ?? undefined, seed: req.seed ?? undefined, stop, ...samplingExtras(req) };
  }

  /** The edge answer, in its turn on the device. */
  runEdge(ctx, options) {
    return this.onEdge(expectedTokens(ctx), (job) => this.runEdgeNow(ctx, options, job));
  }

  /** The edge answer, watched by the cascade when the cloud may take over. */
  async runEdgeNow(ctx, { cascade }, job) {
    const { req, decision, signal } = ctx;
    const gen = this.edge.host.generate(req.messages, this.edgeParams(req));
    const onAbort = () => gen.cancel();
    signal?.addEventListener("abort", onAbort, { once: true });
    const monitor = cascade ? new Cascade(JSON.stringify(decision.cascade)) : null;
    let held = monitor ? [] : null;
    let count = 0;
    let degraded = null;
    const reasons = [...decision.reasons];
    let finished = false;
    try {
      for await (const t of gen.tokens) {
        if (t.type === "look") {
          // After prefill, before any token: the edge model's own state may send it up.
          const up = monitor && this.firstTokenEscalation(decision, t);
          const handed = up && await this.handUp(ctx, decision, up, 0);
          if (handed?.end) return handed.end;
          if (handed) {
            degraded = handed.degraded;
            reasons.push(handed.reason);
          }
          continue;
        }
        count += 1;
        job.done = count;
        if (!held) {
          ctx.emitted = true;
          ctx.emit(t.text);
          continue;
        }
        held.push(t.text);
        const escalateFor = monitor.push(t.text, t.logprob, t.entropy);
        if (escalateFor) {
          const handed = await this.handUp(ctx, decision, escalateFor, count);
          if (handed.end) return handed.end;
          degraded = handed.degraded;
          reasons.push(handed.reason);
        } else if (count < monitor.settles_after) {
          continue;
        }
        ctx.emitted = true;
        ctx.emit(held.join(""));
        held = null;
      }
      if (held?.length) {
        ctx.emitted = true;
        ctx.emit(held.join(""));
      }
      finished = true;
    } catch (e) {
      if (signal?.aborted) throw new StraddleError("aborted", "the request was aborted");
      if (e.code === "aborted") throw e;
      // The device failed (out of memory, device lost): the cloud may still answer.
      if (!ctx.emitted && this.cloudUsable() && decision.trace.rule !== "privacy" && decision.trace.rule !== "offline") {
        const end = await this.runCloud(ctx, { reasons: [...decision.reasons, "edge failed"] });
        end.meta.degraded = `the edge failed (${e.code ?? "edge_failed"}): ${e.message}`;
        return end;
      }
      throw e instanceof StraddleError ? e : new StraddleError("edge_failed", String(e.message ?? e));
    } finally {
      // Escalated, aborted or failed: the device stops working on this answer.
      if (!finished) gen.cancel();
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
    if (c.tokens > 1 && c.decode_ms > 0) {
      // Measured speed replaces the prior; later answers smooth it.
      const speed = c.decode_tokens_per_s;
      this.edge.tokensPerS = this.edge.measured ? 0.7 * this.edge.tokensPerS + 0.3 * speed : speed;
      this.edge.measured = true;
    }
    if (c.prompt_tokens > 0 && c.prefill_ms > 0) {
      const prefill = c.prompt_tokens / (c.prefill_ms / 1000);
      this.edge.prefillTokensPerS = this.edge.prefillTokensPerS ? 0.7 * this.edge.prefillTokensPerS + 0.3 * prefill : prefill;
    }
    return {
      model: this.edge.name ?? "edge",
      finish_reason: c.finish === "cancelled" ? "stop" : c.finish,
      tool_calls: c.tool_calls,
      usage: { prompt_tokens: c.prompt_tokens, completion_tokens: c.tokens, total_tokens: c.prompt_tokens + c.tokens },
      meta: {
        route: "edge", reasons, confidence: Math.exp(c.mean_logprob), degraded,
        cost: { usd: 0, prompt_tokens: c.prompt_tokens, completion_tokens: c.tokens },
        model_versions: [`edge/${this.edge.name ?? "model"}@${this.edge.sha256.slice(0, 12)}`, `backend/${this.edge.backend}`],
        redacted: false, escalated_mid_stream: false, edge_tokens: null,
        edge: { backend: this.edge.backend, prefill_ms: c.prefill_ms, decode_ms: c.decode_ms, grammar_ms: c.grammar_ms,
          decode_tokens_per_s: c.decode_tokens_per_s },
      },
    };
  }

  /**
   * The cascade hands a held edge answer to the cloud (`discarded` edge tokens so far): `{end}`
   * with the cloud's answer, or, when the cloud fails, `{degraded, reason}` and the edge
   * answer stands. The edge keeps generating while the cloud is asked: its tokens are the
   * fallback.
   */
  async handUp(ctx, decision, why, discarded) {
    try {
      const end = await this.runCloud(ctx, { reasons: [...decision.reasons, `cascade: ${why}`], midStream: true });
      end.meta.escalated_mid_stream = true;
      end.meta.edge_tokens = "discarded";
      end.meta.edge_tokens_discarded = discarded;
      return { end };
    } catch (e) {
      if (e.code === "aborted" || ctx.emitted) throw e;
      return {
        degraded: `the cascade asked for the cloud (${why}) but it failed (${e.code}): ${e.message}`,
        reason: `cascade: ${why}; the cloud failed, so the edge answer stands`,
      };
    }
  }

  /**
   * The check after prefill: the quality model, now with the edge model's own state (its
   * first token's confidence and final hidden state), may send the request to the cloud
   * before any edge text is shown.
   */
  firstTokenEscalation(decision, look) {
    const signals = JSON.stringify({ entropy: look.entropy, logprob: look.logprob, margin: look.margin });
    const check = JSON.parse(firstToken(JSON.stringify(decision), signals, look.state ?? undefined));
    if (check.estimate) {
      decision.trace.signals.push({ name: "edge_quality_after_prefill", value: check.estimate.p_edge_ok },
        { name: "quality_inputs_after_prefill", value: check.estimate.inputs },
        { name: "quality_drivers_after_prefill", value: check.estimate.drivers });
    }
    return check.escalate ?? null;
  }

  /**
   * Speculative decoding: the edge drafts, the worker's cloud verifies each draft, and the
   * answer is the cloud's, token for token at temperature 0. A failed verify call leaves the
   * edge to finish alone, marked `degraded`.
   */
  runSpeculative(ctx) {
    return this.onEdge(expectedTokens(ctx), (job) => this.runSpeculativeNow(ctx, job));
  }

  /** Speculation in its turn on the device (see `runSpeculative`). */
  async runSpeculativeNow(ctx, job) {
    const { req, decision, signal } = ctx;
    const token = await resolveToken(this.options.token);
    const gen = this.edge.host.speculate(req.messages, this.edgeParams(req), {
      url: this.worker, token, tokenizerHash: this.edge.tokenizerHash, timeoutMs: this.options.firstByteTimeoutMs,
      handOffBelow: this.policy.speculative_min_acceptance, envelope: this.versions(decision, ctx.id),
    });
    const onAbort = () => gen.cancel();
    signal?.addEventListener("abort", onAbort, { once: true });
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
      signal?.removeEventListener("abort", onAbort);
    }
    const c = await gen.completion;
    if (signal?.aborted) throw new StraddleError("aborted", "the request was aborted");
    if (c.calls > 0 && !degraded) {
      // The measured yield replaces the policy's prior, so the router stops choosing
      // speculation where drafts are seldom accepted.
      const perCall = c.tokens / c.calls;
      const prior = this.policy.speculative_tokens_per_call;
      this.policy.speculative_tokens_per_call = this.speculativeMeasured ? 0.7 * prior + 0.3 * perCall : perCall;
      this.speculativeMeasured = true;
      this.policyJson = JSON.stringify(this.policy);
    }
    // What the worker billed: the prompt once, every draft and each call's pending token as
    // input, one token a call as output.
    const billedIn = c.prompt_tokens + c.drafted + Math.max(0, c.calls - 1);
    let usd = this.cloudCost(billedIn, c.calls);
    const cost = { usd, prompt_tokens: billedIn, completion_tokens: c.calls };
    let reasons = degraded ? [...decision.reasons, "the verifier failed; the edge finished alone"] : decision.reasons;
    let tokens = c.tokens;
    let finish = c.cancelled ? "stop" : c.finish;
    let handOff = null;
    if (c.handed_off) {
      // Drafts kept being rejected: the cloud streams the rest of this same turn, continuing
      // the text shown so far (`continue_final_message`), as plain streaming.
      handOff = await this.continueInCloud(ctx, c.text, (req.max_tokens ?? DEFAULT_MAX_TOKENS) - c.tokens);
      reasons = [...reasons, `speculation handed to plain streaming after ${c.tokens} tokens: draft acceptance ${c.acceptance.toFixed(2)} below ${this.policy.speculative_min_acceptance}`];
      degraded = handOff.degraded;
      tokens += handOff.tokens;
      finish = handOff.finish;
      cost.usd += handOff.cost.usd;
      cost.prompt_tokens += handOff.cost.prompt_tokens;
      cost.completion_tokens += handOff.cost.completion_tokens;
    }
    return {
      model: this.edge.name ?? "edge",
      finish_reason: finish,
      usage: { prompt_tokens: c.prompt_tokens, completion_tokens: tokens, total_tokens: c.prompt_tokens + tokens },
      meta: {
        route: "speculative", reasons, confidence: null, degraded, cost,
        model_versions: [`edge/${this.edge.name ?? "model"}@${this.edge.sha256.slice(0, 12)}`, "cloud/verify"],
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
  async continueInCloud(ctx, shown, maxTokens) {
    const { req, signal } = ctx;
    let sent = "";
    const cont = (text) => ({ ...req, max_tokens: maxTokens, continue_final_message: true,
      messages: [...req.messages, { role: "assistant", content: text }] });
    const tap = { ...ctx, emit: (t) => { sent += t; ctx.emit(t); } };
    try {
      const r = await this.runCloud({ ...tap, req: cont(shown) }, { reasons: [], continuing: true });
      return { tokens: r.usage.completion_tokens, finish: r.finish_reason, cost: r.meta.cost, degraded: null, edgeTokens: 0 };
    } catch (e) {
      if (signal?.aborted) throw e;
      // A failed stream reports no usage: its tokens are estimated at four characters each.
      const left = Math.max(1, maxTokens - Math.ceil(sent.length / 4));
      const gen = this.edge.host.generate(cont(shown + sent).messages, { ...this.edgeParams(req), max_tokens: left, continue_final_message: true });
      let n = 0;
      for await (const t of gen.tokens) {
        n += 1;
        ctx.emit(t.text);
      }
      const done = await gen.completion;
      return { tokens: n, finish: done.finish, cost: { usd: 0, prompt_tokens: 0, completion_tokens: 0 }, edgeTokens: n,
        degraded: `the hand-off to the cloud failed (${e.code ?? "error"}): ${e.message ?? e}; the edge finished the reply` };
    }
  }

  /** The cloud answer through the worker: redacted when asked, re-identified here. */
  async runCloud(ctx, { reasons, midStream = false, continuing = false }) {
    const { req, decision, signal } = ctx;
    if (!this.cloudUsable()) throw new StraddleError("cloud_unavailable", this.worker ? "the cloud is switched off or the network is down" : "no worker is configured");
    // A continued reply's own text came from the cloud (each token verified there): it tells
    // the cloud nothing new, and a name in it taken for personal data and redacted would
    // change what the cloud continues. Only what the user sent is checked.
    const sent = continuing ? req.messages.slice(0, -1) : req.messages;
    const found = [...new Set(sent.flatMap((m) => piiKinds(m.content)))];
    const redaction = this.options.redact && found.length ? redactAll(req.messages.map((m) => m.content), []) : null;
    const parts = redaction?.parts();
    const messages = req.messages.map((m, i) => ({ ...m, content: parts ? parts[i] : m.content }));
    const body = {
      model: this.options.cloudModel ?? "default", messages, stream: true, stream_options: { include_usage: true },
      max_tokens: req.max_tokens ?? DEFAULT_MAX_TOKENS,
      ...(continuing && { continue_final_message: true }),
      ...(req.temperature !== undefined && { temperature: req.temperature }),
      ...(req.top_p !== undefined && { top_p: req.top_p }),
      ...(req.seed !== undefined && { seed: req.seed }),
      ...(req.stop !== undefined && req.stop !== null && { stop: req.stop }),
      ...samplingExtras(req),
      straddle: {
        session: this.session, reasons, ...this.versions(decision, ctx.id),
        privacy: { entities: found, redacted: Boolean(redaction) },
        prompt_tokens_estimate: traceValue(decision, "prompt_tokens_estimate"),
        ...(this.options.feature && { feature: this.options.feature }),
        escalated_mid_stream: midStream,
      },
    };
    const reid = redaction?.stream();
    try {
      const token = await resolveToken(this.options.token);
      const asked = performance.now();
      const { stream } = await escalate({ worker: this.worker, token, body, signal, firstByteTimeoutMs: this.options.firstByteTimeoutMs });
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
          this.cloudTtftMs = this.cloudTtftMs === null ? firstToken : 0.7 * this.cloudTtftMs + 0.3 * firstToken;
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
      usage ??= { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
      const usd = this.cloudCost(usage.prompt_tokens, usage.completion_tokens);
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
    } finally {
      reid?.free();
      redaction?.free();
    }
  }

  /** Records how good an answer was (0–1), kept in IndexedDB across sessions. */
  async feedback(id, reward) {
    if (typeof reward !== "number" || !(reward >= 0 && reward <= 1)) throw invalid("reward", "must be a number in 0..1");
    const answer = this.answers.get(id);
    if (!answer) throw new StraddleError("unknown_answer", `no answer ${id} in this session`);
    const { decision } = answer;
    await this.feedbackStore.put({ id, route: answer.route, reward, task: traceValue(decision, "task") ?? null,
      policy_version: decision.trace.policy_version, ts: Date.now() });
    if (this.learner) {
      this.learner.update(JSON.stringify(answer.decision), answer.route, reward, answer.cost_usd, answer.latency_s);
      await this.feedbackStore.putState(this.learnerKey, this.learner.toJson());
    }
    await this.reportFeedback(id, reward);
  }

  /**
   * Tells the worker the user's reward for answer `id`, so usage by version reports it. Kept
   * locally either way: a worker that cannot be reached loses only the tenant's copy.
   */
  async reportFeedback(id, reward) {
    if (!this.worker || this.options.reportUsage === false) return;
    // An edge answer's record must exist before its rating can find it.
    await this.flushUsage();
    try {
      const token = await resolveToken(this.options.token);
      const resp = await fetch(`${this.worker}/v1/feedback`, {
        method: "POST", body: JSON.stringify({ feedback: [{ id, reward }] }), signal: AbortSignal.timeout(5000),
        headers: { "content-type": "application/json", ...(token && { authorization: `Bearer ${token}` }) },
      });
      if (!resp.ok) console.warn(`straddle: the worker refused the feedback (${resp.status})`);
    } catch (e) {
      console.warn("straddle: the feedback did not reach the worker:", e.message ?? e);
    }
  }

  /** Per-route counts, cost and latency for this session, and the feedback kept so far. */
  async stats() {
    return this.sessionStats.snapshot(await this.feedbackStore.summary());
  }

  /** What the device offers and what was loaded. */
  device() {
    const e = this.edge;
    return e ? { backend: e.backend, model: e.name, sha256: e.sha256, bytes: e.bytes, fromCache: e.fromCache, loadMs: e.ms,
      tokensPerS: e.tokensPerS, gpuError: e.gpuError, threads: e.threads, threadsError: e.threadsError, ...e.device } : { backend: null, error: this.edgeError?.message ?? null };
  }

  /** Frees the model and the worker; the client answers from the cloud afterwards, if allowed. */
  async unload() {
    await this.flushUsage();
    this.edge?.host.unload();
    this.edge = null;
    this.edgeError = new StraddleError("edge_unavailable", "the model was unloaded");
    this.feedbackStore?.close();
    this.learner?.free();
    this.learner = null;
  }
}

export default Straddle;
