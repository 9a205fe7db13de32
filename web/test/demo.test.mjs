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
