// The page's side of the engine Web Worker: requests with ids, replies as promises, and
// each generation as an async stream of tokens.
import { StraddleError, fromWire } from "./errors.js";

export class EdgeHost {
  /**
   * Starts the worker and hands it the compiled wasm module (compiled once, by the page);
   * with `threads` > 1 a CPU model runs on the threaded build (see engine-worker.js).
   */
  static async start(module, threads = 1) {
    const worker = new Worker(new URL("./engine-worker.js", import.meta.url), { type: "module" });
    const host = new EdgeHost(worker);
    await new Promise((resolve, reject) => {
      // Beside the host's own handler, which must outlive the start.
      const failed = (e) => reject(new StraddleError("edge_unavailable", `the engine worker failed to start: ${e.message ?? e}`));
      worker.addEventListener("error", failed, { once: true });
      host.onReady = () => {
        worker.removeEventListener("error", failed);
        resolve();
      };
      worker.postMessage({ type: "init", module, threads });
    });
    return host;
  }

  constructor(worker) {
    this.worker = worker;
    this.nextId = 1;
    this.pending = new Map();
    this.crashed = null;
    worker.onmessage = ({ data: m }) => this.dispatch(m);
    // A worker that dies (out of memory) fails everything in flight.
    worker.onerror = (e) => {
      e.preventDefault?.();
      this.fail(new StraddleError("edge_failed", `the engine worker crashed: ${e.message ?? "unknown error"}`));
    };
  }

  /** The engine is gone: everything in flight and everything after fails with `error`. */
  fail(error) {
    this.crashed = error;
    for (const p of this.pending.values()) p.fail(error);
    this.pending.clear();
    this.onFailed?.(error);
  }

  dispatch(m) {
    if (m.type === "ready") return this.onReady?.();
    // What ran on the lost GPU may never finish: it fails now, not when (or if) it returns.
    if (m.type === "device-lost") return this.fail(new StraddleError("device_lost", `the GPU device was lost (${m.reason}): ${m.message}`));
    // A trap (out of memory, an abort in the engine) leaves the wasm instance unusable.
    if (m.type === "error" && m.error.trapped) return this.fail(fromWire(m.error));
    const p = this.pending.get(m.id);
    if (!p) return;
    if (m.type === "error") {
      this.pending.delete(m.id);
      p.fail(fromWire(m.error));
    } else if (m.type === "loaded" || m.type === "done") {
      this.pending.delete(m.id);
      p.finish(m);
    } else {
      p.event(m);
    }
  }

  /**
   * Loads the model for conversations of up to `context` tokens; `onProgress` sees
   * `{phase, loaded, total, percent}`.
   */
  load({ url, sha256, backend = "auto", cache = true, context }, onProgress) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, {
        // The worker's progress as it reports it, less the message's own fields.
        event: ({ type, id, ...progress }) => onProgress?.(progress),
        finish: (m) => resolve(m),
        fail: reject,
      });
      this.worker.postMessage({ type: "load", id, url: String(url), sha256, backend, cache, context });
    });
  }

  /**
   * Starts a reply: returns `{tokens, completion, cancel}` where `tokens` is an async
   * iterator of `{text, logprob, entropy}` and `completion` resolves when the worker is done.
   */
  generate(messages, params) {
    return this.stream({ type: "generate", messages, params });
  }

  /**
   * Starts a speculative reply (this model drafts, `verify.url`'s `/v1/verify` checks): the
   * same shape as `generate`, its stream also carrying `{type: "degraded", reason}` when the
   * verifier failed and the edge went on alone.
   */
  speculate(messages, params, verify) {
    return this.stream({ type: "speculate", messages, params, verify });
  }

  stream(request) {
    if (this.crashed) throw this.crashed;
    const id = this.nextId++;
    const queue = [];
    let wake = null;
    let ended = false;
    let failure = null;
    let resolveDone, rejectDone;
    const completion = new Promise((res, rej) => { resolveDone = res; rejectDone = rej; });
    completion.catch(() => {}); // observed through `tokens` as well
    const notify = () => { wake?.(); wake = null; };
    this.pending.set(id, {
      event: (m) => { queue.push(m); notify(); },
      finish: (m) => { ended = true; resolveDone(m.completion); notify(); },
      fail: (e) => { ended = true; failure = e; rejectDone(e); notify(); },
    });
    this.worker.postMessage({ ...request, id });
    const tokens = {
      [Symbol.asyncIterator]() { return this; },
      async next() {
        for (;;) {
          if (queue.length) return { value: queue.shift(), done: false };
          if (failure) throw failure;
          if (ended) return { value: undefined, done: true };
          await new Promise((r) => { wake = r; });
        }
      },
      async return() { return { value: undefined, done: true }; },
    };
    return { tokens, completion, cancel: () => this.worker.postMessage({ type: "cancel", id }) };
  }

  /**
   * Injects a fault, for tests: `"lose-device"` destroys the GPU device under the model,
   * `"crash"` throws an uncaught error out of the worker.
   */
  injectFault(fault) {
    this.worker.postMessage({ type: "fault", fault });
  }

  unload() {
    this.worker.postMessage({ type: "unload" });
    this.worker.terminate();
    const gone = new StraddleError("edge_unavailable", "the model was unloaded");
    for (const p of this.pending.values()) p.fail(gone);
    this.pending.clear();
  }
}
