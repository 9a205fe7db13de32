// Browser end-to-end: the demo page in Debian's Chromium, driven by playwright-core.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { createServer } from "../scripts/serve.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
let server, base;

const ARGS = ["--no-sandbox", "--disable-gpu-sandbox", "--disable-dev-shm-usage", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"];

before(async () => {
  server = createServer({ root });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${server.address().port}`;
});
after(() => server?.close());

async function openDemo(extraArgs) {
  const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true, args: [...ARGS, ...extraArgs] });
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(`${base}/demo/`);
  await page.waitForFunction(() => document.body.dataset.ready, null, { timeout: 60_000 });
  return { browser, page, errors };
}

test("demo page loads the wasm package and finds WebGPU with the flag", async () => {
  const { browser, page, errors } = await openDemo(["--enable-unsafe-webgpu"]);
  try {
    assert.equal(await page.evaluate(() => document.body.dataset.ready), "1", errors.join("\n"));
    assert.match(await page.textContent("#webgpu"), /^yes/);
    assert.equal(await page.textContent("#pii"), "email, payment_card");
  } finally {
    await browser.close();
  }
});

test("without the WebGPU flag the page says so instead of failing", async () => {
  const { browser, page } = await openDemo(["--disable-webgpu"]);
  try {
    assert.equal(await page.evaluate(() => document.body.dataset.ready), "1");
    assert.equal(await page.textContent("#webgpu"), "not available");
  } finally {
    await browser.close();
  }
});

test("the page answers on the device with the real model and shows the route", { skip: !process.env.STRADDLE_TEST_MODEL && "set STRADDLE_TEST_MODEL (cargo xtask test does)" }, async () => {
  const models = path.dirname(process.env.STRADDLE_TEST_MODEL);
  const withModels = createServer({ root, models });
  await new Promise((r) => withModels.listen(0, "127.0.0.1", r));
  const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true, args: [...ARGS, "--enable-unsafe-webgpu"] });
  try {
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${withModels.address().port}/demo/`);
    await page.waitForFunction(() => document.body.dataset.ready === "1", null, { timeout: 60_000 });
    // A card number: the router must keep this on the device, and the page answers there.
    await page.fill("#prompt", "My card 4111 1111 1111 1111 was stolen. What should I do?");
    await page.click("#ask");
    await page.waitForFunction(() => document.body.dataset.answered === "1", null, { timeout: 300_000 });
    assert.equal(await page.textContent("#route"), "edge");
    assert.match(await page.textContent("#reasons"), /privacy: PaymentCard stays on this device/);
    const answer = await page.textContent("#answer");
    assert.ok(answer.trim().length > 0, "an answer was generated");
    // Chromium here offers only SwiftShader, a software adapter: the page must pick its CPU kernels.
    assert.match(await page.textContent("#webgpu"), /software adapter/);
    assert.match(await page.textContent("#stats"), /^edge · cpu · \d+ tokens/, "the page answered on its CPU kernels");
    await page.screenshot({ path: path.join(root, "test", "demo-edge-answer.png") });
  } finally {
    await browser.close();
    withModels.close();
  }
});
