// The real model pair end to end, in Debian's Chromium: Qwen2.5-Coder-0.5B-Instruct on the
// device (the CPU kernels and WebGPU) and the 1.5B behind the real worker under workerd, and
// the shipped router choosing between them as a new user would meet it.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startStack, launch, qwenEdge, qwenCloud } from "./stack.mjs";
import { needsEnv } from "../../worker/test/harness.mjs";

const skip = needsEnv("STRADDLE_TEST_QWEN", "STRADDLE_TEST_QWEN_CLOUD", "STRADDLE_CLOUD_BIN");
const MINUTES = 60_000;

let stack;
let gpu;
let cpu;
before(async () => {
  if (skip) return;
  stack = await startStack({ cloudModel: qwenCloud, pageModel: qwenEdge });
  gpu = await launch();
  cpu = await launch({ webgpu: false });
});
after(async () => {
  await gpu?.close();
  await cpu?.close();
  await stack?.close();
});

/**
 * Loads the 0.5B in a fresh page of `browser` on `backend` and asks each of `prompts` in turn
 * (a new conversation each, greedy, `max_tokens` short): the route, the model that answered,
 * the text and the reasons.
 */
async function askAll(browser, backend, prompts, maxTokens = 24) {
  const context = await browser.newContext();
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  try {
    await page.goto(`${stack.webUrl}/test/blank.html`);
    const out = await page.evaluate(async ([config, backend, prompts, maxTokens]) => {
      const { Straddle } = await import("/src/index.js");
      const s = await Straddle.create({ ...config, backend, policy: "balanced" });
      const answers = [];
      for (const prompt of prompts) {
        const a = await s.chat.completions.create({
          messages: [{ role: "user", content: prompt }], max_tokens: maxTokens, temperature: 0,
        });
        answers.push({ prompt, route: a.straddle.route, model: a.model, text: a.choices[0].message.content,
          reasons: a.straddle.reasons.join(" · "), versions: a.straddle.model_versions });
      }
      return { device: await s.device(), answers };
    }, [stack.config, backend, prompts, maxTokens]);
    assert.deepEqual(errors, []);
    return out;
  } finally {
    await context.close();
  }
}

const CAPITAL = "What is the capital of France?";
const WORD_PROBLEM = "A baker made 48 muffins. She sold 3 boxes of 6 muffins in the morning and half of " +
  "what was left in the afternoon. How many muffins does she have now? Work it out step by step.";

test("the 0.5B answers on the device on the CPU kernels; a word problem goes through the worker to the 1.5B", { skip, timeout: 20 * MINUTES }, async () => {
  const r = await askAll(cpu, "cpu", [CAPITAL, WORD_PROBLEM]);
  assert.equal(r.device.backend, "cpu");
  assert.match(r.device.model, /Qwen2\.5 Coder 0\.5B/i);
  const [capital, problem] = r.answers;
  assert.equal(capital.route, "edge", capital.reasons);
  assert.match(capital.text, /Paris/);
  assert.match(capital.model, /0\.5B/i, "the page says the device's model answered");
  assert.equal(problem.route, "cloud", problem.reasons);
  assert.match(problem.model, /1\.5B/i, `the cloud's model answered: ${problem.model}`);
  assert.ok(problem.text.length > 0);
});

test("the 0.5B answers on WebGPU (burn's device model) as on the CPU kernels", { skip, timeout: 20 * MINUTES }, async () => {
  const r = await askAll(gpu, "webgpu", [CAPITAL], 8);
  assert.equal(r.device.backend, "webgpu");
  const [capital] = r.answers;
  assert.equal(capital.route, "edge", capital.reasons);
  assert.match(capital.text, /Paris/);
});

