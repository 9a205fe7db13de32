// In-browser benchmark: Straddle's edge engine beside wllama (llama.cpp in wasm) on the same
// GGUF, in the same Chromium, in the same run. Prints a Markdown table.
// Usage: node bench/browser.mjs --model <file.gguf> [--runs 3] [--tokens 64]
// Each runs twice: on one thread (a page without cross-origin isolation, as most are) and on
// `--threads` threads (a cross-origin-isolated page: wasm threads over shared memory); both
// on the CPU when the WebGPU adapter is a software one (SwiftShader here).
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
const runs = Number(arg("--runs", "3"));
const maxTokens = Number(arg("--tokens", "64"));
const threads = Number(arg("--threads", "2"));
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const MODEL_URL = `/models/${path.basename(model)}`;
const PROMPT = [{ role: "user", content: "Write a short story about a lighthouse keeper who finds a message in a bottle." }];

const listen = async (isolated) => {
  const server = createServer({ root, models: path.dirname(model), isolated });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { server, base: `http://127.0.0.1:${server.address().port}` };
};
const plain = await listen(false);
const isolated = await listen(true);
const base = plain.base;
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true,
  args: ["--no-sandbox", "--disable-dev-shm-usage", "--enable-unsafe-webgpu", "--disable-background-networking"] });

/** One load + one answer, timed in the page. `engine` is "straddle" or "wllama". */
async function measure(page, engine, threads) {
  return page.evaluate(async ([engine, url, messages, maxTokens, threads]) => {
    const t0 = performance.now();
    let first = null;
    let tokens = 0;
    let loaded;
    if (engine === "straddle") {
      const { Straddle } = await import("/src/index.js");
      const s = await Straddle.create({ model: url, threads });
      loaded = performance.now();
      const stream = await s.chat.completions.create({ messages, max_tokens: maxTokens, temperature: 0, stream: true });
      let usage;
      for await (const c of stream) {
        if (c.choices[0].delta.content) first ??= performance.now();
        if (c.usage) usage = c.usage;
      }
      tokens = usage.completion_tokens;
      const end = performance.now();
      const { backend, threads: ran, threadsError } = s.device();
      if (ran !== threads) throw new Error(`straddle ran on ${ran} threads, not ${threads}: ${threadsError}`);
      await s.unload();
      return { load: loaded - t0, ttft: first - t0, decode: (tokens - 1) / ((end - first) / 1000), tokens, backend };
    }
    const { Wllama } = await import("/node_modules/@wllama/wllama/esm/index.js");
    const w = new Wllama({ default: "/node_modules/@wllama/wllama/esm/wasm/wllama.wasm" }, { suppressNativeLog: true, logger: { debug() {}, log() {}, warn() {}, error: console.error } });
    await w.loadModelFromUrl(new URL(url, location.href).href, { useCache: true, n_ctx: 1024, n_threads: threads, n_gpu_layers: 0 });
    if (w.getNumThreads() !== threads) throw new Error(`wllama ran on ${w.getNumThreads()} threads, not ${threads}`);
    loaded = performance.now();
    const stream = await w.createChatCompletion({ messages, max_tokens: maxTokens, temperature: 0, stream: true });
    for await (const c of stream) {
      if (c.choices?.[0]?.delta?.content) {
        first ??= performance.now();
        tokens += 1;
      }
    }
    const end = performance.now();
    await w.exit();
    return { load: loaded - t0, ttft: first - t0, decode: (tokens - 1) / ((end - first) / 1000), tokens, backend: "cpu" };
  }, [engine, MODEL_URL, PROMPT, maxTokens, threads]);
}

