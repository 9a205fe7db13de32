// What a client is set up with before its first request: its options checked, the wasm
// compiled once per page, the routing policy resolved, the bandit's state restored, the
// battery read, and the model loaded on the device (with the cloud asked whether it can
// verify that model's drafts).
import init, { Learner, policyPreset, route as routeWasm } from "../pkg/straddle.js";
import { EdgeHost } from "./edge.js";
import { StraddleError } from "./errors.js";
import { backendFor, checkStorage, modelSize, planMemory } from "./model-checks.js";
import { cloudUsable } from "./routing.js";

/** Tokens of conversation the device's engine holds unless the options say otherwise. */
const DEFAULT_CONTEXT_TOKENS = 1024;
/** Decode speed assumed before the first edge answer measures it, per backend. */
const PRIOR_TOKENS_PER_S = { webgpu: 30, cpu: 10 };
/** Why a page that asked for threads runs the CPU model on one. */
const NOT_ISOLATED = "the page is not cross-origin isolated, so it cannot share memory with workers "
  + "(serve it with Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: require-corp)";

let wasmModule = null;

/** `Straddle.create`'s options with their defaults, refused when they cannot work. */
export function withDefaults(options) {
  // An option given as `undefined` means "the default", as in most JS APIs.
  const given = Object.fromEntries(Object.entries(options ?? {}).filter(([, v]) => v !== undefined));
  const o = { backend: "auto", policy: "balanced", cloud: true, redact: true, cacheModel: true,
    firstByteTimeoutMs: 15_000, waitForModel: true, learn: false, ...given };
  if (!o.model && !o.worker) throw new StraddleError("invalid_options", "give a model, a worker, or both");
  if (!["auto", "webgpu", "cpu"].includes(o.backend)) throw new StraddleError("invalid_options", "backend must be auto, webgpu or cpu");
  o.threads ??= "auto";
  o.contextTokens ??= DEFAULT_CONTEXT_TOKENS;
  if (!(Number.isInteger(o.contextTokens) && o.contextTokens >= 1)) {
    throw new StraddleError("invalid_options", "contextTokens must be a whole number ≥ 1");
  }
  if (o.threads !== "auto" && !(Number.isInteger(o.threads) && o.threads >= 1)) {
    throw new StraddleError("invalid_options", "threads must be \"auto\" or a whole number ≥ 1");
  }
  return o;
}

