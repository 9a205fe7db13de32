// The package's TypeScript declarations, checked by the TypeScript compiler against a file
// that uses every option (test/types/usage.ts) and against the React example (its JSX and
// JSDoc checked as JavaScript), so a declaration that drifts from the API, or stops
// type-checking at all, fails here.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");

test("index.d.ts type-checks a file that uses every option, and refuses misuse", () => {
  const run = spawnSync(process.execPath, [tsc, "-p", path.join(here, "types")], { encoding: "utf8" });
  assert.equal(run.status, 0, `tsc: ${run.stdout}${run.stderr}`);
});

test("the React example type-checks against index.d.ts", () => {
  const example = path.join(here, "../examples/react");
  const run = spawnSync(process.execPath, [tsc, "-p", example], { encoding: "utf8" });
  assert.equal(run.status, 0, `tsc: ${run.stdout}${run.stderr}`);
});
