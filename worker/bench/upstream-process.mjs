// The fixed-speed upstream of the proxy benchmark in a process of its own, so the load
// generator's event loop does not slow it: prints its URL, then serves until killed.
import { startFakeUpstream } from "../test/fake-upstream.mjs";

const upstream = await startFakeUpstream({ completionTokens: Number(process.argv[2] ?? 32) });
console.log(upstream.url);
