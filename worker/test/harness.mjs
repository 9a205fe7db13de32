// Starts the built worker (build/worker) under local workerd through Miniflare, with the
// tenant budget Durable Object on SQLite, and mints tenant tokens the way a tenant's backend
// would (HS256 with node:crypto: an implementation independent of the worker's).
import path from "node:path";
import net from "node:net";
import crypto from "node:crypto";
import { fileURLToPath } from "node:url";
import { spawn } from "node:child_process";
import { Miniflare } from "miniflare";

const here = path.dirname(fileURLToPath(import.meta.url));
export const buildDir = path.resolve(here, "../build/worker");

export const TENANT = "acme";
export const SECRET = "acme-test-secret";
export const ADMIN_KEY = "admin-test-key";
export const ORIGIN = "https://app.acme.test";

/**
 * A Miniflare instance running the real worker build, with `bindings` as vars and `options`
 * added to Miniflare's (`durableObjectsPersist` to keep state across a restart).
 */
export async function startWorker(bindings = {}, options = {}) {
  const mf = new Miniflare({
    modules: true,
    scriptPath: path.join(buildDir, "shim.mjs"),
    // Module names are paths under this root, whatever directory the tests run from.
    modulesRoot: path.dirname(buildDir),
    modulesRules: [
      { type: "ESModule", include: ["**/*.js", "**/*.mjs"] },
      { type: "CompiledWasm", include: ["**/*.wasm"] },
    ],
    compatibilityDate: "2026-05-01",
    durableObjects: {
      BUDGET: { className: "TenantBudget", useSQLite: true },
      ORIGINS: { className: "OriginRegistry", useSQLite: true },
      HEALTH: { className: "UpstreamHealth", useSQLite: true },
    },
    bindings: { TENANT_SECRET_ACME: SECRET, ADMIN_KEY, ALLOWED_ORIGINS: ORIGIN, ...bindings },
    cf: false,
    ...options,
  });
  const url = await mf.ready;
  return { mf, url: url.toString().replace(/\/$/, "") };
}

/**
 * `false` when every named variable is set (`cargo xtask test` sets them all), else why the
 * tests that need them skip; under CI a missing one fails the run instead of skipping.
 */
export function needsEnv(...names) {
  const missing = names.filter((n) => !process.env[n]);
  if (!missing.length) return false;
  const why = `set ${missing.join(", ")} (cargo xtask test does)`;
  // Under CI nothing may be skipped: a missing model or tool is a failure.
  if (process.env.CI === "true" || process.env.CI === "1") throw new Error(`CI=true: ${why}`);
  return why;
}

const b64url = (x) => Buffer.from(x).toString("base64url");

/** An HS256 tenant token; `claims` override the defaults. */
export function mintToken(claims = {}, secret = SECRET) {
  const now = Math.floor(Date.now() / 1000);
  const body = { ten: TENANT, sub: "user-1", sid: "s1", aud: "straddle", exp: now + 600, nbf: now - 5, origin: ORIGIN, ...claims };
  const input = `${b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }))}.${b64url(JSON.stringify(body))}`;
  const sig = crypto.createHmac("sha256", secret).update(input).digest("base64url");
  return `${input}.${sig}`;
}

/** POST /v1/chat/completions as a browser of the tenant would. */
export function chat(url, body, { token = mintToken(), origin = ORIGIN } = {}) {
  const headers = { "content-type": "application/json" };
  if (token) headers.authorization = `Bearer ${token}`;
  if (origin) headers.origin = origin;
  return fetch(`${url}/v1/chat/completions`, {
    method: "POST", headers, body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

/** An admin call. */
export function admin(url, method, route, body, key = ADMIN_KEY) {
  return fetch(`${url}${route}`, {
    method,
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

export const freePort = () => new Promise((resolve) => {
  const s = net.createServer().listen(0, "127.0.0.1", () => { const { port } = s.address(); s.close(() => resolve(port)); });
});

/** The real cloud server on a free port of 127.0.0.1, once it answers /health. */
export async function startCloud(bin, model, args = []) {
  const port = await freePort();
  const proc = spawn(bin, ["--model", model, "--listen", `127.0.0.1:${port}`, ...args], { stdio: "ignore" });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60_000;
  for (;;) {
    try { if ((await fetch(`${url}/health`)).ok) break; } catch { /* not up yet */ }
    if (Date.now() > deadline) {
      proc.kill();
      throw new Error("cloud server did not start");
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  // SIGTERM (the default) lets the server finish the answers it holds; SIGKILL does not wait.
  return { url, kill: (signal) => proc.kill(signal) };
}

/**
 * llama.cpp's own `llama-server` on a free port of 127.0.0.1, serving `model` with
 * continuous batching over `slots` slots, once it answers /health (it says 503 while loading).
 */
export async function startLlamaServer(bin, model, { slots = 2, ctxPerSlot = 2048 } = {}) {
  const port = await freePort();
  const proc = spawn(bin, [
    "-m", model, "--host", "127.0.0.1", "--port", String(port), "-t", "2",
    "-np", String(slots), "-cb", "-c", String(slots * ctxPerSlot), "-a", "smollm2",
  ], { stdio: "ignore" });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60_000;
  for (;;) {
    try { if ((await fetch(`${url}/health`)).ok) break; } catch { /* not up yet */ }
    if (Date.now() > deadline || proc.exitCode !== null) {
      proc.kill();
      throw new Error("llama-server did not start");
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  return { url, proc, kill: () => proc.kill() };
}
