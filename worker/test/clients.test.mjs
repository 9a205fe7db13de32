// The clients integrators point at us, unmodified: the official `openai` Python package
// against the cloud server and against the worker in front of it, the `openai` npm package
// against the cloud server (through the worker: forward.test.mjs), and the Vercel AI SDK's
// OpenAI-compatible provider against the worker. Real cloud server, real model, workerd.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { APICallError, generateText, streamText } from "ai";
import OpenAI from "openai";
import { startWorker, startCloud, mintToken, ORIGIN, needsEnv } from "./harness.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const python = process.env.STRADDLE_CLIENTS_PYTHON;
const cloudBin = process.env.STRADDLE_CLOUD_BIN;
const model = process.env.STRADDLE_TEST_MODEL;
const skip = needsEnv("STRADDLE_CLIENTS_PYTHON", "STRADDLE_CLOUD_BIN", "STRADDLE_TEST_MODEL");

let cloud, worker;
before(async () => {
  if (skip) return;
  cloud = await startCloud(cloudBin, model);
  worker = await startWorker({ UPSTREAM_URL: cloud.url });
});
after(async () => {
  await worker?.mf.dispose();
  cloud?.kill();
});

/** Runs the Python client's `classes` against `env`; resolves to its output once it passed. */
function pythonSuite(env, classes) {
  return new Promise((resolve, reject) => {
    const proc = spawn(python, [path.join(here, "clients/openai_python.py"), ...classes], { env: { ...process.env, ...env } });
    let out = "";
    proc.stdout.on("data", (d) => { out += d; });
    proc.stderr.on("data", (d) => { out += d; });
    proc.on("close", (code) => (code === 0 ? resolve(out) : reject(new Error(`openai_python.py exited ${code}:\n${out}`))));
  });
}

test("the official openai Python client against the cloud server: whole, streamed, usage, typed errors, abort", { skip }, async () => {
  // The token check is the worker's; the cloud server behind it has none to fail.
  const out = await pythonSuite({ STRADDLE_BASE_URL: `${cloud.url}/v1` }, ["OfficialPythonClient"]);
  assert.match(out, /Ran 5 tests/);
  assert.match(out, /\nOK\n/);
});

test("the official openai Python client through the worker, with a tenant token", { skip }, async () => {
  const env = { STRADDLE_BASE_URL: `${worker.url}/v1`, STRADDLE_API_KEY: mintToken(), STRADDLE_ORIGIN: ORIGIN };
  const out = await pythonSuite(env, ["OfficialPythonClient", "ThroughTheWorker"]);
  assert.match(out, /Ran 6 tests/);
  assert.match(out, /\nOK\n/);
});

const provider = (token = mintToken()) => createOpenAICompatible({
  name: "straddle", baseURL: `${worker.url}/v1`, apiKey: token, headers: { origin: ORIGIN }, includeUsage: true,
});

test("the Vercel AI SDK's OpenAI-compatible provider generates and streams through the worker", { skip }, async () => {
  const ask = { prompt: "Name three primary colors.", maxOutputTokens: 12, temperature: 0, maxRetries: 0 };
  const whole = await generateText({ model: provider()("smollm2"), ...ask });
  assert.ok(whole.text.length > 0);
  assert.ok(whole.usage.outputTokens > 0 && whole.usage.inputTokens > 0, JSON.stringify(whole.usage));
  const streamed = streamText({ model: provider()("smollm2"), ...ask });
  let text = "";
  for await (const part of streamed.textStream) text += part;
  assert.equal(text, whole.text);
  assert.equal((await streamed.usage).outputTokens, whole.usage.outputTokens);
});

test("the AI SDK surfaces the worker's refusal as an APICallError with its status", { skip }, async () => {
  await assert.rejects(
    generateText({ model: provider("not-a-token")("smollm2"), prompt: "hi", maxRetries: 0 }),
    (err) => APICallError.isInstance(err) && err.statusCode === 401,
  );
});

test("the official openai npm client against the cloud server: whole, streamed, a typed error naming the field, abort", { skip }, async () => {
  const client = new OpenAI({ baseURL: `${cloud.url}/v1`, apiKey: "unused", maxRetries: 0 });
  const ask = { model: "smollm2", messages: [{ role: "user", content: "Name three primary colors." }], max_tokens: 12, temperature: 0 };
  const whole = await client.chat.completions.create(ask);
  assert.ok(whole.choices[0].message.content.length > 0);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
  let text = "";
  let usage;
  for await (const chunk of await client.chat.completions.create({ ...ask, stream: true, stream_options: { include_usage: true } })) {
    text += chunk.choices[0]?.delta?.content ?? "";
    usage = chunk.usage ?? usage;
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(usage?.completion_tokens, whole.usage.completion_tokens);
  await assert.rejects(client.chat.completions.create({ ...ask, temperature: 3 }), (err) => err instanceof OpenAI.BadRequestError && err.param === "temperature");
  // Aborted after the first chunk of an answer that cannot end early (its end-of-turn tokens
  // banned) and would take seconds: the server cancels the sequence at once.
  const controller = new AbortController();
  const endless = { ...ask, max_tokens: 2000, logit_bias: { 0: -100, 1: -100, 2: -100 }, stream: true };
  const stream = await client.chat.completions.create(endless, { signal: controller.signal });
  // The client ends its iteration quietly once aborted.
  for await (const _ of stream) controller.abort();
  let active = 1;
  for (let i = 0; i < 20 && active > 0; i++) {
    active = (await (await fetch(`${cloud.url}/v1/load`)).json()).active;
    if (active > 0) await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(active, 0, "the aborted sequence was cancelled");
});
