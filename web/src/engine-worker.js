// The Web Worker that hosts the on-device model, so generation never blocks the page.
// Protocol (all messages carry `type`; requests carry `id`):
//   init {module}                     -> ready
//   load {id, url, sha256, backend, cache} -> progress* then loaded | error
//   generate {id, messages, params}   -> token* then done | error
//   cancel {id}                       (the reply ends as "cancelled")
//   unload                            (frees the model)
import init, { EdgeEngine, ModelBuffer, probeDevice } from "../pkg/straddle.js";
import { StraddleError, toWire } from "./errors.js";

const CACHE = "straddle-models-v1";
let engine = null;
const cancelled = new Set();

const post = (m, transfer) => self.postMessage(m, transfer ?? []);
// Between tokens the loop gives the event loop a turn, so a cancel posted by the page is
// seen before the next forward pass.
const yieldToEvents = () => new Promise((r) => setTimeout(r, 0));

self.onmessage = async ({ data: m }) => {
  try {
    if (m.type === "init") {
      await init({ module_or_path: m.module });
      post({ type: "ready" });
    } else if (m.type === "load") {
      post({ type: "loaded", id: m.id, ...(await load(m)) });
    } else if (m.type === "generate") {
      await generate(m);
    } else if (m.type === "cancel") {
      cancelled.add(m.id);
    } else if (m.type === "unload") {
      engine?.free();
      engine = null;
    }
  } catch (e) {
    post({ type: "error", id: m.id, error: toWire(e) });
  }
};

/** Reads the model (Cache API first), checks its SHA-256, and loads it onto a backend. */
async function load({ id, url, sha256, backend, cache: useCache }) {
  const t0 = performance.now();
  const progress = (phase, loaded, total) =>
    post({ type: "progress", id, phase, loaded, total, percent: total ? Math.min(100, (100 * loaded) / total) : null });
  const store = useCache && "caches" in self ? await caches.open(CACHE).catch(() => null) : null;
  const read = async () => {
    let resp = store ? await store.match(url) : undefined;
    const fromCache = !!resp;
    let stored = Promise.resolve();
    if (!resp) {
      try {
        resp = await fetch(url);
      } catch (e) {
        throw new StraddleError("model_fetch", `could not download the model from ${url}: ${e.message}`);
      }
      if (!resp.ok) throw new StraddleError("model_fetch", `could not download the model from ${url}: HTTP ${resp.status}`);
      // The copy for the cache streams alongside the one read below; neither is held whole in JS.
      if (store) stored = store.put(url, resp.clone()).catch((e) => console.warn("straddle: model not cached:", e));
    }
    const total = Number(resp.headers.get("content-length")) || 0;
    const buffer = new ModelBuffer(total);
    const reader = resp.body.getReader();
    let lastReport = 0;
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        buffer.push(value);
        if (buffer.received - lastReport > 1 << 20 || buffer.received === total) {
          lastReport = buffer.received;
          progress(fromCache ? "cache" : "download", buffer.received, total);
        }
      }
    } catch (e) {
      buffer.free();
      throw e instanceof StraddleError ? e : new StraddleError("model_fetch", `the model download failed: ${e.message ?? e}`);
    }
    await stored;
    progress("verify", buffer.received, total);
    const digest = buffer.sha256();
    if (sha256 && digest !== sha256.toLowerCase()) {
      buffer.free();
      if (store) await store.delete(url);
      throw new StraddleError("model_integrity", `the model's SHA-256 is ${digest}, expected ${sha256}; the cached copy was discarded`);
    }
    return { buffer, fromCache, digest, bytes: total || buffer.received };
  };

  let got = await read();
  const device = await probeDevice();
  // On a software adapter (SwiftShader, lavapipe) GPU-shaped kernels run on the CPU, and the
  // wasm-SIMD CPU kernels are far faster: "auto" picks them there.
  const wantGpu = backend === "webgpu" || (backend === "auto" && device.webgpu && !device.software);
  if (backend === "webgpu" && !device.webgpu) throw new StraddleError("webgpu_unavailable", "this browser offers no WebGPU adapter");
  progress("compile", got.bytes, got.bytes);
  engine?.free();
  engine = null;
  let gpuError = null;
  if (wantGpu) {
    try {
      engine = await EdgeEngine.loadWebGpu(got.buffer);
    } catch (e) {
      if (backend === "webgpu") throw new StraddleError("webgpu_unavailable", String(e.message ?? e));
      gpuError = String(e.message ?? e);
      got = await read(); // loadWebGpu consumed the buffer; the cache has the file now.
    }
  }
  if (!engine) {
    try {
      engine = EdgeEngine.loadCpu(got.buffer);
    } catch (e) {
      throw new StraddleError("model_invalid", `the model could not be loaded: ${e.message ?? e}`);
    }
  }
  progress("ready", got.bytes, got.bytes);
  return {
    backend: engine.backend(), languages: engine.languages(), name: engine.name() ?? null,
    sha256: got.digest, fromCache: got.fromCache, bytes: got.bytes, ms: performance.now() - t0,
    gpuError, device: { webgpu: device.webgpu, software: device.software,
      maxStorageBufferBytes: device.max_storage_buffer_bytes, maxInvocationsPerWorkgroup: device.max_invocations_per_workgroup },
  };
}

async function generate({ id, messages, params }) {
  if (!engine) throw new StraddleError("edge_unavailable", "no model is loaded on this device");
  const gen = await engine.start(JSON.stringify(messages), JSON.stringify(params));
  try {
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
    post({ type: "done", id, completion: JSON.parse(gen.finish()) });
  } finally {
    cancelled.delete(id);
    gen.free();
  }
}
