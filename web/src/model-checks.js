// What the page checks before it fetches a model: that the device's memory can hold it (read
// from the model's header, the one part fetched first), that its GPU can bind its buffers,
// and that the origin's storage has room for the bytes not yet kept.
import { planMemory as planWasm, probeDevice } from "../pkg/straddle.js";
import { StraddleError } from "./errors.js";
import { firstBytes, storedBytes, storedHead } from "./model-store.js";

/** A wasm32 module addresses 4 GiB, and the engine's own code and buffers take some. */
const WASM32_USABLE_BYTES = 4 * 2 ** 30 - (256 << 20);
/** Bytes of a model read first for its header, and the most read before it is called broken. */
const HEAD_BYTES = 8 << 20;
const MAX_HEAD_BYTES = 64 << 20;

const mb = (n) => `${Math.round(n / 1e6)} MB`;

/**
 * The model file's size and the bytes of it already stored, without downloading it: a whole
 * stored copy says its size (so a reload asks the network nothing), else a `HEAD` does.
 * `bytes` is 0 when neither says.
 */
export async function modelSize(url, useStore) {
  const kept = useStore ? await storedBytes(url) : { bytes: 0, total: 0 };
  if (kept.total) return { bytes: kept.total, kept: kept.bytes };
  const head = await fetch(url, { method: "HEAD" }).catch(() => null);
  return { bytes: Number(head?.headers.get("content-length")) || 0, kept: kept.bytes };
}

/**
 * What the model at `url` (of `size`, from {@link modelSize}) needs, read from its header
 * before any other byte of it: the plan at the longest context from `wanted` down (halving)
 * that the device's memory holds. Refuses with `insufficient_memory` when even the shortest
 * does not, and with `model_invalid` when the header is not a model's. An unknown size (0)
 * lets the load go on unchecked (null).
 */
export async function planMemory(url, size, wanted, useStore) {
  if (!size.bytes) return null;
  const budget = memoryBudget();
  for (let n = Math.min(HEAD_BYTES, size.bytes); ; n = Math.min(2 * n, size.bytes)) {
    const plan = readPlan(await readHead(url, n, useStore), size.bytes, wanted, budget.bytes);
    if (plan) {
      if (plan.total > budget.bytes) {
        throw new StraddleError("insufficient_memory", `the model needs about ${mb(plan.total)} at ${plan.context} tokens of context `
          + `(file ${mb(plan.file)}, weights ${mb(plan.weights)}, KV cache ${mb(plan.kvCache)}, scratch ${mb(plan.scratch)}); ${budget.why}; pick a smaller model`);
      }
      return plan;
    }
    if (n >= size.bytes || n >= MAX_HEAD_BYTES) throw new StraddleError("model_invalid", `the model's header runs past its first ${mb(n)}`);
  }
}

/**
 * The backend to load a model of `plan` on: where WebGPU may be used but one of the model's
 * buffers is larger than the adapter binds, the CPU kernels, or a refusal when WebGPU was
 * insisted on.
 */
export async function backendFor(plan, backend) {
  if (!plan || backend === "cpu") return backend;
  const device = await probeDevice();
  const binds = Math.min(device.max_storage_buffer_bytes, device.max_buffer_bytes);
  if (!device.webgpu || plan.largestBuffer <= binds) return backend;
  if (backend === "auto") return "cpu";
  throw new StraddleError("insufficient_memory", `the model needs a GPU buffer of ${mb(plan.largestBuffer)} and this adapter binds at most ${mb(binds)}; load with backend: "cpu"`);
}

/** What the page may spend: half the memory the browser reports, within wasm32's 4 GiB. */
function memoryBudget() {
  const deviceGiB = globalThis.navigator?.deviceMemory;
  const half = deviceGiB ? (deviceGiB * 2 ** 30) / 2 : Infinity;
  if (half < WASM32_USABLE_BYTES) return { bytes: half, why: `this device reports ${deviceGiB} GB of memory, and a page should take at most half` };
  return { bytes: WASM32_USABLE_BYTES, why: `a page's wasm memory holds ${mb(WASM32_USABLE_BYTES)}` };
}

/** The plan from a header's bytes; null when they end before the header does. */
function readPlan(head, fileBytes, wanted, budget) {
  try {
    return planWasm(head, fileBytes, wanted, budget) ?? null;
  } catch (e) {
    throw new StraddleError("model_invalid", `the model's header is not one the engine runs: ${e.message ?? e}`);
  }
}

/** The model's first `n` bytes: from the store where it holds them, else a range request. */
async function readHead(url, n, useStore) {
  const stored = useStore ? await storedHead(url, n) : null;
  if (stored) return stored;
  let resp;
  try {
    resp = await fetch(url, { headers: { Range: `bytes=0-${n - 1}` }, cache: "no-store" });
  } catch (e) {
    throw new StraddleError("model_fetch", `could not read the model's header from ${url}: ${e.message}`);
  }
  if (!resp.ok) throw new StraddleError("model_fetch", `could not read the model's header from ${url}: HTTP ${resp.status}`);
  // A server that ignores the range sends the whole file: only the first bytes are read.
  return firstBytes(resp, n);
}

/**
 * Refuses, before any download, a model whose missing bytes (`bytes` less the `kept`) the
 * origin's storage quota has no room for, naming both; then asks the browser to keep the
 * store (`persist`), so a model it downloads is not evicted under storage pressure.
 */
export async function checkStorage({ bytes, kept }) {
  const storage = globalThis.navigator?.storage;
  if (!bytes || !storage?.estimate) return;
  const { quota = 0, usage = 0 } = await storage.estimate();
  const need = bytes - kept;
  const free = Math.max(0, quota - usage);
  if (quota && need > free) {
    throw new StraddleError("storage_quota", `the model needs ${mb(need)} more of storage and this site has ${mb(free)} free (quota ${mb(quota)}, used ${mb(usage)}); free some space, or load with cacheModel: false`);
  }
  await storage.persist?.().catch(() => false);
}
