// Straddle's JS API: an OpenAI-shaped client whose every request is routed between the
// model on this device (in a Web Worker) and the cloud behind the tenant's edge worker.
// This file is the API surface and holds the client's state; the work is done beside it:
// startup.js (what `create` sets up), completion.js (the OpenAI shapes) over answer.js (a
// request run on its route, with failover), which drives edge-run.js, cloud-run.js and
// speculate.js; routing.js (the router's context and decisions), request.js (the request's
// checks), edge-queue.js (one answer at a time on the device), usage.js (reports to the worker).
import { createCompletion } from "./completion.js";
import { StraddleError } from "./errors.js";
import { deleteModel, listModels } from "./model-store.js";
import { invalid, validate } from "./request.js";
import { decide, refreshLoad, refreshRtt, traceValue } from "./routing.js";
import { applyPolicy, loadModel, loadWasm, readBattery, restoreLearner, withDefaults } from "./startup.js";
import { FeedbackStore, SessionStats } from "./stats.js";
import { flushUsage, reportFeedback } from "./usage.js";

export { StraddleError };

/** A hybrid edge–cloud client; make one with `await Straddle.create(options)`. */
export class Straddle {
  /** The models this site keeps (OPFS, or the Cache API): list them, delete one by id. */
  static models = { list: listModels, delete: deleteModel };

  /**
   * Loads the wasm, starts the engine worker and loads the model (progress through
   * `onProgress`), and measures the way to the worker. See index.d.ts for the options.
   */
  static async create(options = {}) {
    const o = withDefaults(options);
    const wasmUrl = o.wasmUrl ?? new URL("../pkg/straddle_bg.wasm", import.meta.url);
    const module = await loadWasm(wasmUrl);
    const s = new Straddle(o, module);
    applyPolicy(s, o.policy);
    s.feedbackStore = await FeedbackStore.open();
    if (o.learn) await restoreLearner(s);
    if (o.worker) {
      refreshRtt(s);
      refreshLoad(s);
    }
    s.battery = await readBattery(o.battery);
    s.ready = o.model ? loadModel(s) : Promise.resolve();
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
    const completions = { create: (req) => createCompletion(this, req) };
    this.chat = { completions };
  }

  /** Switches the routing policy (a preset name or overrides) for the requests that follow. */
  setPolicy(policy) {
    applyPolicy(this, policy);
    // What the bandit learned belongs to the policy it learned under.
    if (this.learner) return restoreLearner(this);
  }

  /** Treat the network as down (a user's "never use the cloud", a demo's offline switch). */
  setOffline(offline) {
    this.offline = Boolean(offline);
  }

  /** Where `request` would run, and why, without running it. */
  route(request) {
    return decide(this, validate(request));
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
    await reportFeedback(this, id, reward);
  }

  /** Per-route counts, cost and latency for this session, and the feedback kept so far. */
  async stats() {
    return this.sessionStats.snapshot(await this.feedbackStore.summary());
  }

  /** What the device offers and what was loaded. */
  device() {
    const e = this.edge;
    return e ? { backend: e.backend, model: e.name, sha256: e.sha256, bytes: e.bytes, fromCache: e.fromCache, resumedFrom: e.resumedFrom, loadMs: e.ms,
      tokensPerS: e.tokensPerS, gpuError: e.gpuError, threads: e.threads, threadsError: e.threadsError, contextTokens: e.contextTokens,
      memory: e.memory, ...e.device } : { backend: null, error: this.edgeError?.message ?? null };
  }

  /** Frees the model and the worker; the client answers from the cloud afterwards, if allowed. */
  async unload() {
    await flushUsage(this);
    this.edge?.host.unload();
    this.edge = null;
    this.edgeError = new StraddleError("edge_unavailable", "the model was unloaded");
    this.feedbackStore?.close();
    this.learner?.free();
    this.learner = null;
  }
}

export default Straddle;
