// The Web Worker that hosts the on-device model, so generation never blocks the page.
// Protocol (all messages carry `type`; requests carry `id`):
//   init {module, threads}            -> ready
//   load {id, url, sha256, backend, cache} -> progress* then loaded | error
//   generate {id, messages, params}   -> look, token* then done | error
//   speculate {id, messages, params, verify: {url, token, tokenizerHash, timeoutMs, handOffBelow}}
//                                     -> (token | degraded)* then done | error
//   cancel {id}                       (the reply ends as "cancelled")
//   unload                            (frees the model)
//   fault {fault}                     (an injected fault, for tests: "lose-device" destroys the
//                                     GPU device, "crash" throws out of the worker)
// Unasked, the worker posts `device-lost {reason, message}` when the GPU device under the
// loaded model is lost; the page then loads the model again in a fresh worker.
import init, * as single from "../pkg/straddle.js";
import { StraddleError, toWire } from "./errors.js";
import { openModel } from "./model-download.js";

let engine = null;
// The threaded build (`pkg-threads`, CPU kernels on a pool of Web Workers): started the
// first time the CPU backend is chosen with more than one thread asked for, on a
// cross-origin-isolated page; `pool` settles to {pkg, threads, error} (on failure: the
// single-threaded build, 1 thread, and why).
let threadsWanted = 1;
let pool = null;
const cancelled = new Set();

const post = (m, transfer) => self.postMessage(m, transfer ?? []);

// The GPU devices this worker's engines asked for. A device can be lost at any time (a driver
// reset, the GPU process crashing, the browser reclaiming memory); what runs on it then fails
// or never finishes, so the loss is reported the moment the browser reports it.
const gpuDevices = new Set();
// Whether the loaded model runs on the GPU (kept here: after a loss the engine may not answer).
let engineOnGpu = false;
// Settles with the first loss's `GPUDeviceLostInfo`.
let reportLoss;
const deviceLoss = new Promise((resolve) => { reportLoss = resolve; });
watchGpuDevices();

function watchGpuDevices() {
  const adapter = globalThis.GPUAdapter?.prototype;
  if (!adapter) return;
  const requestDevice = adapter.requestDevice;
  adapter.requestDevice = async function (...args) {
    const device = await requestDevice.apply(this, args);
    gpuDevices.add(device);
    device.lost.then((info) => {
      gpuDevices.delete(device);
      // A device under no loaded GPU model is nobody's loss.
      if (!engineOnGpu) return;
      reportLoss(info);
      post({ type: "device-lost", reason: info.reason, message: info.message || "no reason given" });
    });
    return device;
  };
}
// Between tokens the loop gives the event loop a turn, so a cancel posted by the page is
// seen before the next forward pass. The turn is a message to ourselves, not setTimeout(0):
// browsers clamp nested timers to 4 ms, which added 4 ms to every token (a 25 ms token).
const turn = new MessageChannel();
const turnWaiters = [];
turn.port1.onmessage = () => turnWaiters.shift()?.();
const yieldToEvents = () => new Promise((r) => {
  turnWaiters.push(r);
  turn.port2.postMessage(null);
});

self.onmessage = async ({ data: m }) => {
  try {
    if (m.type === "init") {
      await init({ module_or_path: m.module });
      threadsWanted = m.threads ?? 1;
      post({ type: "ready" });
    } else if (m.type === "load") {
      post({ type: "loaded", id: m.id, ...(await load(m)) });
    } else if (m.type === "generate") {
      await generate(m);
    } else if (m.type === "speculate") {
      await speculate(m);
    } else if (m.type === "cancel") {
      cancelled.add(m.id);
    } else if (m.type === "fault" && m.fault === "lose-device") {
      for (const device of gpuDevices) device.destroy();
    } else if (m.type === "fault" && m.fault === "crash") {
      setTimeout(() => { throw new Error("an injected crash"); });
    } else if (m.type === "unload") {
      freeEngine();
    }
  } catch (e) {
    // A wasm trap (out of memory, a panic) leaves this instance unusable: the page replaces it.
    const trapped = e instanceof WebAssembly.RuntimeError;
    post({ type: "error", id: m.id, error: { ...toWire(await asDeviceLoss(e)), trapped } });
  }
};

/**
 * A failure of the engine on a GPU whose device was lost is that loss: the work fails first
 * (a buffer that cannot be mapped), and the browser reports the loss just after.
 */
async function asDeviceLoss(e) {
  if (!engineOnGpu || toWire(e).code !== "edge_failed") return e;
  const info = await Promise.race([deviceLoss, new Promise((r) => setTimeout(r, 250, null))]);
  return info ? new StraddleError("device_lost", `the GPU device was lost (${info.reason}): ${e.message ?? e}`) : e;
}

