// The engine worker's model bytes, as a source of chunks: from the OPFS store, where a cut
// download resumes with a range request and what arrives is written as it comes; from the
// Cache API where OPFS is missing; straight from the network when storing is off.
import { StraddleError } from "./errors.js";
import { describe, modelCache, modelFolder, modelId, recordDigest, removeModel, writeRecord } from "./model-store.js";

/** Bytes read from the store at a time, and written between flushes. */
const PIECE = 8 << 20;

/** What a source the OPFS store does not keep says of digests: none vouched for, none kept. */
const UNRECORDED = { verified: null, keepDigest: async () => {} };

/**
 * The model at `url` as `{total, kept, chunks, discard, verified, keepDigest}`: its size (0 if
 * unknown), the bytes that come from the store, an async iterable of its bytes in order, a
 * function that drops the stored copy (after a failed integrity check), the SHA-256 the store
 * vouches for (null when the bytes must be hashed), and a function that records a digest
 * once the whole file has been hashed and checked.
 */
export async function openModel(url, useStore) {
  if (useStore) {
    const folder = await modelFolder();
    // Another tab writing the same model holds its file: this one downloads without storing.
    const stored = folder && await opfsModel(url, folder).catch((e) => {
      if (e.name === "NoModificationAllowedError") return null;
      throw e;
    });
    if (stored) return stored;
    const cache = folder ? null : await modelCache();
    if (cache) return cachedModel(url, cache);
  }
  return networkModel(await download(url));
}

/** `url` fetched with `headers`, as a typed failure when it cannot be. */
async function download(url, headers = {}) {
  let resp;
  try {
    resp = await fetch(url, { headers });
  } catch (e) {
    throw new StraddleError("model_fetch", `could not download the model from ${url}: ${e.message}`);
  }
  if (!resp.ok) throw new StraddleError("model_fetch", `could not download the model from ${url}: HTTP ${resp.status}`);
  return resp;
}

/** The model in OPFS: what is kept, then (unless it is whole) the rest from the network. */
async function opfsModel(url, folder) {
  const id = await modelId(url);
  const record = await describe(folder, id);
  const handle = await (await folder.getFileHandle(`${id}.gguf`, { create: true })).createSyncAccessHandle();
  const discard = async () => {
    handle.close();
    await removeModel(folder, id);
  };
  try {
    let kept = record ? handle.getSize() : 0;
    if (record?.complete && kept === record.total) {
      const keepDigest = (sha256) => recordDigest(folder, id, record, sha256);
      return { total: kept, kept, chunks: storedThenFetched(handle, kept, null), discard, verified: record.verified, keepDigest };
    }
    const resp = await download(url, kept > 0 ? resumeHeaders(kept, record) : {});
    const resumed = kept > 0 && resp.status === 206;
    if (!resumed) {
      handle.truncate(0);
      kept = 0;
    }
    const total = resumed ? Number(resp.headers.get("content-range")?.split("/")[1]) || 0
      : Number(resp.headers.get("content-length")) || 0;
    const validator = resumed ? record.validator : resp.headers.get("etag") ?? resp.headers.get("last-modified");
    const fields = { url: String(url), total, validator };
    const write = (complete) => writeRecord(folder, id, { ...fields, complete });
    await write(false);
    const keepDigest = (sha256) => recordDigest(folder, id, fields, sha256);
    const chunks = storedThenFetched(handle, kept, { resp, total, done: () => write(true) });
    return { total, kept, chunks, discard, verified: null, keepDigest };
  } catch (e) {
    handle.close();
    throw e;
  }
}

/** A range request for the bytes after `kept`, valid only for the version they came from. */
function resumeHeaders(kept, record) {
  return { range: `bytes=${kept}-`, ...(record?.validator ? { "if-range": record.validator } : {}) };
}

/**
 * Yields the first `kept` bytes of the file behind `handle`, then (with `fetched`) the
 * response's body, writing each piece after them and marking the file whole at the end.
 * The handle is closed however the reading ends.
 */
async function* storedThenFetched(handle, kept, fetched) {
  try {
    for (let at = 0; at < kept; at += PIECE) {
      const piece = new Uint8Array(Math.min(PIECE, kept - at));
      handle.read(piece, { at });
      yield piece;
    }
    if (!fetched) return;
    let at = kept;
    let flushedAt = at;
    for await (const chunk of bodyChunks(fetched.resp)) {
      handle.write(chunk, { at });
      at += chunk.length;
      if (at - flushedAt >= PIECE) {
        handle.flush();
        flushedAt = at;
      }
      yield chunk;
    }
    handle.flush();
    if (fetched.total && at !== fetched.total) {
      throw new StraddleError("model_fetch", `the model download ended at ${at} of ${fetched.total} bytes`);
    }
    await fetched.done();
  } finally {
    handle.close();
  }
}

/** The model from the Cache API, or downloaded and put there as it is read. */
async function cachedModel(url, cache) {
  const hit = await cache.match(url);
  const resp = hit ?? await download(url);
  // The copy for the cache streams alongside the one read; neither is held whole in JS.
  const stored = hit ? Promise.resolve() : cache.put(url, resp.clone()).catch((e) => console.warn("straddle: model not cached:", e));
  const total = Number(resp.headers.get("content-length")) || 0;
  async function* chunks() {
    yield* bodyChunks(resp);
    await stored;
  }
  return { total, kept: hit ? total : 0, chunks: chunks(), discard: () => cache.delete(url), ...UNRECORDED };
}

/** The model straight from the network, kept nowhere. */
function networkModel(resp) {
  const total = Number(resp.headers.get("content-length")) || 0;
  return { total, kept: 0, chunks: bodyChunks(resp), discard: async () => {}, ...UNRECORDED };
}

/** A response body's chunks; a connection lost midway is a typed failure. */
async function* bodyChunks(resp) {
  const reader = resp.body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      yield value;
    }
  } catch (e) {
    throw new StraddleError("model_fetch", `the model download failed: ${e.message ?? e}`);
  } finally {
    reader.releaseLock();
  }
}