// What a new user tries first. A short factual question and an extraction stay on the
// device; a proof goes to the cloud once the 0.5B's own state has been read, and a long
// program before any prefill.
const STAYS = [
  CAPITAL,
  "Extract the name and the city from this text as JSON with keys name and city: \"Maria Lopez moved to Lisbon last spring.\"",
];
const GOES_UP = [
  "Prove that the square root of 2 is irrational.",
  "Write a complete 40-line Python program that reads a CSV file of transactions, groups them by month and category, and prints a formatted report with totals and averages.",
];

test("the shipped router keeps a fact and an extraction on the 0.5B and sends a proof and a long program to the 1.5B", { skip, timeout: 30 * MINUTES }, async () => {
  const r = await askAll(cpu, "cpu", [...STAYS, ...GOES_UP], 16);
  for (const a of r.answers) {
    const want = STAYS.includes(a.prompt) ? "edge" : "cloud";
    assert.equal(a.route, want, `${a.prompt.slice(0, 40)}…: ${a.reasons}`);
    assert.ok(a.versions.some((v) => v.startsWith("quality/quality-1d9614638d18")), a.versions.join(" "));
  }
});

/**
 * `Straddle.create` with the 0.5B in a fresh page whose browser reports `deviceMemory` GB:
 * what it threw or the device report and an answer, and the model's requests (method and
 * range).
 */
async function createWithMemory(deviceMemory) {
  const context = await cpu.newContext();
  const model = new URL(stack.config.model, stack.webUrl).pathname;
  const fetched = [];
  context.on("request", (r) => {
    if (new URL(r.url()).pathname === model) fetched.push(`${r.method()} ${r.headers().range ?? "whole"}`);
  });
  const page = await context.newPage();
  try {
    await page.addInitScript((gb) => Object.defineProperty(Navigator.prototype, "deviceMemory", { get: () => gb }), deviceMemory);
    await page.goto(`${stack.webUrl}/test/blank.html`);
    const r = await page.evaluate(async ([config, prompt]) => {
      const { Straddle } = await import("/src/index.js");
      try {
        const s = await Straddle.create({ model: config.model, sha256: config.sha256, backend: "cpu" });
        const a = await s.chat.completions.create({ messages: [{ role: "user", content: prompt }], max_tokens: 8, temperature: 0 });
        return { device: s.device(), text: a.choices[0].message.content };
      } catch (e) {
        return { code: e.code, message: e.message };
      }
    }, [stack.config, CAPITAL]);
    return { ...r, fetched };
  } finally {
    await context.close();
  }
}

test("a device that reports too little memory for the 0.5B gets insufficient_memory having read only the header", { skip, timeout: 5 * MINUTES }, async () => {
  // Half a gigabyte, as a low-end phone reports it.
  const r = await createWithMemory(0.5);
  assert.equal(r.code, "insufficient_memory", JSON.stringify(r));
  assert.match(r.message, /needs about \d+ MB at 256 tokens of context \(file 491 MB, weights \d+ MB, KV cache \d+ MB, scratch \d+ MB\); this device reports 0\.5 GB/);
  assert.deepEqual(r.fetched, ["HEAD whole", `GET bytes=0-${(8 << 20) - 1}`], "the header, and no other byte of the model");
});

test("a device with memory for the 0.5B at a shorter context loads it at that context and answers", { skip, timeout: 10 * MINUTES }, async () => {
  // 2 GB: half of it holds the file while its weights are laid out, and 512 tokens, not 1024.
  const r = await createWithMemory(2);
  assert.equal(r.code, undefined, JSON.stringify(r));
  assert.equal(r.device.contextTokens, 512, JSON.stringify(r.device));
  assert.ok(r.device.memory.total <= 2 ** 30, JSON.stringify(r.device.memory));
  assert.ok(r.device.memory.weights > 0.95 * r.device.memory.file, JSON.stringify(r.device.memory));
  assert.match(r.text, /Paris/);
  assert.equal(r.fetched[0], "HEAD whole");
  assert.equal(r.fetched.at(-1), "GET whole", "then the whole model, once");
});
