// Starts the built worker (build/worker) under local workerd through Miniflare.
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Miniflare } from "miniflare";

const here = path.dirname(fileURLToPath(import.meta.url));
export const buildDir = path.resolve(here, "../build/worker");

/** A Miniflare instance running the real worker build, with `bindings` as vars. */
export async function startWorker(bindings = {}) {
  const mf = new Miniflare({
    modules: true,
    scriptPath: path.join(buildDir, "shim.mjs"),
    modulesRules: [
      { type: "ESModule", include: ["**/*.js", "**/*.mjs"] },
      { type: "CompiledWasm", include: ["**/*.wasm"] },
    ],
    compatibilityDate: "2026-05-01",
    bindings,
    cf: false,
  });
  const url = await mf.ready;
  return { mf, url: url.toString().replace(/\/$/, "") };
}