const rows = [];
const variants = [1, threads].flatMap((n) => ["straddle", "wllama"].map((engine) => ({ engine, n })));
for (const { engine, n } of variants) {
  const samples = { cold: [], warm: [] };
  for (let i = 0; i < runs; i++) {
    // A fresh context has an empty cache: the first load is over the network (localhost).
    const context = await browser.newContext();
    const page = await context.newPage();
    page.on("pageerror", (e) => console.error(`${engine}: ${e}`));
    await page.goto(`${n > 1 ? isolated.base : plain.base}/test/blank.html`);
    samples.cold.push(await measure(page, engine, n));
    await page.reload();
    samples.warm.push(await measure(page, engine, n));
    await context.close();
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)];
  const m = (kind, key) => median(samples[kind].map((s) => s[key]));
  rows.push({ engine, threads: n, backend: samples.warm[0].backend, coldLoad: m("cold", "load"), coldTtft: m("cold", "ttft"),
    warmLoad: m("warm", "load"), warmTtft: m("warm", "ttft"), decode: m("warm", "decode"), tokens: m("warm", "tokens") });
}
// Constrained decoding in the tab: what the grammar's masks cost beside the decode step, on
// the CPU kernels, one thread, for extraction schemas and a tool call (the engine's own timers).
const constrained = await (async () => {
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto(`${plain.base}/test/blank.html`);
  const result = await page.evaluate(async ([url, runs]) => {
    const { Straddle } = await import("/src/index.js");
    const s = await Straddle.create({ model: url, threads: 1, backend: "cpu" });
    const object = (properties, required) => ({ type: "object", properties, required, additionalProperties: false });
    const schema = (name, sch) => ({ type: "json_schema", json_schema: { name, strict: true, schema: sch } });
    const asks = [
      { content: "Extract the person: Maria Lopez is 34 years old and works as a nurse.",
        response_format: schema("person", object({ name: { type: "string" }, age: { type: "integer" }, job: { type: "string" } }, ["name", "age"])) },
      { content: "Classify the sentiment of: 'The delivery was late and the box was crushed.'",
        response_format: schema("label", object({ sentiment: { enum: ["positive", "negative", "neutral"] } }, ["sentiment"])) },
      { content: "List the groceries: two apples, a loaf of bread and 3 eggs.",
        response_format: schema("list", object({ items: { type: "array", maxItems: 5, items: object({ name: { type: "string", maxLength: 30 }, quantity: { type: "integer" } }, ["name", "quantity"]) } }, ["items"])) },
      { content: "What is the weather in Paris?", tool_choice: "required",
        tools: [{ type: "function", function: { name: "get_weather", parameters: object({ city: { type: "string" } }, ["city"]) } }] },
    ];
    const total = { grammar: 0, decode: 0, tokens: 0, answers: 0 };
    for (let i = 0; i < runs; i++) {
      for (const { content, ...format } of asks) {
        const a = await s.chat.completions.create({ messages: [{ role: "user", content }], max_tokens: 96, temperature: 0, ...format, straddle: { route: "edge" } });
        total.grammar += a.straddle.edge.grammar_ms;
        total.decode += a.straddle.edge.decode_ms;
        total.tokens += a.usage.completion_tokens;
        total.answers += 1;
      }
    }
    await s.unload();
    return total;
  }, [MODEL_URL, runs]);
  await context.close();
  return result;
})();
await browser.close();
plain.server.close();
isolated.server.close();

const ms = (v) => `${(v / 1000).toFixed(2)} s`;
console.log(`| engine | backend | threads | cold load | cold: create → first token | warm load (cache) | warm: create → first token | decode tok/s | tokens |`);
console.log(`|---|---|---|---|---|---|---|---|---|`);
for (const r of rows) {
  console.log(`| ${r.engine} | ${r.backend} | ${r.threads} | ${ms(r.coldLoad)} | ${ms(r.coldTtft)} | ${ms(r.warmLoad)} | ${ms(r.warmTtft)} | ${r.decode.toFixed(1)} | ${r.tokens} |`);
}
const decode = (engine, n) => rows.find((r) => r.engine === engine && r.threads === n).decode;
console.log(`\nDecode, straddle ÷ wllama: ${(decode("straddle", 1) / decode("wllama", 1)).toFixed(2)}× on 1 thread, ${(decode("straddle", threads) / decode("wllama", threads)).toFixed(2)}× on ${threads}.`);
console.log(`\nMedian of ${runs} runs each; greedy, ${maxTokens} new tokens at most, one prompt of ${PROMPT[0].content.length} characters.`);
const c = constrained;
console.log(`\nConstrained decoding in the tab (straddle, CPU kernels, 1 thread; 3 strict JSON schemas and a required tool call, ${c.answers} answers, ${c.tokens} tokens): ` +
  `the grammar's masks and advances took ${c.grammar.toFixed(1)} ms of ${c.decode.toFixed(0)} ms of decoding, ${(100 * c.grammar / c.decode).toFixed(1)}% ` +
  `(${(c.grammar / c.tokens).toFixed(2)} ms a token against ${(c.decode / c.tokens).toFixed(1)} ms a decode step).`);
