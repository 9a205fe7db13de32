// One thread of the engine's pool in the threaded build: instantiates the package over the
// engine worker's shared memory, says so, then joins the pool for good (its workers spin
// between the kernels' parallel regions and sleep when idle; this worker has nothing else
// to do).
import init, { joinPool } from "../pkg-threads/straddle.js";

self.onmessage = async ({ data: { module, memory } }) => {
  try {
    await init({ module_or_path: module, memory });
  } catch (e) {
    self.postMessage({ type: "error", error: `the threaded build did not start: ${e.message ?? e}` });
    return;
  }
  self.postMessage({ type: "joining" });
  joinPool();
};
