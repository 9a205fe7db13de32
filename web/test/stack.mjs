// The whole stack for browser tests, started for real: the cloud server (a process on
// 127.0.0.1 with the real model), the worker under local workerd (Miniflare), the static
// server for the package and the demo, and Debian's Chromium driven by playwright-core.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { catalogFromEnv, createServer } from "../scripts/serve.mjs";
import { startWorker, mintToken, startCloud } from "../../worker/test/harness.mjs";

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
export const model = process.env.STRADDLE_TEST_MODEL;
export const cloudBin = process.env.STRADDLE_CLOUD_BIN;
/** The real pair: Qwen2.5-Coder-0.5B on the device, the 1.5B in the cloud. */
export const qwenEdge = process.env.STRADDLE_TEST_QWEN;
export const qwenCloud = process.env.STRADDLE_TEST_QWEN_CLOUD;

export const CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu-sandbox", "--disable-dev-shm-usage", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"];

const listen = (server) => new Promise((r) => server.listen(0, "127.0.0.1", () => r(`http://127.0.0.1:${server.address().port}`)));

/**
 * Starts the cloud server (serving `cloudModel`) and the worker in front of it, and serves
 * the page with `pageModel` as its edge model; `stopWorker` simulates an outage. Both default
 * to the smallest model, for the tests that need speed. `requests` lists what the page's
 * server was asked, as `"METHOD /path"`, a range request's range after it.
 */
export async function startStack({ cloudModel = model, pageModel = model } = {}) {
  const requests = [];
  const cloud = await startCloud(cloudBin, cloudModel);
  const models = path.dirname(model);
  // The page's origin must be known before the worker starts (CORS and the token's origin),
  // and the worker's URL before the page is served: a config object fills in between. The
  // tests that need speed run the smallest model; the picker offers every one.
  const catalog = catalogFromEnv();
  const url = `/models/${path.basename(pageModel)}`;
  const config = { models: catalog, model: url, sha256: catalog.find((m) => m.url === url)?.sha256 };
  // A model cut off after 1 MiB: what a hostile or broken mirror might serve.
  const files = { "/models/truncated.gguf": fs.readFileSync(model).subarray(0, 1 << 20) };
  const web = createServer({ root, models, config, files, onRequest: (req) => requests.push(`${req.method} ${req.url}${req.headers.range ? ` ${req.headers.range}` : ""}`) });
  const webUrl = await listen(web);
  const worker = await startWorker({ UPSTREAM_URL: cloud.url, ALLOWED_ORIGINS: webUrl });
  config.worker = worker.url;
  // The whole suite shares this token: it outlives the harness's ten-minute default, within
  // the worker's one-hour limit.
  config.token = mintToken({ origin: webUrl, sid: "browser-test", exp: Math.floor(Date.now() / 1000) + 3000 });
  return {
    webUrl, workerUrl: worker.url, cloudUrl: cloud.url, config, requests,
    async stopWorker() { await worker.mf.dispose(); },
    async close() {
      await worker.mf.dispose().catch(() => {});
      web.close();
      cloud.kill();
    },
  };
}

/** A Chromium with WebGPU (SwiftShader) unless `webgpu` is false. */
export function launch({ webgpu = true } = {}) {
  return chromium.launch({ executablePath: "/usr/bin/chromium", headless: true,
    args: [...CHROMIUM_ARGS, webgpu ? "--enable-unsafe-webgpu" : "--disable-webgpu"] });
}
