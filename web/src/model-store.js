// Where the page keeps model files (the Cache API), and what it checks before fetching one.
import { StraddleError } from "./errors.js";

/** The Cache API store the engine's worker keeps model files in, by URL. */
export const MODEL_CACHE = "straddle-models-v1";

/** What a model needs beyond its file: the KV cache at the engine's context, the tokenizer
 * and the scratch of one pass (a generous bound for the models the engine runs). */
const MODEL_OVERHEAD_BYTES = 160 << 20;
/** A wasm32 module addresses 4 GiB, and the engine's own code and buffers take some. */
const WASM32_USABLE_BYTES = 4 * 2 ** 30 - (256 << 20);

/**
 * The model file's size without downloading it: the stored copy's, when `useCache` and the
 * Cache API holds one (so a reload asks the network nothing), else a `HEAD`'s. 0 when
 * neither says.
 */
async function modelBytes(url, useCache) {
  const store = useCache && "caches" in globalThis ? await caches.open(MODEL_CACHE).catch(() => null) : null;
  const stored = await store?.match(url).catch(() => undefined);
  const head = stored ?? (await fetch(url, { method: "HEAD" }).catch(() => null));
  return Number(head?.headers.get("content-length")) || 0;
}

/**
 * Refuses, before any download, a model this device cannot hold: its size against wasm32's
 * address space and the memory the browser reports (`navigator.deviceMemory`, in GiB, which
 * the model may take at most half of). A server that answers no size lets the load go on.
 */
export async function checkMemory(url, useCache) {
  const bytes = await modelBytes(url, useCache);
  if (!bytes) return;
  const need = bytes + MODEL_OVERHEAD_BYTES;
  const mb = (n) => `${Math.round(n / 1e6)} MB`;
  if (need > WASM32_USABLE_BYTES) {
    throw new StraddleError("insufficient_memory", `the model needs about ${mb(need)}, more than a page's wasm memory holds (${mb(WASM32_USABLE_BYTES)}); pick a smaller model`);
  }
  const deviceGiB = globalThis.navigator?.deviceMemory;
  if (deviceGiB && need > (deviceGiB * 2 ** 30) / 2) {
    throw new StraddleError("insufficient_memory", `the model needs about ${mb(need)}; this device reports ${deviceGiB} GB of memory, and a page should take at most half; pick a smaller model`);
  }
}
