// What the page checks before it fetches a model: that the device's memory can hold it, and
// that the origin's storage has room for the bytes not yet kept.
import { StraddleError } from "./errors.js";
import { storedBytes } from "./model-store.js";

/** What a model needs beyond its file: the KV cache at the engine's context, the tokenizer
 * and the scratch of one pass (a generous bound for the models the engine runs). */
const MODEL_OVERHEAD_BYTES = 160 << 20;
/** A wasm32 module addresses 4 GiB, and the engine's own code and buffers take some. */
const WASM32_USABLE_BYTES = 4 * 2 ** 30 - (256 << 20);

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
 * Refuses, before any download, a model of `bytes` this device cannot hold: against wasm32's
 * address space and the memory the browser reports (`navigator.deviceMemory`, in GiB, which
 * the model may take at most half of). An unknown size (0) lets the load go on.
 */
export function checkMemory(bytes) {
  if (!bytes) return;
  const need = bytes + MODEL_OVERHEAD_BYTES;
  if (need > WASM32_USABLE_BYTES) {
    throw new StraddleError("insufficient_memory", `the model needs about ${mb(need)}, more than a page's wasm memory holds (${mb(WASM32_USABLE_BYTES)}); pick a smaller model`);
  }
  const deviceGiB = globalThis.navigator?.deviceMemory;
  if (deviceGiB && need > (deviceGiB * 2 ** 30) / 2) {
    throw new StraddleError("insufficient_memory", `the model needs about ${mb(need)}; this device reports ${deviceGiB} GB of memory, and a page should take at most half; pick a smaller model`);
  }
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
