// The worker as `wrangler deploy` would ship it: the real wrangler.toml, its build command
// and bindings, bundled by wrangler itself with `--dry-run` (nothing is uploaded, and no
// account is needed).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const workerDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
// The Workers free plan's limit on a compressed script; the paid plan allows 10 MiB.
const FREE_PLAN_GZIP_KIB = 3 * 1024;

test("wrangler deploy --dry-run builds and bundles the worker with both Durable Objects", () => {
  const outdir = fs.mkdtempSync(path.join(os.tmpdir(), "straddle-deploy-"));
  try {
    const run = spawnSync("npx", ["wrangler", "deploy", "--dry-run", "--outdir", outdir], {
      cwd: workerDir,
      env: { ...process.env, WRANGLER_SEND_METRICS: "false" },
      encoding: "utf8",
      timeout: 10 * 60 * 1000,
    });
    const output = `${run.stdout}\n${run.stderr}`;
    assert.equal(run.status, 0, output);
    assert.match(output, /env\.BUDGET \(TenantBudget\)\s+Durable Object/);
    assert.match(output, /env\.ORIGINS \(OriginRegistry\)\s+Durable Object/);
    assert.match(output, /env\.HEALTH \(UpstreamHealth\)\s+Durable Object/);
    const gzip = output.match(/Total Upload: [\d.]+ KiB \/ gzip: ([\d.]+) KiB/);
    assert.ok(gzip, output);
    assert.ok(Number(gzip[1]) < FREE_PLAN_GZIP_KIB, `gzip ${gzip[1]} KiB`);
    const files = fs.readdirSync(outdir);
    assert.ok(files.some((f) => f.endsWith(".wasm")), files.join(", "));
    // The classes the bindings name are the module's exports, beside the fetch handler.
    const shim = fs.readFileSync(path.join(outdir, "shim.js"), "utf8");
    const exports = shim.match(/export \{([^}]*)\}/)?.[1] ?? "";
    for (const name of ["TenantBudget", "OriginRegistry", "UpstreamHealth", "default"]) {
      assert.match(exports, new RegExp(`\\bas ${name}\\b`), `${name} is exported`);
    }
  } finally {
    fs.rmSync(outdir, { recursive: true, force: true });
  }
});
