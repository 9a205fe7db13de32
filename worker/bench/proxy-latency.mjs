// What a proxy adds to a streamed chat request: the same fixed-speed upstream called directly,
// through the Straddle worker under local workerd (token checked, budget held and settled,
// cost record written) and through LiteLLM's proxy, at 1 and 64 concurrent streams, in one
// run with the three paths interleaved. Prints a Markdown table.
//
//   node bench/proxy-latency.mjs --litellm <path to the `litellm` executable>
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { startWorker, mintToken, ORIGIN, freePort } from "../test/harness.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
};
const litellmBin = arg("litellm");
const CHUNKS = 32;
const ROUNDS = Number(arg("rounds", 2));
const PER_ROUND = { 1: 100, 64: 640 };

function startProcess(cmd, args, env = {}) {
  const proc = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  proc.stdout.on("data", (d) => { log += d; });
  proc.stderr.on("data", (d) => { log += d; });
  return { proc, log: () => log };
}

async function waitUp(url, ms, what, { proc, log }) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`${what} exited:\n${log()}`);
    try { if ((await fetch(url)).status < 500) return; } catch { /* not yet */ }
    if (Date.now() > deadline) throw new Error(`${what} did not start:\n${log()}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** One streamed request: time to the first body byte and to the end, in ms. */
async function once(target) {
  const t0 = performance.now();
  const res = await fetch(target.url, {
    method: "POST",
    headers: target.headers,
    body: JSON.stringify({
      model: target.model, stream: true, stream_options: { include_usage: true }, max_tokens: 64,
      messages: [{ role: "user", content: "Say something short." }],
    }),
  });
  if (res.status !== 200) throw new Error(`${target.name} answered ${res.status}: ${await res.text()}`);
  const reader = res.body.getReader();
  let first = null;
  let text = "";
  const decoder = new TextDecoder();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    first ??= performance.now();
    text += decoder.decode(value, { stream: true });
  }
  if (!text.includes("[DONE]")) throw new Error(`${target.name}: the stream did not finish`);
  return { ttfb: first - t0, total: performance.now() - t0 };
}

async function load(target, concurrency, count) {
  const samples = [];
  let next = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < count) {
      next += 1;
      samples.push(await once(target));
    }
  }));
  return samples;
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

const upstreamProc = startProcess("node", [path.join(here, "upstream-process.mjs"), String(CHUNKS)]);
const upstreamUrl = await new Promise((resolve, reject) => {
  upstreamProc.proc.stdout.once("data", (d) => resolve(String(d).trim()));
  upstreamProc.proc.once("exit", () => reject(new Error(`upstream exited:\n${upstreamProc.log()}`)));
});
const worker = await startWorker({ UPSTREAM_URL: upstreamUrl, PRICE_IN_PER_1K: "0.5", PRICE_OUT_PER_1K: "1.5" });
// A budget that never refuses, so every request takes the full path: hold, forward, settle.
await fetch(`${worker.url}/v1/tenants/acme`, {
  method: "PUT", headers: { authorization: "Bearer admin-test-key" }, body: JSON.stringify({ daily_usd: 1e9 }),
});

const LITELLM_KEY = "sk-straddle-bench-0123456789abcdef";
const temp = fs.mkdtempSync(path.join(os.tmpdir(), "straddle-litellm-"));
const litellmPort = await freePort();
fs.writeFileSync(path.join(temp, "config.yaml"), [
  "model_list:",
  "  - model_name: fake",
  "    litellm_params:",
  "      model: openai/fake",
  `      api_base: ${upstreamUrl}/v1`,
  "      api_key: none",
  "",
].join("\n"));
const litellm = startProcess(litellmBin, ["--config", path.join(temp, "config.yaml"), "--host", "127.0.0.1", "--port", String(litellmPort)], {
  // Offline: the bundled price map, no telemetry.
  LITELLM_LOCAL_MODEL_COST_MAP: "True", LITELLM_TELEMETRY: "False", LITELLM_LOG: "ERROR",
  // It refuses to start without one; with no database it checks the key and nothing else.
  LITELLM_MASTER_KEY: LITELLM_KEY,
});
const stop = () => { litellm.proc.kill(); upstreamProc.proc.kill(); fs.rmSync(temp, { recursive: true, force: true }); };
try {
  await waitUp(`http://127.0.0.1:${litellmPort}/health/liveliness`, 120_000, "LiteLLM", litellm);
  const json = { "content-type": "application/json" };
  const targets = [
    { name: "upstream directly", url: `${upstreamUrl}/v1/chat/completions`, headers: json, model: "fake" },
    {
      name: "Straddle worker (workerd)", url: `${worker.url}/v1/chat/completions`, model: "fake",
      headers: { ...json, authorization: `Bearer ${mintToken({ exp: Math.floor(Date.now() / 1000) + 3600 })}`, origin: ORIGIN },
    },
    {
      name: "LiteLLM proxy", url: `http://127.0.0.1:${litellmPort}/v1/chat/completions`, model: "fake",
      headers: { ...json, authorization: `Bearer ${LITELLM_KEY}` },
    },
  ];
  for (const t of targets) await load(t, 4, 40); // warm-up: connections, JIT, caches
  const results = new Map(targets.map((t) => [t.name, { 1: [], 64: [] }]));
  for (let round = 0; round < ROUNDS; round++) {
    for (const c of [1, 64]) {
      for (const t of targets) results.get(t.name)[c].push(...await load(t, c, PER_ROUND[c]));
    }
  }
  const f = (x) => x.toFixed(1);
  let table = "| path | streams | requests | first byte p50 / p99 (ms) | whole answer p50 / p99 (ms) | added p50 / p99 (ms) |\n|---|---|---|---|---|---|\n";
  for (const c of [1, 64]) {
    const base = results.get(targets[0].name)[c].map((s) => s.total);
    for (const t of targets) {
      const s = results.get(t.name)[c];
      const total = s.map((x) => x.total);
      const ttfb = s.map((x) => x.ttfb);
      const added = t === targets[0] ? "—" : `${f(pct(total, 50) - pct(base, 50))} / ${f(pct(total, 99) - pct(base, 99))}`;
      table += `| ${t.name} | ${c} | ${s.length} | ${f(pct(ttfb, 50))} / ${f(pct(ttfb, 99))} | ${f(pct(total, 50))} / ${f(pct(total, 99))} | ${added} |\n`;
    }
  }
  console.log(table);
  console.log(`Upstream: an OpenAI-compatible server on 127.0.0.1 answering ${CHUNKS} chunks at once (the fault-injecting test upstream, in its own process), so the rows measure the proxies, not a model. ${ROUNDS} rounds, paths interleaved; added = this path minus the upstream directly at the same percentile.`);
} finally {
  stop();
  await worker.mf.dispose();
}
