// The browser package end to end, in Debian's Chromium: the script-tag demo and the module
// API against the real worker under workerd and the real cloud server, with the real model.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import { execFileSync } from "node:child_process";
import path from "node:path";
import { startStack, launch, root, model, cloudBin } from "./stack.mjs";
import { createServer } from "../scripts/serve.mjs";
import { startWorker, startCloud, mintToken, admin, needsEnv, TENANT } from "../../worker/test/harness.mjs";

const skip = needsEnv("STRADDLE_TEST_MODEL", "STRADDLE_CLOUD_BIN");
const MODEL_URL = "/models/smollm2-135m-instruct-q4_1.gguf";
const shots = path.join(root, "test", "screenshots");
const MINUTES = 60_000;

let stack;
let browser;
before(async () => {
  if (skip) return;
  stack = await startStack();
  browser = await launch();
  fs.mkdirSync(shots, { recursive: true });
});
after(async () => {
  await browser?.close();
  await stack?.close();
});

/** A fresh context (own Cache API and IndexedDB) with every request the page makes recorded. */
async function freshPage(b = browser) {
  const context = await b.newContext();
  const sent = [];
  context.on("request", (r) => sent.push({ url: r.url(), body: r.postData() ?? "" }));
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  return { context, page, sent, errors };
}

/** Opens the demo with `config` overriding what the server hands the page. */
async function openDemo(page, config = {}) {
  Object.assign(stack.config, { policy: undefined }, config);
  await page.goto(`${stack.webUrl}/demo/`);
  await page.waitForFunction(() => document.body.dataset.ready, null, { timeout: 5 * MINUTES });
  assert.equal(await page.evaluate(() => document.body.dataset.ready), "1", await page.textContent("#engine"));
}

async function ask(page, prompt) {
  const before = await page.locator(".assistant[data-done]").count();
  await page.fill("#prompt", prompt);
  await page.click("#send");
  await page.waitForFunction((n) => document.querySelectorAll(".assistant[data-done]").length > n, before, { timeout: 10 * MINUTES });
  const el = page.locator(".assistant[data-done]").last();
  return { route: await el.getAttribute("data-route"), degraded: await el.getAttribute("data-degraded"),
    error: await el.getAttribute("data-error"), badges: await el.locator(".badges").innerText(),
    reasons: await el.locator(".reasons").innerText(), text: await el.locator(".text").innerText() };
}

/** Runs `fn(Straddle, config)` in a page of the stack, with the module API. */
async function inPage(page, fn, arg) {
  if (!page.url().startsWith(stack.webUrl)) await page.goto(`${stack.webUrl}/test/blank.html`);
  return page.evaluate(async ([src, config, arg]) => {
    const { Straddle, StraddleError } = await import("/src/index.js");
    // eslint-disable-next-line no-new-func
    return new Function("Straddle", "StraddleError", "config", "arg", `return (${src})(Straddle, StraddleError, config, arg);`)(Straddle, StraddleError, config, arg);
  }, [fn.toString(), { ...stack.config, model: "/models/smollm2-135m-instruct-q4_1.gguf" }, arg]);
}

// A tenant whose cloud model is dear ($1 per 1,000 tokens) and who weighs cost: simple
// prompts stay on the device by the quality model's estimate, not by a rule.
const DEAR_CLOUD = { preset: "low-cost", cloud_price_in_per_1k: 1, cloud_price_out_per_1k: 1 };

test("the script-tag demo answers a simple prompt on the edge and shows the route", { skip }, async () => {
  const { context, page, errors } = await freshPage();
  try {
    await openDemo(page, { policy: DEAR_CLOUD });
    assert.equal(await page.evaluate(() => typeof window.Straddle.create), "function", "the script tag defines window.Straddle");
    const a = await ask(page, "Hello! How are you today?");
    assert.equal(a.route, "edge", `${a.reasons} ${a.text}`);
    assert.match(a.badges, /^edge/);
    assert.match(a.reasons, /quality: P\(edge answer acceptable\) [0-9.]+ before generation/);
    assert.ok(a.text.trim().length > 0, "an answer was generated");
    assert.match(await page.textContent("#engine"), /^cpu/, "SwiftShader is a software adapter: the CPU kernels answer");
    assert.match(await page.textContent("#engine"), / · 1024-token context · /, "the context the engine holds");
    assert.equal(await page.textContent("#s-mix"), "1 / 0");
    await page.screenshot({ path: path.join(shots, "demo-edge.png"), fullPage: true });
    assert.deepEqual(errors, []);
  } finally {
    await context.close();
  }
});

test("the demo's model picker loads Gemma 3 on the CPU kernels and answers", { skip }, async () => {
  const { context, page, errors } = await freshPage();
  try {
    Object.assign(stack.config, { policy: DEAR_CLOUD });
    const gemma = "/models/gemma-3-270m-q4_k_m.gguf";
    await page.goto(`${stack.webUrl}/demo/?model=${encodeURIComponent(gemma)}`);
    await page.waitForFunction(() => document.body.dataset.ready, null, { timeout: 5 * MINUTES });
    assert.equal(await page.evaluate(() => document.body.dataset.ready), "1", await page.textContent("#engine"));
    assert.equal(await page.inputValue("#edge-model"), gemma);
    assert.match(await page.textContent("#model"), /Gemma 3/i);
    assert.match(await page.textContent("#engine"), /^cpu/);
    const a = await ask(page, "Hello! How are you today?");
    assert.equal(a.error, null, a.text);
    assert.ok(a.text.trim().length > 0, "an answer was generated");
    assert.deepEqual(errors, []);
  } finally {
    await context.close();
  }
});

test("personal data never leaves the page: a card stays on the device, an e-mail is redacted", { skip }, async () => {
  const { context, page, sent } = await freshPage();
  try {
    await openDemo(page);
    const card = await ask(page, "My card 4111 1111 1111 1111 was charged twice, email me at jane.doe@example.com. What should I do?");
    assert.equal(card.route, "edge");
    assert.match(card.reasons, /privacy: PaymentCard stays on this device/);
    await page.click("#clear");
    // An e-mail alone may go to the cloud, but only as a placeholder.
    const mail = await ask(page, "Write a detailed essay about e-mail etiquette for my colleague jane.doe@example.com.");
    assert.equal(mail.route, "cloud", mail.reasons);
    assert.match(mail.badges, /redacted/);
    await page.screenshot({ path: path.join(shots, "demo-privacy.png"), fullPage: true });
    const uploads = sent.filter((r) => r.body);
    assert.ok(uploads.some((r) => r.url.endsWith("/v1/chat/completions") && r.body.includes("[EMAIL_1]")), "the redacted prompt went up");
    for (const r of sent) {
      for (const secret of ["4111", "jane.doe@example.com", "jane.doe"]) {
        assert.ok(!r.url.includes(secret) && !r.body.includes(secret), `${r.url} carried ${secret}`);
      }
    }
  } finally {
    await context.close();
  }
});

