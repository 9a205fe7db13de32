// Static server for the demo page and the browser tests: serves the package directory,
// /models/ from the model cache (so no model file ever enters the repo), and
// /demo/config.json (where the worker is, the tenant token, the models the page may load
// with their SHA-256s, and the default one).
// Usage: node scripts/serve.mjs --port 8080 --root <dir> [--models <dir>] [--catalog JSON]
//   [--worker URL] [--token T] [--cloud-label TEXT] [--isolated]
// --catalog is `[{url, title, sha256, bytes}]`, the default first (`cargo xtask demo` passes
// the models `straddle-models` lists; `STRADDLE_MODEL_CATALOG` holds the same for tests).
// --isolated sends COOP/COEP, which makes the page cross-origin isolated: the browser then
// allows shared memory, and the CPU model runs on the threaded build.
import http from "node:http";
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";

/** The models a page may load (`[{url, title, sha256, bytes}]`), from the environment. */
export function catalogFromEnv() {
  return JSON.parse(process.env.STRADDLE_MODEL_CATALOG ?? "[]");
}

/** SHA-256 of a file, streamed. */
export function sha256File(file) {
  return new Promise((resolve, reject) => {
    const h = crypto.createHash("sha256");
    fs.createReadStream(file).on("data", (d) => h.update(d)).on("end", () => resolve(h.digest("hex"))).on("error", reject);
  });
}

const arg = (name, fallback) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : fallback;
};

const TYPES = {
  ".html": "text/html; charset=utf-8", ".js": "text/javascript", ".mjs": "text/javascript",
  ".wasm": "application/wasm", ".json": "application/json", ".css": "text/css",
  ".png": "image/png", ".svg": "image/svg+xml", ".gguf": "application/octet-stream",
  ".ts": "text/plain",
};

/** The headers that make a page cross-origin isolated (shared memory, wasm threads). */
export const ISOLATION_HEADERS = {
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-embedder-policy": "require-corp",
};

/**
 * Creates the server; resolves a request path inside `root` (or `models`) only. Files are
 * served with range requests (`Range: bytes=N-`, `If-Range` on the ETag), so a cut download
 * resumes. For tests: `cut` maps a path to a byte count at which its next whole-file answer
 * is cut off (once, as a dropped connection would), and `onServed(path, bytes)` hears how
 * many body bytes each answer carried.
 */
export function createServer({ root, models, config, files = {}, onRequest, isolated = false, cut = {}, onServed }) {
  let sha = null;
  return http.createServer(async (req, res) => {
    if (isolated) for (const [k, v] of Object.entries(ISOLATION_HEADERS)) res.setHeader(k, v);
    const url = new URL(req.url, "http://localhost");
    let rel = decodeURIComponent(url.pathname);
    onRequest?.(req);
    if (files[rel]) {
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": files[rel].length }).end(files[rel]);
      return;
    }
    if (rel === "/demo/config.json") {
      const catalog = config.models ?? [];
      const c = { model: catalog[0]?.url, ...config };
      c.sha256 ??= catalog.find((m) => m.url === c.model)?.sha256;
      if (!c.sha256 && models && c.model?.startsWith("/models/")) {
        sha ??= sha256File(path.join(models, c.model.slice("/models/".length))).catch(() => null);
        c.sha256 = (await sha) ?? undefined;
      }
      res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" }).end(JSON.stringify(c));
      return;
    }
    let base = root;
    if (models && rel.startsWith("/models/")) {
      base = models;
      rel = rel.slice("/models".length);
    }
    let file = path.normalize(path.join(base, rel));
    if (!file.startsWith(path.resolve(base))) {
      res.writeHead(403).end("forbidden");
      return;
    }
    if (fs.existsSync(file) && fs.statSync(file).isDirectory()) file = path.join(file, "index.html");
    fs.stat(file, (err, st) => {
      if (err || !st.isFile()) {
        res.writeHead(404, { "content-type": "text/plain" }).end("not found");
        return;
      }
      const etag = `"${st.size}-${Math.floor(st.mtimeMs)}"`;
      const [from, to] = range(req, etag, st.size);
      const whole = from === 0 && to === st.size - 1;
      res.writeHead(whole ? 200 : 206, {
        "content-type": TYPES[path.extname(file)] ?? "application/octet-stream",
        "content-length": to + 1 - from,
        "cache-control": "no-cache",
        "accept-ranges": "bytes",
        etag,
        ...(whole ? {} : { "content-range": `bytes ${from}-${to}/${st.size}` }),
      });
      if (req.method === "HEAD") return res.end();
      const cutAt = whole ? cut[url.pathname] : undefined;
      if (cutAt !== undefined) delete cut[url.pathname];
      const body = fs.createReadStream(file, { start: from, end: cutAt === undefined ? to : cutAt - 1 });
      body.on("data", (d) => onServed?.(url.pathname, d.length));
      // A cut answer ends with the connection torn down, short of its content-length.
      if (cutAt !== undefined) body.on("end", () => res.destroy());
      body.pipe(res, { end: cutAt === undefined });
    });
  });
}

/**
 * The bytes a `Range: bytes=N-` or `bytes=N-M` request asks for, as `[first, last]` (the
 * whole file without one): an `If-Range` that names another version, or a range that starts
 * past the end, gets the whole file; one that ends past it, up to the end.
 */
function range(req, etag, size) {
  const all = [0, size - 1];
  const m = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? "");
  const ifRange = req.headers["if-range"];
  if (!m || (ifRange && ifRange !== etag)) return all;
  const from = Number(m[1]);
  const to = m[2] === "" ? size - 1 : Math.min(Number(m[2]), size - 1);
  return from < size && from <= to ? [from, to] : all;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const port = Number(arg("--port", "8080"));
  const root = path.resolve(arg("--root", "."));
  const models = arg("--models") ? path.resolve(arg("--models")) : undefined;
  const config = {};
  if (arg("--worker")) config.worker = arg("--worker");
  if (arg("--token")) config.token = arg("--token");
  if (arg("--cloud-label")) config.cloudLabel = arg("--cloud-label");
  if (arg("--catalog")) config.models = JSON.parse(arg("--catalog"));
  const isolated = process.argv.includes("--isolated");
  createServer({ root, models, config, isolated }).listen(port, "127.0.0.1", () => {
    console.log(`serving ${root} on http://127.0.0.1:${port}/`);
  });
}
