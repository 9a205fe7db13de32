// Where the page keeps model files. In the Origin Private File System (OPFS) a download is
// written as it arrives, so a dropped connection, a reload or a closed tab resumes it with a
// range request from the bytes already kept; where a browser has no OPFS the Cache API keeps
// whole files. Each stored model is two entries in the `straddle-models` folder: `<id>.gguf`,
// its bytes so far, and `<id>.json`, what they are: `{url, total, complete, validator}`, and
// once a load has hashed the whole file and found it right, its `sha256`: later loads take
// that digest instead of hashing half a gigabyte again, as the native model cache's
// `.verified` files do. The store is the file's only writer, and every write it starts
// rewrites the record without a digest. (Chromium keeps no modification time for these
// files, so unlike the native cache this one cannot also notice an outside change.)
import { StraddleError } from "./errors.js";

/** The Cache API store, by URL, where OPFS is missing. */
const MODEL_CACHE = "straddle-models-v1";
const FOLDER = "straddle-models";

/** The store's OPFS folder, or null where this browser offers none. */
export async function modelFolder() {
  try {
    const root = await globalThis.navigator.storage.getDirectory();
    return await root.getDirectoryHandle(FOLDER, { create: true });
  } catch {
    return null;
  }
}

/** The Cache API store, or null where this browser offers none. */
export async function modelCache() {
  return "caches" in globalThis ? caches.open(MODEL_CACHE).catch(() => null) : null;
}

/** A model's id in the store: the first 32 hex digits of its absolute URL's SHA-256. */
export async function modelId(url) {
  const absolute = String(new URL(url, globalThis.location?.href));
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(absolute));
  return [...new Uint8Array(digest).slice(0, 16)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * What the folder holds of model `id`: its record plus the bytes kept (`stored`) and the
 * digest its record vouches for (`verified`: null unless the file is whole), or null.
 */
export async function describe(folder, id) {
  const record = await folder.getFileHandle(`${id}.json`)
    .then((h) => h.getFile()).then((f) => f.text()).then(JSON.parse).catch(() => null);
  if (!record) return null;
  const stored = await folder.getFileHandle(`${id}.gguf`).then((h) => h.getFile()).then((f) => f.size).catch(() => 0);
  const whole = record.complete && stored === record.total;
  return { id, ...record, stored, verified: whole && record.sha256 ? record.sha256 : null };
}

/** Records that model `id`'s whole file hashes to `sha256`. */
export async function recordDigest(folder, id, { url, total, validator }, sha256) {
  await writeRecord(folder, id, { url, total, complete: true, validator, sha256 });
}

/** Writes model `id`'s record. */
export async function writeRecord(folder, id, record) {
  const writable = await (await folder.getFileHandle(`${id}.json`, { create: true })).createWritable();
  await writable.write(JSON.stringify(record));
  await writable.close();
}

/** Removes model `id`'s bytes and record; whether there was anything to remove. */
export async function removeModel(folder, id) {
  let removed = false;
  for (const name of [`${id}.gguf`, `${id}.json`]) {
    removed = await folder.removeEntry(name).then(() => true, () => false) || removed;
  }
  return removed;
}

/** The bytes of `url` the store already holds (0 when none, or storing is off). */
export async function storedBytes(url) {
  const folder = await modelFolder();
  const kept = folder && await describe(folder, await modelId(url));
  if (kept) return { bytes: kept.stored, total: kept.complete ? kept.total : 0 };
  const cache = await modelCache();
  const whole = await cache?.match(String(url)).catch(() => undefined);
  const bytes = Number(whole?.headers.get("content-length")) || 0;
  return { bytes, total: bytes };
}

/**
 * The first `n` bytes of `url` as the store holds them, or null when it holds fewer (or its
 * file is busy: another tab is writing it).
 */
export async function storedHead(url, n) {
  const folder = await modelFolder();
  if (folder) {
    const id = await modelId(url);
    const kept = await describe(folder, id);
    if (!kept || kept.stored < n) return null;
    const file = await folder.getFileHandle(`${id}.gguf`).then((h) => h.getFile()).catch(() => null);
    return file && new Uint8Array(await file.slice(0, n).arrayBuffer());
  }
  const cache = await modelCache();
  const whole = await cache?.match(String(url)).catch(() => undefined);
  return whole ? firstBytes(whole, n) : null;
}

/** The first `n` bytes of a response's body (all of it, if shorter); the rest is never read. */
export async function firstBytes(resp, n) {
  const out = new Uint8Array(n);
  let filled = 0;
  const reader = resp.body.getReader();
  try {
    while (filled < n) {
      const { done, value } = await reader.read();
      if (done) break;
      const take = Math.min(value.length, n - filled);
      out.set(value.subarray(0, take), filled);
      filled += take;
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
  return out.subarray(0, filled);
}

/**
 * The stored models: `{id, url, bytes, total, complete}` each, `bytes` being what is kept (a
 * cut download keeps part of its `total`).
 */
export async function listModels() {
  const folder = await modelFolder();
  const out = [];
  if (folder) {
    for await (const name of folder.keys()) {
      if (!name.endsWith(".json")) continue;
      const m = await describe(folder, name.slice(0, -".json".length));
      if (m) out.push({ id: m.id, url: m.url, bytes: m.stored, total: m.total, complete: m.complete, sha256: m.verified });
    }
  }
  const cache = await modelCache();
  for (const req of (await cache?.keys()) ?? []) {
    const bytes = Number((await cache.match(req))?.headers.get("content-length")) || 0;
    out.push({ id: await modelId(req.url), url: req.url, bytes, total: bytes, complete: true, sha256: null });
  }
  return out;
}

/** Deletes a stored model by id; `model_not_found` when the store holds none with that id. */
export async function deleteModel(id) {
  const folder = await modelFolder();
  let removed = folder ? await removeModel(folder, id) : false;
  const cache = await modelCache();
  for (const req of (await cache?.keys()) ?? []) {
    if (await modelId(req.url) === id) removed = await cache.delete(req) || removed;
  }
  if (!removed) throw new StraddleError("model_not_found", `no stored model has the id ${id}`);
}