test("a name and a phone written without cue words go up as placeholders and come back restored", { skip }, async () => {
  const { context, page, sent } = await freshPage();
  const replies = [];
  context.on("response", async (r) => {
    if (r.url().endsWith("/v1/chat/completions")) replies.push(await r.text().catch(() => ""));
  });
  try {
    await openDemo(page);
    const a = await ask(page, "Write a detailed essay about thank-you notes, then end it with exactly this line: " +
      "Johanna Kessler, 212-555-0147x3321");
    assert.equal(a.route, "cloud", a.reasons);
    assert.match(a.badges, /redacted/);
    const uploads = sent.filter((r) => r.url.endsWith("/v1/chat/completions"));
    assert.ok(uploads.some((r) => r.body.includes("[PERSON_NAME_1]") && r.body.includes("[PHONE_1]")), "placeholders went up");
    for (const r of sent) {
      for (const secret of ["Johanna", "Kessler", "555-0147", "3321"]) {
        assert.ok(!r.url.includes(secret) && !r.body.includes(secret), `${r.url} carried ${secret}`);
      }
    }
    // The cloud answers in placeholders; the page shows the originals in their place and
    // never a placeholder.
    const delta = (line) => {
      try { return JSON.parse(line.slice(6)).choices?.[0]?.delta?.content ?? ""; } catch { return ""; }
    };
    const raw = replies.flatMap((body) => body.split("\n").filter((l) => l.startsWith("data: ")).map(delta)).join("");
    assert.doesNotMatch(a.text, /\[(PERSON_NAME|PHONE)_\d+\]/);
    for (const [placeholder, original] of [["[PERSON_NAME_1]", "Johanna Kessler"], ["[PHONE_1]", "212-555-0147x3321"]]) {
      const used = raw.split(placeholder).length - 1;
      assert.equal(a.text.split(original).length - 1 >= used, true, `${placeholder} appeared ${used}× but ${original} did not`);
    }
  } finally {
    await context.close();
  }
});

test("a long-form prompt escalates and streams from the cloud, with usage, cost and reasons", { skip }, async () => {
  const { context, page } = await freshPage();
  try {
    const r = await inPage(page, async (Straddle, _E, config) => {
      const s = await Straddle.create(config);
      const chunks = [];
      const stream = await s.chat.completions.create({ stream: true, max_tokens: 48,
        messages: [{ role: "user", content: "Write a detailed essay on the history of the printing press and its effects on European society." }] });
      for await (const c of stream) chunks.push(c);
      return { chunks, stats: await s.stats() };
    });
    const last = r.chunks.at(-1);
    assert.ok(r.chunks.length > 2, `streamed in ${r.chunks.length} chunks`);
    assert.equal(r.chunks[0].choices[0].delta.role, "assistant");
    assert.equal(last.straddle.route, "cloud");
    assert.match(last.straddle.reasons.join(" "), /quality: P\(edge answer acceptable\) 0\.[0-9]+ before generation/);
    assert.ok(last.usage.completion_tokens > 0 && last.straddle.cost.usd > 0);
    assert.ok(last.straddle.model_versions.some((v) => v.startsWith("cloud/")));
    assert.equal(r.stats.routes.cloud.requests, 1);
    const text = r.chunks.map((c) => c.choices[0].delta.content ?? "").join("");
    assert.ok(text.trim().length > 0);
  } finally {
    await context.close();
  }
});

test("with its worker stopped or out of budget, the page answers on the edge and says it is degraded, then keeps a spent budget on the device", { skip }, async () => {
  const worker = await startWorker({ UPSTREAM_URL: stack.cloudUrl, ALLOWED_ORIGINS: stack.webUrl });
  const { context, page } = await freshPage();
  try {
    const token = mintToken({ origin: stack.webUrl, sid: "degraded-test" });
    const r = await inPage(page, async (Straddle, _E, config, { worker, token }) => {
      const ask = async (s) => (await s.chat.completions.create({ max_tokens: 12,
        messages: [{ role: "user", content: "Write a detailed essay on the history of the printing press." }] })).straddle;
      const s = await Straddle.create({ ...config, worker, token });
      window.__ask = () => ask(s);
      // A client that has not been told the budget is spent, for the worker-down case.
      window.__askFresh = async () => ask(await Straddle.create({ ...config, worker, token }));
      return ask(s);
    }, { worker: worker.url, token });
    assert.equal(r.route, "cloud", "the worker is up at first");
    // Out of budget: the worker refuses with 402 before anything goes upstream.
    const put = await admin(worker.url, "PUT", `/v1/tenants/${TENANT}`, { daily_tokens: 0 });
    assert.equal(put.status, 200);
    const broke = await page.evaluate(() => window.__ask());
    assert.equal(broke.route, "edge");
    assert.match(broke.degraded, /budget_exhausted/);
    // Told once, the page keeps the rest of the day on the device without asking again.
    const after = await page.evaluate(() => window.__ask());
    assert.equal(after.route, "edge");
    assert.ok(!after.degraded, "a budget rule's edge answer is not a failover");
    assert.ok(after.reasons.some((reason) => reason.startsWith("budget:")), after.reasons.join("; "));
    await worker.mf.dispose();
    const down = await page.evaluate(() => window.__askFresh());
    assert.equal(down.route, "edge");
    assert.match(down.degraded, /cloud_unreachable/);
  } finally {
    await context.close();
    await worker.mf.dispose().catch(() => {});
  }
});

