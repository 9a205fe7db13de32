// The router inside Chromium: `Straddle.route()` on 2 KB prompts (JS ↔ wasm and JSON
// included) and the check at the edge's first token (`firstToken` on that decision).
// performance.now() is coarsened in a tab (5–100 µs), so decisions are timed in batches and
// each batch's mean is one sample. Prints a Markdown table.
// The edge model is loaded for real, so the decision is the whole one a page with a model
// makes (the quality model, the edge's speed and languages); the cloud is never called.
// Usage: node bench/route.mjs --model <file.gguf> [--batches 200] [--batch 50]
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { createServer } from "../scripts/serve.mjs";

const arg = (name, fallback) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : fallback;
};
const model = arg("--model");
if (!model) throw new Error("--model <file.gguf> is required");
const batches = Number(arg("--batches", "200"));
const batch = Number(arg("--batch", "50"));
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const server = createServer({ root, models: path.dirname(model), isolated: false });
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const base = `http://127.0.0.1:${server.address().port}`;
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true,
  args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-background-networking"] });
const page = await browser.newPage();
await page.goto(`${base}/test/blank.html`);
const result = await page.evaluate(async ([batches, batch, modelUrl]) => {
  const { Straddle } = await import("/src/index.js");
  const wasm = await import("/pkg/straddle.js");
  // Nothing listens on port 9: routing never calls the cloud.
  const s = await Straddle.create({ model: modelUrl, worker: "http://127.0.0.1:9" });
  const prompts = {
    en: "Please summarise the following meeting notes and list the action items. ".repeat(28).slice(0, 2048),
    zh: "请总结以下会议记录并列出行动项目，包括负责人和截止日期。".repeat(40).slice(0, 683),
  };
  const timed = (fn) => {
    for (let i = 0; i < batch * 4; i++) fn();
    const means = [];
    for (let b = 0; b < batches; b++) {
      const t = performance.now();
      for (let i = 0; i < batch; i++) fn();
      means.push(((performance.now() - t) / batch) * 1000);
    }
    means.sort((a, b) => a - b);
    const at = (q) => means[Math.min(means.length - 1, Math.floor(q * means.length))];
    return { p50: at(0.5), p99: at(0.99) };
  };
  const out = {};
  for (const [lang, text] of Object.entries(prompts)) {
    const req = { messages: [{ role: "user", content: text }], max_tokens: 256 };
    const decision = s.route(req);
    out[lang] = {
      bytes: new TextEncoder().encode(text).length,
      quality: decision.quality?.model_version ?? "none",
      route: timed(() => s.route(req)),
      first: timed(() => JSON.parse(wasm.firstToken(JSON.stringify(decision), -0.4, 1.2))),
    };
  }
  return out;
}, [batches, batch, `/models/${path.basename(model)}`]);
await browser.close();
server.close();
const us = (v) => v.toFixed(0);
const version = await (async () => (await import("node:child_process")).execSync("/usr/bin/chromium --version").toString().trim())();
console.log(`${version}; ${batches} batches of ${batch} decisions per row, a batch's mean is one sample.\n`);
console.log(`| prompt | bytes | stage | p50 µs | p99 µs |`);
console.log(`|---|---:|---|---:|---:|`);
for (const [lang, r] of Object.entries(result)) {
  console.log(`| ${lang} | ${r.bytes} | Straddle.route (before generation; quality model ${r.quality}) | ${us(r.route.p50)} | ${us(r.route.p99)} |`);
  console.log(`| ${lang} | ${r.bytes} | firstToken (at the first token) | ${us(r.first.p50)} | ${us(r.first.p99)} |`);
}