/** Compiles the wasm once per page; the engine worker instantiates the same module. */
export async function loadWasm(url) {
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

/**
 * The device's battery: `source` (an option, for pages that know better or for tests), else
 * the Battery Status API where the browser has it; `null` where neither reports one, which
 * the router reads as mains power.
 */
export async function readBattery(source) {
  try {
    const read = source ?? globalThis.navigator?.getBattery?.bind(globalThis.navigator);
    const b = read ? await read() : null;
    return b && Number.isFinite(b.level) ? b : null;
  } catch {
    return null;
  }
}

/** The policy document for a preset name or overrides, refused when the router cannot use it. */
function resolvePolicy(policy) {
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

/** Makes `policy` the client's routing policy; speculation's yield is measured afresh under it. */
export function applyPolicy(client, policy) {
  client.policyJson = resolvePolicy(policy);
  client.policy = JSON.parse(client.policyJson);
  client.speculativeMeasured = false;
}

/** The bandit's state for this policy version, from IndexedDB (a fresh one if unusable). */
export async function restoreLearner(client) {
  client.learnerKey = `bandit:${client.policy.version}`;
  const saved = await client.feedbackStore.getState(client.learnerKey).catch(() => undefined);
  try {
    client.learner = new Learner(saved);
  } catch (e) {
    console.warn("straddle: saved routing feedback is unusable, starting afresh:", e.message);
    client.learner = new Learner(undefined);
  }
}

/**
 * Loads the client's model into an engine worker; a model that cannot load leaves the cloud
 * to answer, and fails the client only when there is no cloud either.
 */
export async function loadModel(client, backend = client.options.backend) {
  const o = client.options;
  try {
    const url = new URL(o.model, globalThis.location?.href);
    const useStore = o.cacheModel !== false;
    const size = await modelSize(url, useStore);
    if (useStore) await checkStorage(size);
    // The header says what the model needs; the device's memory may shorten its context.
    const plan = await planMemory(url, size, o.contextTokens, useStore);
    backend = await backendFor(plan, backend);
    // Threads only where the browser allows shared memory; the WebGPU backend needs none.
    const cores = globalThis.navigator?.hardwareConcurrency ?? 1;
    const wanted = backend === "webgpu" ? 1 : o.threads === "auto" ? Math.min(cores, 8) : Math.min(o.threads, cores);
    const isolated = Boolean(globalThis.crossOriginIsolated);
    const host = await EdgeHost.start(client.module, isolated ? wanted : 1);
    const context = plan?.context ?? o.contextTokens;
    const loaded = await host.load({ url, sha256: o.sha256, backend, cache: o.cacheModel, context }, o.onProgress);
    // A device lost between answers: the next request finds the model loaded again.
    host.onFailed = (e) => { if (e.code === "device_lost") reloadEdge(client, host).catch(() => {}); };
    // The worker can only say why its pool failed; a page without isolation never asks it
    // for one, so the reason is ours to give.
    const threadsError = loaded.backend !== "cpu" ? null
      : loaded.threadsError ?? (!isolated && wanted > 1 ? NOT_ISOLATED : null);
    // "auto" on a plain page is the common case, not a mistake worth a warning.
    if (threadsError && (o.threads !== "auto" || loaded.threadsError)) console.warn("straddle: the CPU backend runs on one thread:", threadsError);
    client.edge = { host, ...loaded, threadsError, memory: memoryReport(plan), tokensPerS: PRIOR_TOKENS_PER_S[loaded.backend] ?? 10, measured: false };
    client.edgeError = null;
    await probeVerifier(client);
  } catch (e) {
    client.edgeError = e instanceof StraddleError ? e : new StraddleError("edge_unavailable", String(e.message ?? e));
    // Without the model the cloud may still answer; with neither, say so now.
    if (!cloudUsable(client)) throw client.edgeError;
    console.warn("straddle: the on-device model is unavailable; answers come from the cloud:", client.edgeError.message);
  }
}

/** The plan's bytes as a plain object (the wasm object holds wasm memory until freed). */
function memoryReport(plan) {
  if (!plan) return null;
  const { file, weights, kvCache, scratch, largestBuffer, total } = plan;
  plan.free();
  return { file, weights, kvCache, scratch, largestBuffer, total };
}

/**
 * The model loaded again in a fresh engine worker after its engine failed (a lost GPU device,
 * a crashed worker), on the CPU kernels: a lost GPU may not come back, and the CPU is always
 * there. Every caller waits on the same reload, and a `failed` engine already replaced is not
 * replaced twice; afterwards `client.edge` is the new engine, or null with `client.edgeError`
 * saying why.
 */
export function reloadEdge(client, failed) {
  if (!client.reloading && client.edge?.host !== failed) return Promise.resolve();
  client.reloading ??= (async () => {
    client.edge?.host.unload();
    client.edge = null;
    await loadModel(client, "cpu");
  })().finally(() => { client.reloading = null; });
  return client.reloading;
}

/**
 * Whether the worker's cloud can verify this model's drafts: it says it supports
 * `/v1/verify` and its tokenizer hash is ours. Asked once, after the model loads.
 */
async function probeVerifier(client) {
  client.cloudVerifies = false;
  if (!client.worker || !client.edge || client.options.speculative === false) return;
  try {
    const resp = await fetch(`${client.worker}/v1/models`, { signal: AbortSignal.timeout(5000) });
    const model = resp.ok ? (await resp.json()).data?.[0] : null;
    client.cloudVerifies = Boolean(model?.supports_verify && model.tokenizer_hash === client.edge.tokenizerHash);
  } catch {
    // No answer: no speculation; plain cloud streaming still works.
  }
}