test("speculative decoding: the page drafts, the cloud verifies, the text is the cloud's; a dead verifier leaves the edge to finish", { skip }, async () => {
  const worker = await startWorker({ UPSTREAM_URL: stack.cloudUrl, UPSTREAM_SUPPORTS_VERIFY: "true", ALLOWED_ORIGINS: stack.webUrl });
  const { context, page } = await freshPage();
  try {
    const token = mintToken({ origin: stack.webUrl, sid: "speculative-test" });
    // A tenant that wants the cloud's quality, pays for its output tokens dearly and hardly
    // minds latency: speculation (one output token billed a verify call) pays.
    const policy = { preset: "balanced", weights: { latency: 0.001, cost: 1, quality: 8 }, cloud_price_out_per_1k: 0.015 };
    const r = await inPage(page, async (Straddle, _E, config, { worker, token, policy }) => {
      const s = await Straddle.create({ ...config, worker, token, policy, backend: "cpu" });
      const messages = [{ role: "user", content: "Write a detailed essay on the history of the printing press." }];
      const ask = async (route) => {
        const a = await s.chat.completions.create({ max_tokens: 24, temperature: 0, messages, straddle: { route } });
        return { text: a.choices[0].message.content, meta: a.straddle, usage: a.usage };
      };
      window.__ask = ask;
      const decided = s.route({ messages });
      const personal = await s.chat.completions.create({ max_tokens: 8, straddle: { route: "speculative" },
        messages: [{ role: "user", content: "Write a detailed letter to jane.doe@example.com about the printing press." }] });
      const out = { decided: decided.target, spec: await ask("auto"), cloud: await ask("cloud"), edge: await ask("edge"), personal: personal.straddle };
      // A threshold no running acceptance reaches: after a few verify calls the reply is handed
      // to plain cloud streaming, which continues the same turn.
      const long = async (route) => {
        const a = await s.chat.completions.create({ max_tokens: 64, temperature: 0, messages, straddle: { route } });
        return { text: a.choices[0].message.content, meta: a.straddle, usage: a.usage };
      };
      await s.setPolicy({ ...policy, speculative_min_acceptance: 1 });
      out.handed = await long("speculative");
      out.longCloud = await long("cloud");
      await s.setPolicy(policy);
      return out;
    }, { worker: worker.url, token, policy });
    assert.equal(r.decided, "speculative", "the worker's cloud verifies with our tokenizer, and the policy favours it");
    assert.equal(r.spec.meta.route, "speculative");
    assert.equal(r.spec.meta.degraded, null);
    assert.equal(r.spec.text, r.cloud.text, "greedy speculative output is the cloud's own");
    const sp = r.spec.meta.speculative;
    assert.ok(sp.verify_calls > 0 && sp.verify_calls < r.spec.usage.completion_tokens, JSON.stringify(sp));
    assert.equal(r.personal.route, "cloud");
    assert.match(r.personal.reasons.join(" "), /not speculative: personal data/);
    const handed = r.handed.meta.speculative;
    assert.ok(handed.handed_off_after_tokens > 0 && handed.handed_off_after_tokens < 64, JSON.stringify(handed));
    assert.equal(handed.verify_calls, 4, "handed over after the fourth call");
    assert.match(r.handed.meta.reasons.join(" "), /handed to plain streaming/);
    assert.equal(r.handed.meta.degraded, null);
    assert.equal(r.handed.usage.completion_tokens, r.longCloud.usage.completion_tokens);
    // The cloud continues the same turn from the text shown, which is its own greedy answer's
    // (kept once). Past it the cloud reads the answer so far as a prompt, whose sums
    // llama.cpp's order takes unlike a decoded token's, so the rest equals its plain greedy
    // answer only up to float noise.
    const shown = r.handed.text.slice(0, 100);
    assert.ok(r.longCloud.text.startsWith(shown), `${r.handed.text}\n${r.longCloud.text}`);
    assert.equal(r.handed.text.split(shown).length, 2, "the shown text is kept once");
    // The verify calls carried the page's versions: the tenant sees acceptance by policy.
    const byPolicy = (await (await admin(worker.url, "GET", `/v1/tenants/${TENANT}/usage?group_by=policy_version`)).json()).groups;
    const spec = byPolicy.find((g) => g.speculative_acceptance !== null);
    assert.equal(spec?.key, "balanced-1", JSON.stringify(byPolicy));
    assert.ok(spec.speculative_acceptance > 0 && spec.speculative_acceptance <= 1, JSON.stringify(spec));
    // The verifier goes away: the edge finishes alone, says so, and the text is still whole.
    await worker.mf.dispose();
    const alone = await page.evaluate(() => window.__ask("speculative"));
    assert.equal(alone.meta.route, "speculative");
    assert.match(alone.meta.degraded, /verification failed/);
    assert.ok(alone.meta.speculative.edge_alone_tokens > 0);
    // Drafted from the start by this page's engine alone: its own greedy answer, whole (the
    // wasm kernels may break a near-tie differently from the cloud's, so not the cloud's).
    assert.equal(alone.text, r.edge.text);
  } finally {
    await context.close();
    await worker.mf.dispose().catch(() => {});
  }
});

// A word problem the edge model starts but, by its first token, is unlikely to answer well.
const problem = "A baker makes 14 trays of 18 rolls, sells 3/4 of them at $1.25 each and gives half of " +
  "the rest to a shelter. How many dollars does she earn, and how many rolls are left?";

test("after prefill the edge model's state sends a word problem to the cloud with the whole history, before any edge token", { skip }, async () => {
  const { context, page, sent } = await freshPage();
  try {
    const r = await inPage(page, async (Straddle, _E, config, problem) => {
      // The balanced bar (0.5 at the first token), whatever an earlier test left in config.
      const s = await Straddle.create({ ...config, policy: { preset: "balanced" }, backend: "cpu" });
      const messages = [
        { role: "user", content: "Hi! I have a question for you." },
        { role: "assistant", content: "Of course, ask away." },
        { role: "user", content: problem },
      ];
      const before = s.route({ messages, max_tokens: 24 });
      const deltas = [];
      const stream = await s.chat.completions.create({ stream: true, max_tokens: 24, temperature: 0, messages });
      let meta = null;
      for await (const chunk of stream) {
        if (chunk.choices[0]?.delta?.content) deltas.push(chunk.choices[0].delta.content);
        if (chunk.straddle) meta = chunk.straddle;
      }
      return { before: before.target, quality: before.quality, deltas, meta };
    }, problem);
    assert.equal(r.before, "edge", "before generation the estimate clears the lowered bar");
    assert.ok(r.quality.model_version.startsWith("quality-"), JSON.stringify(r.quality));
    assert.equal(r.meta.route, "cloud", r.meta.reasons.join("; "));
    assert.match(r.meta.reasons.join(" "), /after prefill: P\(edge answer acceptable\)/);
    assert.equal(r.meta.edge_tokens, "discarded");
    assert.equal(r.meta.edge_tokens_discarded, 0, "the check runs before the first token");
    assert.ok(r.meta.edge_prefill_ms > 0, `the prefill spent on the device is reported: ${r.meta.edge_prefill_ms}`);
    assert.ok(r.meta.model_versions.some((v) => v.startsWith("quality/quality-")), r.meta.model_versions.join(" "));
    // The cloud got the whole conversation, and what was shown is what its stream carried.
    const up = sent.filter((x) => x.url.endsWith("/v1/chat/completions"));
    assert.equal(up.length, 1);
    const body = JSON.parse(up[0].body);
    assert.deepEqual(body.messages.map((m) => m.role), ["user", "assistant", "user"]);
    assert.equal(body.messages[2].content, problem);
    assert.ok(r.deltas.join("").length > 0);
  } finally {
    await context.close();
  }
});