/**
 * Instantiates the threaded build and starts its pool: `threads - 1` Web Workers over the
 * same shared memory, each joining the engine's fork-join pool (this worker is the last
 * thread). Resolves to the build's exports, and `joined`, which settles once every worker
 * has joined: the model can be read into the build's memory meanwhile.
 */
async function startPool(threads) {
  if (!self.crossOriginIsolated) {
    throw new Error("threads need a cross-origin-isolated page (Cross-Origin-Opener-Policy: same-origin, Cross-Origin-Embedder-Policy: require-corp)");
  }
  const pkg = await import("../pkg-threads/straddle.js").catch((e) => {
    throw new Error(`the threaded build is not available (${e.message ?? e})`);
  });
  await pkg.default({ module_or_path: new URL("../pkg-threads/straddle_bg.wasm", import.meta.url) });
  const [module, memory] = pkg.poolShared();
  return { pkg, joined: joinPool(pkg, module, memory, threads) };
}

/** Starts `threads - 1` pool workers over the build's module and memory; settles once all joined. */
async function joinPool(pkg, module, memory, threads) {
  await Promise.all(Array.from({ length: threads - 1 }, () => new Promise((resolve, reject) => {
    const w = new Worker(new URL("./pool-worker.js", import.meta.url), { type: "module" });
    w.onmessage = ({ data }) => (data.type === "joining" ? resolve() : reject(new Error(data.error)));
    w.onerror = (e) => reject(new Error(`a pool worker failed to start: ${e.message ?? e}`));
    w.postMessage({ module, memory });
  })));
  // Each worker counts itself in right after saying so.
  for (let waited = 0; pkg.poolThreads() < threads; waited += 5) {
    if (waited > 5000) throw new Error(`only ${pkg.poolThreads()} of ${threads} pool threads started`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Reads the model (the store first), checks its SHA-256, and loads it onto a backend. */
async function load({ id, url, sha256, backend, cache: useCache, context }) {
  const t0 = performance.now();
  const progress = (phase, loaded, total, pace = {}) =>
    post({ type: "progress", id, phase, loaded, total, percent: total ? Math.min(100, (100 * loaded) / total) : null, ...pace });
  // A buffer lives in the memory of the build that loads it.
  const read = (lib) => readModel(lib, { url, sha256, useStore: useCache !== false, progress });
  const device = await single.probeDevice();
  // On a software adapter (SwiftShader, lavapipe) GPU-shaped kernels run on the CPU, and the
  // wasm-SIMD CPU kernels are far faster: "auto" picks them there.
  const wantGpu = backend === "webgpu" || (backend === "auto" && device.webgpu && !device.software);
  if (backend === "webgpu" && !device.webgpu) throw new StraddleError("webgpu_unavailable", "this browser offers no WebGPU adapter");
  const placed = await startEngine(read, { backend, wantGpu, context }, progress);
  progress("ready", placed.got.bytes, placed.got.bytes);
  return loadedReport(placed, device, t0);
}

/**
 * Reads the model (from the store, resuming a cut download, or the network) into a buffer in
 * `lib`'s memory and checks its SHA-256; a copy that fails the check is dropped.
 */
async function readModel(lib, { url, sha256, useStore, progress }) {
  const source = await openModel(url, useStore);
  const { total, kept } = source;
  const buffer = new lib.ModelBuffer(total);
  if (source.verified) buffer.trust(source.verified);
  const pace = downloadPace(total);
  let lastReport = 0;
  try {
    for await (const chunk of source.chunks) {
      buffer.push(chunk);
      if (buffer.received - lastReport > 1 << 20 || buffer.received === total) {
        lastReport = buffer.received;
        if (buffer.received <= kept) progress("cache", buffer.received, total);
        else progress("download", buffer.received, total, pace(buffer.received));
      }
    }
  } catch (e) {
    buffer.free();
    throw e instanceof StraddleError ? e : new StraddleError("model_fetch", `the model download failed: ${e.message ?? e}`);
  }
  if (!source.verified) progress("verify", buffer.received, total);
  const digest = buffer.sha256();
  if (sha256 && digest !== sha256.toLowerCase()) {
    buffer.free();
    await source.discard();
    throw new StraddleError("model_integrity", `the model's SHA-256 is ${digest}, expected ${sha256}; the stored copy was discarded`);
  }
  if (!source.verified && buffer.received === total) await source.keepDigest(digest);
  return { buffer, fromCache: kept === buffer.received, resumedFrom: kept < buffer.received ? kept : null, digest, bytes: total || buffer.received };
}

/**
 * The download's rate and time left at `received` bytes, counted from its first report, so
 * bytes read back from the store never count as the network's.
 */
function downloadPace(total) {
  let start = null;
  return (received) => {
    start ??= { at: performance.now(), bytes: received };
    const seconds = (performance.now() - start.at) / 1000;
    const bytesPerS = seconds > 0 ? (received - start.bytes) / seconds : null;
    const secondsLeft = bytesPerS && total ? Math.max(0, total - received) / bytesPerS : null;
    return { bytesPerS, secondsLeft };
  };
}

/**
 * Reads the model into the build that will run it and starts the engine there, for
 * conversations of `context` tokens: WebGPU when wanted, else (or when WebGPU fails under
 * "auto") the CPU kernels.
 */
async function startEngine(read, { backend, wantGpu, context }, progress) {
  let cpu = wantGpu ? null : await cpuBuild();
  let got = await read(wantGpu ? single : cpu.pkg);
  progress("compile", got.bytes, got.bytes);
  freeEngine();
  let gpuError = null;
  if (wantGpu) {
    try {
      engine = await single.EdgeEngine.loadWebGpu(got.buffer, context);
    } catch (e) {
      if (backend === "webgpu") throw new StraddleError("webgpu_unavailable", String(e.message ?? e));
      gpuError = String(e.message ?? e);
      cpu = await cpuBuild();
      got = await read(cpu.pkg); // loadWebGpu consumed the buffer; the cache has the file now.
    }
  }
  if (!engine) {
    if (!(await poolJoined(cpu))) {
      // The pool failed while the model was read into its build: read it again into the other.
      got.buffer.free();
      cpu = await cpuBuild();
      got = await read(cpu.pkg);
    }
    try {
      engine = cpu.pkg.EdgeEngine.loadCpu(got.buffer, context);
    } catch (e) {
      throw new StraddleError("model_invalid", `the model could not be loaded: ${e.message ?? e}`);
    }
  }
  engineOnGpu = engine.backend() === "webgpu";
  return { got, cpu, gpuError };
}

/** Frees the loaded model; a loss of its device is nobody's after this. */
function freeEngine() {
  engineOnGpu = false;
  engine?.free();
  engine = null;
}

/**
 * The build a CPU model runs on: the threaded one when threads were asked for and it
 * instantiates (its pool joins meanwhile: `joined`, see `poolJoined`), else the single one.
 */
async function cpuBuild() {
  if (threadsWanted <= 1) return { pkg: single, threads: 1, error: null };
  pool ??= startPool(threadsWanted).then(
    ({ pkg, joined }) => ({ pkg, threads: threadsWanted, error: null, joined }),
    (e) => singleBuild(e));
  return pool;
}

/** The single-threaded build, and why the threaded one is not used. */
function singleBuild(e) {
  return { pkg: single, threads: 1, error: String(e.message ?? e) };
}

/** Whether `cpu`'s pool joined; if not, later models run on the single build (`cpuBuild`). */
async function poolJoined(cpu) {
  if (!cpu.joined) return true;
  const failed = await cpu.joined.then(() => null, (e) => e);
  if (!failed) return true;
  pool = Promise.resolve(singleBuild(failed));
  return false;
}

/** What the page is told of a loaded model: the `loaded` reply. */
function loadedReport({ got, cpu, gpuError }, device, t0) {
  return {
    backend: engine.backend(), languages: engine.languages(), name: engine.name() ?? null, tokenizerHash: engine.tokenizerHash(),
    contextTokens: engine.contextTokens(), threads: engine.backend() === "cpu" ? cpu.threads : 1, threadsError: cpu?.error ?? null,
    sha256: got.digest, fromCache: got.fromCache, resumedFrom: got.resumedFrom, bytes: got.bytes, ms: performance.now() - t0,
    gpuError, device: { webgpu: device.webgpu, software: device.software,
      maxStorageBufferBytes: device.max_storage_buffer_bytes, maxInvocationsPerWorkgroup: device.max_invocations_per_workgroup },
  };
}

async function generate({ id, messages, params }) {
  if (!engine) throw new StraddleError("edge_unavailable", "no model is loaded on this device");
  const started = performance.now();
  const gen = await engine.start(JSON.stringify(messages), JSON.stringify(params));
  try {
    // What the model's own state says after prefill, before any token: the router's check,
    // with what the prefill cost (spent for nothing if the check sends the request up).
    const look = gen.look();
    post({ type: "look", id, ...look, prefill_ms: performance.now() - started }, look.state ? [look.state.buffer] : []);
    for (;;) {
      if (cancelled.delete(id)) {
        gen.cancel();
        break;
      }
      const tok = await gen.step();
      if (tok === null) break;
      post({ type: "token", id, text: tok.text, logprob: tok.logprob, entropy: tok.entropy });
      await yieldToEvents();
    }
    const callId = `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
    post({ type: "done", id, completion: JSON.parse(gen.finish(callId)) });
  } finally {
    cancelled.delete(id);
    gen.free();
  }
}

/**
 * Speculative decoding: the model here drafts, the worker's `/v1/verify` checks each draft in
 * one cloud pass, and the shown text is the cloud's own. The cloud keeps the sequence between
 * calls (a session), so each call carries only the new draft. If a call fails, the edge goes on
 * alone from exactly the tokens shown (never repeating or dropping one) and says so.
 */
async function speculate({ id, messages, params, verify }) {
  if (!engine) throw new StraddleError("edge_unavailable", "no model is loaded on this device");
  const spec = await engine.speculate(JSON.stringify(messages), JSON.stringify(params));
  const run = { session: `web-${crypto.randomUUID()}`, started: false, restarts: 0, degraded: null, cancelled: false, handedOff: false };
  try {
    await draftAndVerify(id, spec, params, verify, run);
    const summary = JSON.parse(spec.summary());
    // A reply that ended on this very call was not handed anywhere.
    run.handedOff &&= !summary.finished;
    post({ type: "done", id, completion: { ...summary, degraded: run.degraded, restarts: run.restarts, cancelled: run.cancelled, handed_off: run.handedOff } });
  } finally {
    cancelled.delete(id);
    spec.free();
  }
}

/**
 * The speculation loop: draft, verify, show the settled text; after a failed call the edge
 * steps alone. Ends when the reply does, when it is cancelled, or when it is handed off.
 */
async function draftAndVerify(id, spec, params, verify, run) {
  for (;;) {
    if (cancelled.delete(id)) {
      run.cancelled = true;
      break;
    }
    let text;
    if (!run.degraded) {
      const draft = await spec.draft();
      if (draft === undefined) break;
      try {
        const verdict = await verifyDraft(spec, draft, params, verify, run);
        text = await spec.settle(verdict.accepted, verdict.next_token);
        // Drafts keep being rejected: the page streams the rest from the cloud instead.
        run.handedOff = verify.handOffBelow > 0 && spec.shouldHandOff(verify.handOffBelow);
      } catch (e) {
        run.degraded = `verification failed (${e.code ?? "error"}): ${e.message ?? e}`;
        post({ type: "degraded", id, reason: run.degraded });
        continue;
      }
    } else {
      text = await spec.stepAlone();
      if (text === undefined) break;
      await yieldToEvents();
    }
    if (text) post({ type: "token", id, text });
    if (run.handedOff) break;
  }
}

/** One `/v1/verify` call: the cloud's verdict on a draft (accepted count and its next token). */
async function verifyDraft(spec, draft, params, verify, run) {
  const body = {
    draft_tokens: Array.from(draft), session: run.session, tokenizer_hash: verify.tokenizerHash,
    temperature: params.temperature ?? 0, seed: params.seed ?? 0,
    ...(params.top_p !== undefined && { top_p: params.top_p }),
    // The page's versions and answer id, for the worker's records.
    ...(verify.envelope && { straddle: verify.envelope }),
  };
  if (run.started) body.session_length = spec.prompt().length + spec.tokens().length;
  else body.prefix_tokens = [...spec.prompt(), ...spec.tokens()];
  const resp = await postVerify(verify, body);
  const text = await resp.text();
  if (resp.status === 409 && run.started) {
    // The cloud lost the session (restart, expiry): once more with the whole prefix.
    run.started = false;
    run.restarts += 1;
    return verifyDraft(spec, draft, params, verify, run);
  }
  if (!resp.ok) {
    let error = {};
    try { error = JSON.parse(text).error ?? {}; } catch { /* not JSON */ }
    throw new StraddleError(error.code ?? `http_${resp.status}`, error.message ?? `the verify call answered ${resp.status}`);
  }
  run.started = true;
  return JSON.parse(text);
}

/** Sends a verify request; a network failure or timeout is a typed cloud error. */
async function postVerify(verify, body) {
  try {
    return await fetch(`${verify.url.replace(/\/$/, "")}/v1/verify`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(verify.token && { authorization: `Bearer ${verify.token}` }) },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(verify.timeoutMs ?? 30000),
    });
  } catch (e) {
    throw new StraddleError(e.name === "TimeoutError" ? "cloud_timeout" : "cloud_unreachable", `the verify call failed: ${e.message ?? e}`);
  }
}