test("network: the word problem the first token sends to the cloud stays on the edge under CDP throttling (5 s round trip, 100 kbit/s)", { skip }, async () => {
  const { context, page, sent } = await freshPage();
  try {
    // The model loads and its speed is measured before the network slows down; on the fast
    // network the first token sends the problem to the cloud.
    const calm = await inPage(page, async (Straddle, _E, config, problem) => {
      const s = await Straddle.create({ ...config, policy: { preset: "balanced" }, backend: "cpu" });
      await s.chat.completions.create({ messages: [{ role: "user", content: "Hi!" }], max_tokens: 8, straddle: { route: "edge" } });
      globalThis.throttled = s;
      const a = await s.chat.completions.create({ messages: [{ role: "user", content: problem }], max_tokens: 24, temperature: 0 });
      return { route: a.straddle.route, reasons: a.straddle.reasons };
    }, problem);
    assert.equal(calm.route, "cloud", calm.reasons.join("; "));
    assert.match(calm.reasons.join(" "), /after prefill: P\(edge answer acceptable\)/);
    const uploads = () => sent.filter((x) => x.url.endsWith("/v1/chat/completions")).length;
    const before = uploads();
    // A round trip well beyond the edge's whole answer, even on a busy 2-core machine where the
    // measured edge speed is low: the test is about the direction of the bar, not a margin.
    const cdp = await context.newCDPSession(page);
    await cdp.send("Network.enable");
    await cdp.send("Network.emulateNetworkConditions", { offline: false, latency: 5000, downloadThroughput: 12_500, uploadThroughput: 12_500 });
    const r = await page.evaluate(async (problem) => {
      const s = globalThis.throttled;
      const messages = [{ role: "user", content: problem }];
      const signal = (d, name) => d.trace.signals.find((x) => x.name === name)?.value;
      // The page's own round trip replaces the Network Information API's seed once measured.
      let d = s.route({ messages, max_tokens: 24 });
      const seeded = signal(d, "rtt_ms");
      for (let i = 0; i < 400 && !s.rtt.ms; i++) await new Promise((r) => setTimeout(r, 100));
      d = s.route({ messages, max_tokens: 24 });
      const a = await s.chat.completions.create({ messages, max_tokens: 24, temperature: 0 });
      return { seeded, rtt: signal(d, "rtt_ms"), bandwidth: signal(d, "bandwidth_kbps"), shift: signal(d, "quality_bar_latency_shift"),
        bar: d.quality?.bar, target: d.target, route: a.straddle.route, reasons: a.straddle.reasons, text: a.choices[0].message.content };
    }, problem);
    assert.ok(r.seeded >= 2000, `navigator.connection seeds the round trip: ${r.seeded}`);
    assert.ok(r.rtt >= 5000 && r.bandwidth === 100, JSON.stringify(r));
    assert.ok(r.shift < -0.25 && r.bar < 0.25, JSON.stringify(r));
    assert.equal(r.target, "edge");
    assert.equal(r.route, "edge", r.reasons.join("; "));
    assert.match(r.reasons.join(" "), /for a cloud [0-9.]+ s slower than the edge/);
    assert.ok(r.text.length > 0);
    assert.equal(uploads(), before, "nothing went to the cloud");
  } finally {
    await context.close();
  }
});

test("a battery reported low and discharging sends a long answer to the cloud; the same request on mains stays put", { skip }, async () => {
  const { context, page } = await freshPage();
  try {
    const r = await inPage(page, async (Straddle, _E, config) => {
      // A named test double of the Battery Status API: 12% and discharging.
      const lowBatteryDouble = async () => ({ level: 0.12, charging: false });
      const messages = [{ role: "user", content: "Tell me a story about a fox who learns to sail." }];
      const onMains = await Straddle.create({ ...config, battery: async () => ({ level: 1, charging: true }) });
      const mains = onMains.route({ messages, max_tokens: 100 });
      await onMains.unload();
      const s = await Straddle.create({ ...config, battery: lowBatteryDouble });
      const decided = s.route({ messages, max_tokens: 100 });
      const a = await s.chat.completions.create({ messages, max_tokens: 100 });
      const signal = (d, name) => d.trace.signals.find((x) => x.name === name)?.value;
      return {
        mains: { rule: mains.trace.rule, drain: signal(mains, "energy_drain") },
        low: { rule: decided.trace.rule, drain: signal(decided, "energy_drain"), joules: signal(decided, "edge_energy_j") },
        route: a.straddle.route, reasons: a.straddle.reasons, text: a.choices[0].message.content,
      };
    });
    assert.notEqual(r.mains.rule, "battery");
    assert.equal(r.mains.drain, 0);
    assert.equal(r.low.rule, "battery");
    assert.ok(r.low.drain > 8 && r.low.joules > 0, JSON.stringify(r.low));
    assert.equal(r.route, "cloud", r.reasons.join("; "));
    assert.match(r.reasons.join(" "), /battery: 12% and discharging/);
    assert.ok(r.text.length > 0);
  } finally {
    await context.close();
  }
});

test("load: a cloud server with a full queue sends a long answer to the edge; the same answer goes to an idle cloud", { skip }, async () => {
  // A cloud server that decodes one answer at a time, kept full by answers asked of it
  // directly, behind a worker of its own.
  const busy = await startCloud(cloudBin, model, ["--max-batch", "1"]);
  const worker = await startWorker({ UPSTREAM_URL: busy.url, ALLOWED_ORIGINS: stack.webUrl });
  const filler = JSON.stringify({ messages: [{ role: "user", content: "Write a long story about the sea." }], max_tokens: 600 });
  const fillers = Array.from({ length: 24 }, () => fetch(`${busy.url}/v1/chat/completions`,
    { method: "POST", headers: { "content-type": "application/json" }, body: filler }).then((r) => r.text()).catch(() => ""));
  const { context, page } = await freshPage();
  try {
    for (let i = 0; ; i++) {
      const load = await (await fetch(`${busy.url}/v1/load`)).json();
      if (load.queued >= 20) break;
      assert.ok(i < 100, `the cloud never queued: ${JSON.stringify(load)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const token = mintToken({ origin: stack.webUrl, sid: "load-cloud" });
    const r = await inPage(page, async (Straddle, _E, config, { busyWorker, token }) => {
      const messages = [{ role: "user", content: "Write a detailed essay on the history of the printing press." }];
      const signal = (d, name) => d.trace.signals.find((x) => x.name === name)?.value;
      const idle = await Straddle.create({ ...config });
      const calm = idle.route({ messages, max_tokens: 600 });
      await idle.unload();
      const s = await Straddle.create({ ...config, worker: busyWorker, token });
      // The load report arrives in the background; a decision uses the latest one.
      let d = s.route({ messages, max_tokens: 600 });
      for (let i = 0; i < 50 && signal(d, "cloud_queued") === undefined; i++) {
        await new Promise((r) => setTimeout(r, 100));
        d = s.route({ messages, max_tokens: 600 });
      }
      await s.unload();
      return { calm: { target: calm.target, rule: calm.trace.rule }, full: { target: d.target, rule: d.trace.rule, reasons: d.reasons,
        queued: signal(d, "cloud_queued"), wait: signal(d, "cloud_queue_s") } };
    }, { busyWorker: worker.url, token });
    assert.deepEqual(r.calm, { target: "cloud", rule: "long_output" });
    assert.equal(r.full.rule, "cloud_queue", JSON.stringify(r.full));
    assert.equal(r.full.target, "edge");
    assert.ok(r.full.queued >= 20 && r.full.wait > 0, JSON.stringify(r.full));
    assert.match(r.full.reasons.join(" "), /cloud queueing/);
  } finally {
    await context.close();
    // Not SIGTERM: the server would first finish every queued filler, minutes that prove
    // nothing here.
    busy.kill("SIGKILL");
    await Promise.all(fillers);
    await worker.mf.dispose().catch(() => {});
  }
});

test("load: with the device busy the next request goes to the cloud; under privacy-strict a private one waits its turn, and both answers are as if each ran alone", { skip }, async () => {
  const { context, page } = await freshPage();
  try {
    const r = await inPage(page, async (Straddle, _E, config) => {
      const long = { messages: [{ role: "user", content: "Tell me a story about a fox who learns to sail." }], max_tokens: 48, temperature: 0, straddle: { route: "edge" } };
      const short = { messages: [{ role: "user", content: "What is the capital of France?" }], max_tokens: 12, temperature: 0 };
      const private_ = { messages: [{ role: "user", content: "Write a one-line greeting to ana.lopez@example.com." }], max_tokens: 12, temperature: 0 };
      const text = (a) => a.choices[0].message.content;
      const s = await Straddle.create({ ...config });
      const first = s.chat.completions.create(long);
      await new Promise((r) => setTimeout(r, 50));
      const busy = s.route(short);
      const second = await s.chat.completions.create(short);
      await first;
      await s.unload();
      // Without a worker every answer is the device's, so each can be compared with itself.
      const strict = await Straddle.create({ ...config, worker: undefined, policy: "privacy-strict" });
      const firstAgain = strict.chat.completions.create(long);
      await new Promise((r) => setTimeout(r, 50));
      const queued = await strict.chat.completions.create(private_);
      const both = [text(await firstAgain), text(queued)];
      const alone = [text(await strict.chat.completions.create(long)), text(await strict.chat.completions.create(private_))];
      const routes = [queued.straddle.route, queued.straddle.reasons.join("; ")];
      await strict.unload();
      return { busy: { rule: busy.trace.rule, wait: busy.trace.signals.find((x) => x.name === "edge_busy_s")?.value },
        second: [second.straddle.route, second.straddle.reasons.join("; ")], routes, both, alone };
    });
    assert.equal(r.busy.rule, "edge_busy", JSON.stringify(r.busy));
    assert.ok(r.busy.wait > 0);
    assert.equal(r.second[0], "cloud", r.second[1]);
    assert.match(r.second[1], /edge busy/);
    assert.equal(r.routes[0], "edge", r.routes[1]);
    assert.match(r.routes[1], /privacy/);
    assert.deepEqual(r.both, r.alone, "queued answers never interleave");
    assert.ok(r.both.every((t) => t.length > 0));
  } finally {
    await context.close();
  }
});

test("edge answers are reported to the worker, counts and versions only, and with the user's ratings show in the tenant's usage by session", { skip }, async () => {
  const { context, page, sent } = await freshPage();
  try {
    const token = mintToken({ origin: stack.webUrl, sid: "usage-edge" });
    const prompt = "Name a colour of the sky.";
    const r = await inPage(page, async (Straddle, _E, config, { token, prompt }) => {
      // A cascade that lets any edge answer stand: this test is about what is reported, and
      // the default one sits near this answer's mean entropy (3.5 nats over 8 tokens).
      const s = await Straddle.create({ ...config, token, policy: { preset: "balanced",
        cascade: { window: 8, min_mean_logprob: -100, max_mean_entropy: 100, detect_refusals: false } } });
      const messages = [{ role: "user", content: prompt }];
      const a = await s.chat.completions.create({ messages, max_tokens: 8, straddle: { route: "edge" } });
      const c = await s.chat.completions.create({ messages, max_tokens: 8, straddle: { route: "cloud" } });
      await s.feedback(a.id, 1);
      await s.feedback(c.id, 0);
      await s.unload();
      return { route: a.straddle.route, cloudRoute: c.straddle.route, text: a.choices[0].message.content, id: a.id, cloudId: c.id };
    }, { token, prompt });
    assert.equal(r.route, "edge");
    assert.equal(r.cloudRoute, "cloud");
    const reports = sent.filter((q) => q.url.endsWith("/v1/usage/edge"));
    assert.equal(reports.length, 1, "one batch, sent before the rating that names its answer");
    assert.ok(!reports[0].body.includes(prompt) && !reports[0].body.includes(r.text.trim()), reports[0].body);
    assert.equal(JSON.parse(reports[0].body).answers[0].id, r.id);
    // The cloud request names its answer; a rating carries an id and a number, nothing else.
    const up = sent.find((q) => q.url.endsWith("/v1/chat/completions"));
    assert.equal(JSON.parse(up.body).straddle.answer_id, r.cloudId);
    const ratings = sent.filter((q) => q.url.endsWith("/v1/feedback")).map((q) => JSON.parse(q.body));
    assert.deepEqual(ratings, [{ feedback: [{ id: r.id, reward: 1 }] }, { feedback: [{ id: r.cloudId, reward: 0 }] }]);
    const groups = (await (await admin(stack.workerUrl, "GET", `/v1/tenants/${TENANT}/usage?group_by=session`)).json()).groups;
    const mine = groups.find((g) => g.key === "usage-edge");
    assert.equal(mine?.requests, 2, JSON.stringify(groups));
    assert.ok(mine.tokens_out > 0);
    assert.equal(mine.cloud_share, 0.5);
    assert.deepEqual([mine.feedback_count, mine.feedback_reward], [2, 0.5]);
  } finally {
    await context.close();
  }
});

test("the cascade hands an unsure edge answer to the cloud mid-stream and says the edge tokens were discarded", { skip }, async () => {
  const { context, page } = await freshPage();
  try {
    // A cascade no answer can satisfy (mean log-probability above −0.001 over 4 tokens).
    const meta = await inPage(page, async (Straddle, _E, config) => {
      const s = await Straddle.create({ ...config, policy: { preset: "low-cost", cloud_price_in_per_1k: 1, cloud_price_out_per_1k: 1,
        cascade: { window: 4, min_mean_logprob: -0.001, max_mean_entropy: 100, detect_refusals: false } } });
      const r = await s.chat.completions.create({ max_tokens: 16, messages: [{ role: "user", content: "Hello! How are you today?" }] });
      return r.straddle;
    });
    assert.equal(meta.route, "cloud");
    assert.equal(meta.escalated_mid_stream, true);
    assert.equal(meta.edge_tokens, "discarded");
    assert.equal(meta.edge_tokens_discarded, 4);
    assert.match(meta.reasons.join(" "), /cascade: /);
  } finally {
    await context.close();
  }
});

test("without WebGPU the package runs the model on its CPU kernels", { skip }, async () => {
  const noGpu = await launch({ webgpu: false });
  try {
    const { page } = await freshPage(noGpu);
    const r = await inPage(page, async (Straddle, _E, config) => {
      const s = await Straddle.create({ ...config, worker: undefined });
      const a = await s.chat.completions.create({ max_tokens: 8, messages: [{ role: "user", content: "Hi" }] });
      return { device: s.device(), meta: a.straddle };
    });
    assert.equal(r.device.webgpu, false);
    assert.equal(r.device.backend, "cpu");
    assert.equal(r.meta.route, "edge");
    assert.match(r.meta.reasons.join(" "), /offline/, "no worker: the router knows only the edge can answer");
  } finally {
    await noGpu.close();
  }
});

// The threaded build exists where the machine has a nightly toolchain (cargo xtask setup);
// `cargo xtask test` sets STRADDLE_REQUIRE_THREADS there, so a broken build fails, not skips.
const threadedBuilt = fs.existsSync(path.join(root, "pkg-threads", "straddle.js"));
const skipThreads = skip || (!threadedBuilt && !process.env.STRADDLE_REQUIRE_THREADS && "web/pkg-threads is not built (no nightly toolchain)");

test("on a cross-origin-isolated page the CPU model runs on a pool of threads, token for token as on one", { skip: skipThreads }, async () => {
  const isolated = createServer({ root, models: path.dirname(model), isolated: true });
  await new Promise((r) => isolated.listen(0, "127.0.0.1", r));
  const isolatedUrl = `http://127.0.0.1:${isolated.address().port}`;
  const noGpu = await launch({ webgpu: false });
  try {
    const answer = async (url, threads) => {
      const { context, page, errors } = await freshPage(noGpu);
      try {
        await page.goto(`${url}/test/blank.html`);
        const r = await page.evaluate(async ([model, threads]) => {
          const { Straddle } = await import("/src/index.js");
          const s = await Straddle.create({ model, threads });
          const a = await s.chat.completions.create({ max_tokens: 24, temperature: 0,
            messages: [{ role: "user", content: "Name three colours of the rainbow." }] });
          const r = { isolated: crossOriginIsolated, cores: navigator.hardwareConcurrency, device: s.device(), text: a.choices[0].message.content, route: a.straddle.route };
          await s.unload();
          return r;
        }, [MODEL_URL, threads]);
        assert.deepEqual(errors, []);
        return r;
      } finally {
        await context.close();
      }
    };
    const one = await answer(stack.webUrl, 2);
    assert.equal(one.isolated, false);
    assert.equal(one.device.threads, 1, "without isolation the page cannot share memory");
    if (one.cores > 1) assert.match(one.device.threadsError, /not cross-origin isolated/);
    const pool = await answer(isolatedUrl, 2);
    assert.equal(pool.isolated, true);
    assert.equal(pool.device.backend, "cpu");
    assert.equal(pool.device.threadsError, null);
    assert.equal(pool.device.threads, Math.min(2, pool.cores));
    assert.equal(pool.route, "edge");
    assert.ok(one.text.length > 0);
    // Each thread computes whole rows, so the arithmetic (and the greedy text) is unchanged.
    assert.equal(pool.text, one.text);
  } finally {
    await noGpu.close();
    isolated.close();
  }
});

test("with backend: \"webgpu\" the model loads onto WebGPU inside the engine's Web Worker and drafts there for the cloud to verify", { skip }, async () => {
  const worker = await startWorker({ UPSTREAM_URL: stack.cloudUrl, UPSTREAM_SUPPORTS_VERIFY: "true", ALLOWED_ORIGINS: stack.webUrl });
  const { context, page } = await freshPage();
  try {
    const token = mintToken({ origin: stack.webUrl, sid: "speculative-webgpu-test" });
    // A few tokens only: SwiftShader emulates the GPU on the CPU (BENCHMARKS.md).
    const r = await inPage(page, async (Straddle, _E, config, { worker, token }) => {
      const s = await Straddle.create({ ...config, worker, token, backend: "webgpu" });
      const messages = [{ role: "user", content: "Write a detailed essay on the history of the printing press." }];
      const ask = async (route) => {
        const a = await s.chat.completions.create({ max_tokens: 6, temperature: 0, messages, straddle: { route } });
        return { text: a.choices[0].message.content, meta: a.straddle, usage: a.usage };
      };
      return { device: await s.device(), spec: await ask("speculative"), cloud: await ask("cloud") };
    }, { worker: worker.url, token });
    assert.equal(r.device.backend, "webgpu");
    assert.equal(r.device.webgpu, true);
    assert.equal(r.spec.meta.route, "speculative", r.spec.meta.reasons.join("; "));
    assert.equal(r.spec.meta.degraded, null);
    assert.equal(r.spec.text, r.cloud.text, "greedy speculative output is the cloud's own");
    const sp = r.spec.meta.speculative;
    assert.ok(sp.verify_calls > 0 && sp.drafted > 0, JSON.stringify(sp));
  } finally {
    await context.close();
    await worker.mf.dispose().catch(() => {});
  }
});

test("a GPU device lost or a crashed engine mid-answer: the model loads again on the CPU kernels and the answer goes on from the text shown, never leaving the device", { skip }, async () => {
  const messages = [{ role: "user", content: "My card number is 4111 1111 1111 1111. Write a short poem about the sea." }];
  const { context, page, sent } = await freshPage();
  try {
    // The uninterrupted answers, on the CPU kernels; the long one so that a crash lands mid-answer.
    const [short, long] = await inPage(page, async (Straddle, _E, config, messages) => {
      const s = await Straddle.create({ ...config, worker: undefined, backend: "cpu" });
      const texts = [];
      for (const max_tokens of [24, 256]) {
        const a = await s.chat.completions.create({ max_tokens, temperature: 0, messages });
        texts.push(a.choices[0].message.content);
      }
      await s.unload();
      return texts;
    }, messages);
    const r = await inPage(page, async (Straddle, _E, config, messages) => {
      const s = await Straddle.create({ ...config, backend: "webgpu" });
      // A streamed answer with a fault injected once text is shown; then what a fresh engine
      // makes of exactly the text shown before the fault, for the test to compare.
      const faulted = async (fault, max_tokens) => {
        let text = "";
        let meta = null;
        for await (const c of await s.chat.completions.create({ stream: true, max_tokens, temperature: 0, messages })) {
          const delta = c.choices[0].delta.content;
          if (delta && !text) s.edge.host.injectFault(fault);
          text += delta ?? "";
          meta = c.straddle ?? meta;
        }
        const resumed = meta.edge?.resumed;
        const shown = text.slice(0, resumed?.after_chars ?? 0);
        const gen = s.edge.host.generate([...messages, { role: "assistant", content: shown }],
          { max_tokens: max_tokens - (resumed?.after_tokens ?? 0), temperature: 0, continue_final_message: true });
        let rest = "";
        for await (const t of gen.tokens) rest += t.type === "token" ? t.text : "";
        return { text, meta, shown, expected: shown + rest, backend: s.device().backend };
      };
      const before = s.device().backend;
      const lost = await faulted("lose-device", 24);
      const next = await s.chat.completions.create({ max_tokens: 4, temperature: 0, messages: [{ role: "user", content: "Hi" }] });
      const crashed = await faulted("crash", 256);
      return { before, lost, next: { route: next.straddle.route, backend: next.straddle.edge?.backend }, crashed };
    }, messages);
    assert.equal(r.before, "webgpu");
    for (const [run, from, error, whole] of [[r.lost, "webgpu", "device_lost", short], [r.crashed, "cpu", "edge_failed", long]]) {
      const { meta } = run;
      assert.equal(meta.route, "edge", meta.reasons.join("; "));
      assert.equal(meta.degraded, null);
      assert.match(meta.reasons.join(" "), /loaded again on the CPU kernels/);
      const { after_tokens, after_chars, ...resumed } = meta.edge.resumed ?? {};
      assert.deepEqual(resumed, { from, to: "cpu", error }, meta.reasons.join("; "));
      assert.ok(after_tokens >= 1 && after_chars >= 1 && run.shown.length === after_chars, JSON.stringify(meta.edge.resumed));
      // Nothing shown twice, nothing dropped: what was shown is the uninterrupted answer's
      // beginning, and what followed is the fresh engine's continuation of exactly that.
      assert.ok(whole.startsWith(run.shown), `shown: ${JSON.stringify(run.shown)}`);
      assert.equal(run.text, run.expected);
      assert.ok(run.text.length > run.shown.length);
      assert.equal(run.backend, "cpu");
    }
    assert.deepEqual(r.next, { route: "edge", backend: "cpu" });
    assert.ok(!sent.some((q) => q.url.includes("/v1/chat/completions")), "the private requests never left the device");
  } finally {
    await context.close();
  }
});

test("response_format: the answer is JSON under its schema on the CPU kernels, on WebGPU and from the cloud; a schema the engine refuses is an invalid_request", { skip }, async () => {
  const worker = await startWorker({ UPSTREAM_URL: stack.cloudUrl, ALLOWED_ORIGINS: stack.webUrl });
  const noGpu = await launch({ webgpu: false });
  const labels = ["positive", "negative", "neutral"];
  const format = (schema, strict = true) => ({ type: "json_schema", json_schema: { name: "label", strict, schema } });
  const label = format({ type: "object", properties: { sentiment: { enum: labels } }, required: ["sentiment"] });
  // Content as text parts, as many clients send it. A few tokens: SwiftShader emulates the GPU.
  const request = { max_tokens: 16, temperature: 0, response_format: label,
    messages: [{ role: "user", content: [{ type: "text", text: "The sentiment of: " }, { type: "text", text: "'The box arrived crushed.'" }] }] };
  const ask = async (b, { backend, route, req = request }) => {
    const { context, page } = await freshPage(b);
    try {
      const token = mintToken({ origin: stack.webUrl, sid: `json-${route}-${backend ?? "auto"}` });
      return await inPage(page, async (Straddle, StraddleError, config, { worker, token, backend, route, req }) => {
        const s = await Straddle.create({ ...config, worker, token, ...(backend && { backend }) });
        try {
          const a = await s.chat.completions.create({ ...req, straddle: { route } });
          return { text: a.choices[0].message.content, finish: a.choices[0].finish_reason, route: a.straddle.route, backend: s.device().backend };
        } catch (e) {
          return { error: e instanceof StraddleError, code: e.code, message: e.message };
        }
      }, { worker: worker.url, token, backend, route, req });
    } finally {
      await context.close();
    }
  };
  try {
    const cpu = await ask(noGpu, { route: "edge" });
    const gpu = await ask(browser, { backend: "webgpu", route: "edge" });
    const cloud = await ask(browser, { route: "cloud" });
    assert.deepEqual([cpu.backend, cpu.route], ["cpu", "edge"], JSON.stringify(cpu));
    assert.deepEqual([gpu.backend, gpu.route], ["webgpu", "edge"], JSON.stringify(gpu));
    assert.equal(cloud.route, "cloud", JSON.stringify(cloud));
    for (const r of [cpu, gpu, cloud]) {
      assert.equal(r.finish, "stop", JSON.stringify(r));
      const answer = JSON.parse(r.text);
      assert.deepEqual(Object.keys(answer), ["sentiment"], r.text);
      assert.ok(labels.includes(answer.sentiment), r.text);
    }
    // Strict, with a keyword the grammar cannot enforce, kept on the device by an offline
    // policy: a typed error naming the field, not a failed device.
    const unenforceable = format({ type: "array", uniqueItems: true });
    const { context, page } = await freshPage(noGpu);
    const refused = await inPage(page, async (Straddle, StraddleError, config, req) => {
      const s = await Straddle.create({ ...config, worker: undefined });
      try {
        await s.chat.completions.create(req);
        return { error: false };
      } catch (e) {
        return { error: e instanceof StraddleError, code: e.code, message: e.message };
      }
    }, { ...request, response_format: unenforceable });
    await context.close();
    assert.deepEqual([refused.error, refused.code], [true, "invalid_request"], JSON.stringify(refused));
    assert.match(refused.message, /response_format.*uniqueItems/);
  } finally {
    await noGpu.close();
    await worker.mf.dispose().catch(() => {});
  }
});

test("tools: a two-turn tool call completes on the CPU kernels, streamed; WebGPU and the cloud call the same function", { skip }, async () => {
  const worker = await startWorker({ UPSTREAM_URL: stack.cloudUrl, ALLOWED_ORIGINS: stack.webUrl });
  const noGpu = await launch({ webgpu: false });
  const weather = { type: "function", function: { name: "get_weather", description: "The current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false } } };
  const question = { role: "user", content: "What is the weather in Paris?" };
  // The two-turn run has no worker: both turns are the device's, the cascade cannot hand the
  // second to the cloud.
  const run = async (b, { backend, route, stream }) => {
    const { context, page } = await freshPage(b);
    try {
      const token = mintToken({ origin: stack.webUrl, sid: `tools-${route}-${backend ?? "auto"}` });
      return await inPage(page, async (Straddle, StraddleError, config, { worker, token, backend, route, stream, weather, question }) => {
        const s = await Straddle.create({ ...config, worker, token, ...(backend && { backend }) });
        const first = { messages: [question], tools: [weather], tool_choice: "required", max_tokens: 40, straddle: { route } };
        let call, finish, shown = "";
        if (stream) {
          const deltas = [];
          for await (const chunk of await s.chat.completions.create({ ...first, stream: true })) {
            const c = chunk.choices[0];
            shown += c.delta.content ?? "";
            deltas.push(...(c.delta.tool_calls ?? []));
            finish = c.finish_reason ?? finish;
          }
          call = deltas.length === 1 ? { id: deltas[0].id, type: deltas[0].type, function: deltas[0].function } : { deltas };
        } else {
          const a = await s.chat.completions.create(first);
          call = a.choices[0].message.tool_calls?.[0];
          finish = a.choices[0].finish_reason;
          shown = a.choices[0].message.content ?? "";
        }
        if (!stream) return { call, finish, shown, backend: s.device().backend };
        const routed = s.route(first);
        const second = await s.chat.completions.create({ max_tokens: 16, straddle: { route }, tools: [weather], tool_choice: "none",
          messages: [question, { role: "assistant", content: null, tool_calls: [call] }, { role: "tool", tool_call_id: call.id, content: "18 degrees and sunny" }] });
        return { call, finish, shown, backend: s.device().backend, reply: second.choices[0].message.content, replyRoute: second.straddle.route,
          routeReasons: routed.reasons };
      }, { worker: stream ? undefined : worker.url, token, backend, route, stream, weather, question });
    } finally {
      await context.close();
    }
  };
  try {
    const cpu = await run(noGpu, { route: "edge", stream: true });
    const gpu = await run(browser, { backend: "webgpu", route: "edge" });
    const cloud = await run(browser, { route: "cloud" });
    assert.equal(cpu.backend, "cpu");
    assert.equal(gpu.backend, "webgpu");
    for (const r of [cpu, gpu, cloud]) {
      assert.equal(r.finish, "tool_calls", JSON.stringify(r));
      assert.equal(r.shown, "", "a call is never shown as content");
      assert.equal(r.call.function.name, "get_weather", JSON.stringify(r));
      assert.equal(typeof JSON.parse(r.call.function.arguments).city, "string", JSON.stringify(r));
      assert.match(r.call.id, /^call_/);
    }
    assert.equal(cpu.replyRoute, "edge");
    assert.ok(cpu.routeReasons.some((r) => /structured output: a tool call under a small schema/.test(r)), JSON.stringify(cpu.routeReasons));
    assert.ok(cpu.reply.length > 0, JSON.stringify(cpu));
  } finally {
    await noGpu.close();
    await worker.mf.dispose().catch(() => {});
  }
});

test("a reload takes the model from the store: no second download", { skip }, async () => {
  const { context, page } = await freshPage();
  try {
    const downloads = () => stack.requests.filter((r) => r === `GET ${MODEL_URL}`).length;
    const headers = () => stack.requests.filter((r) => r.startsWith(`GET ${MODEL_URL} bytes=0-`)).length;
    const before = [downloads(), headers()];
    await openDemo(page);
    assert.deepEqual([downloads(), headers()], [before[0] + 1, before[1] + 1], "the header read first, then the model once");
    assert.doesNotMatch(await page.textContent("#engine"), /from cache/);
    await page.reload();
    await page.waitForFunction(() => document.body.dataset.ready, null, { timeout: 5 * MINUTES });
    assert.match(await page.textContent("#engine"), /model from cache/);
    assert.deepEqual([downloads(), headers()], [before[0] + 1, before[1] + 1], "the reload read neither from the network again");
  } finally {
    await context.close();
  }
});

test("bad input gets a typed error: a malformed request, a corrupted or truncated model, an abort", { skip }, async () => {
  const { context, page } = await freshPage();
  try {
    const r = await inPage(page, async (Straddle, StraddleError, config) => {
      const out = {};
      const code = async (p) => p.then(() => "resolved", (e) => (e instanceof StraddleError ? `${e.code}${e.param ? ":" + e.param : ""}` : `untyped: ${e}`));
      out.noRoute = await code(Straddle.create({ cloud: false }));
      out.wrongSha = await code(Straddle.create({ ...config, worker: undefined, sha256: "0".repeat(64) }));
      // No SHA-256 for it, so the engine's own reading of the file is what refuses it.
      out.truncated = await code(Straddle.create({ ...config, worker: undefined, model: "/models/truncated.gguf", sha256: undefined, cacheModel: false }));
      // With a cloud to fall back on, a bad model leaves a working client that says why.
      const s = await Straddle.create({ ...config, model: "/models/truncated.gguf", sha256: undefined, cacheModel: false });
      out.fallbackDevice = s.device();
      out.fallbackAnswer = (await s.chat.completions.create({ max_tokens: 4, messages: [{ role: "user", content: "Hi" }] })).straddle;
      const edgeOnly = await Straddle.create({ ...config, worker: undefined });
      out.badRole = await code(edgeOnly.chat.completions.create({ messages: [{ role: "robot", content: "hi" }] }));
      out.badTemp = await code(edgeOnly.chat.completions.create({ messages: [{ role: "user", content: "hi" }], temperature: 7 }));
      out.noMessages = await code(edgeOnly.chat.completions.create({ messages: [] }));
      const ac = new AbortController();
      const stream = await edgeOnly.chat.completions.create({ stream: true, max_tokens: 200, signal: ac.signal, messages: [{ role: "user", content: "Count from one to one hundred." }] });
      out.aborted = await code((async () => { for await (const _ of stream) ac.abort(); })());
      // The engine is still usable after the abort.
      out.after = (await edgeOnly.chat.completions.create({ max_tokens: 4, messages: [{ role: "user", content: "Hi" }] })).straddle.route;
      return out;
    });
    assert.equal(r.noRoute, "invalid_options");
    assert.equal(r.wrongSha, "model_integrity");
    assert.equal(r.truncated, "model_invalid");
    // Its header ends past its last byte: refused before any download.
    assert.match(r.fallbackDevice.error, /the model's header is not one the engine runs: .* cannot fit/);
    assert.equal(r.fallbackAnswer.route, "cloud");
    assert.match(r.fallbackAnswer.degraded, /on-device model is unavailable \(model_invalid\)/);
    assert.equal(r.badRole, "invalid_request:messages[0].role");
    assert.equal(r.badTemp, "invalid_request:temperature");
    assert.equal(r.noMessages, "invalid_request:messages");
    assert.equal(r.aborted, "aborted");
    assert.equal(r.after, "edge");
  } finally {
    await context.close();
  }
});

/**
 * A copy of the React example with the package installed the way users install it: from the
 * tarball `npm pack` makes (only what package.json's `files` ships), not a link to the tree.
 */
function exampleWithPackedPackage() {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), "straddle-react-"));
  const tarball = execFileSync("npm", ["pack", "--silent", "--pack-destination", work], { cwd: root }).toString().trim();
  const example = path.join(work, "react");
  const source = path.join(root, "examples", "react");
  const built = path.join(source, "dist");
  fs.cpSync(source, example, {
    recursive: true, verbatimSymlinks: true, filter: (src) => src !== built && !src.startsWith(built + path.sep),
  });
  fs.rmSync(path.join(example, "node_modules", "straddle"), { force: true });
  execFileSync("npm", ["install", "--no-save", "--prefer-offline", "--no-audit", "--no-fund", path.join(work, tarball)],
    { cwd: example, stdio: "inherit" });
  return { work, example };
}

test("the React example (Vite) builds against the package and answers", { skip }, async () => {
  const { work, example } = exampleWithPackedPackage();
  // Built where the test server serves the example from.
  const outDir = path.join(root, "examples", "react", "dist");
  execFileSync(path.join(example, "node_modules", ".bin", "vite"), ["build", "--logLevel", "warn", "--outDir", outDir, "--emptyOutDir"],
    { cwd: example, stdio: "inherit" });
  assert.ok(!fs.lstatSync(path.join(example, "node_modules", "straddle")).isSymbolicLink(), "the packed package, not a link");
  fs.rmSync(work, { recursive: true, force: true });
  const { context, page, errors } = await freshPage();
  try {
    await page.goto(`${stack.webUrl}/examples/react/dist/`);
    await page.waitForSelector("button", { timeout: 5 * MINUTES });
    await page.click("button");
    await page.waitForSelector("#route", { timeout: 10 * MINUTES });
    assert.match(await page.getAttribute("#route", "data-route"), /^(edge|cloud)$/);
    assert.ok((await page.textContent("#answer")).trim().length > 0);
    assert.deepEqual(errors, []);
  } finally {
    await context.close();
  }
});

test("with learn: true, feedback steers later routing and survives a reload (IndexedDB)", { skip }, async () => {
  const { context, page } = await freshPage();
  try {
    const messages = [{ role: "user", content: "Hello! How are you today?" }];
    const first = await inPage(page, async (Straddle, _E, config, messages) => {
      const s = await Straddle.create({ ...config, learn: true });
      const before = s.route({ messages, max_tokens: 2 });
      // The user likes the cloud's answers to this kind of prompt and not the device's.
      for (let i = 0; i < 4; i++) {
        for (const route of ["edge", "cloud"]) {
          const r = await s.chat.completions.create({ messages, max_tokens: 2, straddle: { route } });
          await s.feedback(r.id, route === "cloud" ? 1 : 0);
        }
      }
      const after = s.route({ messages, max_tokens: 2 });
      return { before: before.target, after: after.target, reasons: after.reasons, stats: await s.stats() };
    }, messages);
    assert.equal(first.before, "edge", "the quality model expects the edge to answer a greeting well");
    assert.equal(first.after, "cloud", first.reasons.join("; "));
    assert.match(first.reasons.join(" "), /learned from feedback/);
    assert.equal(first.stats.feedback.cloud.count, 4);
    await page.reload();
    const again = await inPage(page, async (Straddle, _E, config, messages) => {
      const s = await Straddle.create({ ...config, learn: true });
      return s.route({ messages, max_tokens: 2 }).target;
    }, messages);
    assert.equal(again, "cloud", "the learned state came back from IndexedDB");
  } finally {
    await context.close();
  }
});
