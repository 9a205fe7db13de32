// The model store in Debian's Chromium, against the project's own static server: a download
// cut off partway resumes with a range request and fetches only the rest, the stored model is
// listed and deleted through `Straddle.models`, a stored model is hashed once and its recorded
// digest still held to the one the page asks for, and a site without room is refused before
// any byte of the model is downloaded.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { launch, root, model } from "./stack.mjs";
import { createServer, sha256File } from "../scripts/serve.mjs";
import { needsEnv } from "../../worker/test/harness.mjs";

const skip = needsEnv("STRADDLE_TEST_MODEL");
const MINUTES = 60_000;
/** What the page reads of a model it does not store before downloading it: its header. */
const HEADER_READ = 8 << 20;

let web;
let webUrl;
let browser;
let modelUrl;
let sha256;
let size;
/** Body bytes the server sent, and whole-file answers still to be cut at a byte count. */
const served = { bytes: 0 };
const cut = {};

before(async () => {
  if (skip) return;
  modelUrl = `/models/${path.basename(model)}`;
  size = fs.statSync(model).size;
  sha256 = await sha256File(model);
  web = createServer({ root, models: path.dirname(model), config: {}, cut, onServed: (p, n) => { if (p === modelUrl) served.bytes += n; } });
  webUrl = await new Promise((r) => web.listen(0, "127.0.0.1", () => r(`http://127.0.0.1:${web.address().port}`)));
  browser = await launch({ webgpu: false });
});
after(async () => {
  await browser?.close();
  web?.close();
});

/** Runs `fn(Straddle, arg)` in a new page of `context`, on the package's module API. */
async function inPage(context, fn, arg, initScript) {
  const page = await context.newPage();
  if (initScript) await page.addInitScript(initScript);
  try {
    await page.goto(`${webUrl}/test/blank.html`);
    return await page.evaluate(async ([src, arg]) => {
      const { Straddle } = await import("/src/index.js");
      // eslint-disable-next-line no-new-func
      return new Function("Straddle", "arg", `return (${src})(Straddle, arg);`)(Straddle, arg);
    }, [fn.toString(), arg]);
  } finally {
    await page.close();
  }
}

/**
 * Loads the model in a page of `context`: the device report and the progress events, or the
 * error's code and message.
 */
const load = (context, initScript, expected = sha256) => inPage(context, async (Straddle, { model, sha256 }) => {
  const progress = [];
  try {
    const s = await Straddle.create({ model, sha256, backend: "cpu", threads: 1, onProgress: (p) => progress.push(p) });
    const device = s.device();
    await s.unload();
    return { device, progress };
  } catch (e) {
    return { code: e.code, message: e.message };
  }
}, { model: modelUrl, sha256: expected }, initScript);

const models = (context) => inPage(context, (Straddle) => Straddle.models.list());

test("a model download cut at 60 % resumes from what was kept, and the store lists and deletes it", { skip, timeout: 10 * MINUTES }, async () => {
  const context = await browser.newContext();
  try {
    cut[modelUrl] = Math.floor(0.6 * size);
    const first = await load(context);
    assert.equal(first.code, "model_fetch", JSON.stringify(first));
    const [partial] = await models(context);
    assert.equal(partial.complete, false, JSON.stringify(partial));
    assert.ok(partial.bytes > 0.5 * size && partial.bytes <= 0.6 * size, `kept ${partial.bytes} of ${size}`);

    const before = served.bytes;
    const second = await load(context);
    assert.ok(second.device, JSON.stringify(second));
    assert.equal(second.device.sha256, sha256, "the resumed file is the model, byte for byte");
    assert.equal(second.device.resumedFrom, partial.bytes);
    const again = served.bytes - before;
    assert.ok(again <= 0.45 * size, `the resumed load downloaded ${again} of ${size} bytes again`);
    // Progress a person can read: the kept bytes, the download with its rate and time left,
    // then verifying, compiling and ready, in that order.
    const phases = second.progress.map((p) => p.phase).filter((p, i, all) => p !== all[i - 1]);
    assert.deepEqual(phases, ["cache", "download", "verify", "compile", "ready"]);
    const last = second.progress.filter((p) => p.phase === "download").at(-1);
    assert.ok(last.bytesPerS > 0 && last.secondsLeft === 0 && last.loaded === size, JSON.stringify(last));

    const [whole] = await models(context);
    assert.deepEqual({ ...whole, id: undefined }, { id: undefined, url: `${webUrl}${modelUrl}`, bytes: size, total: size, complete: true, sha256 });
    const third = await load(context);
    assert.equal(third.device.fromCache, true);
    assert.equal(served.bytes - before, again, "a stored model downloads nothing");
    // The store hashed the file once; loading it unchanged takes that digest, not another pass.
    assert.equal(third.device.sha256, sha256);
    assert.deepEqual(third.progress.map((p) => p.phase).filter((p, i, all) => p !== all[i - 1]), ["cache", "compile", "ready"]);

    const deleted = await inPage(context, async (Straddle, id) => {
      await Straddle.models.delete(id);
      const left = await Straddle.models.list();
      const twice = await Straddle.models.delete(id).then(() => null, (e) => e.code);
      return { left, twice };
    }, whole.id);
    assert.deepEqual(deleted, { left: [], twice: "model_not_found" });
  } finally {
    await context.close();
  }
});

test("a stored model whose digest is not the one the page asks for is refused and dropped, and the next load fetches it again", { skip, timeout: 10 * MINUTES }, async () => {
  const context = await browser.newContext();
  try {
    const first = await load(context);
    assert.ok(first.device, JSON.stringify(first));
    const [stored] = await models(context);
    assert.equal(stored.sha256, sha256, "the store records the digest it checked");
    // The page now expects another file at the same URL (a new release of the model): the
    // digest the store recorded must not pass for it.
    const other = await load(context, undefined, "0".repeat(64));
    assert.equal(other.code, "model_integrity", JSON.stringify(other));
    assert.deepEqual(await models(context), [], "the stored copy is dropped");
    const before = served.bytes;
    const fetched = await load(context);
    assert.equal(fetched.device?.sha256, sha256, JSON.stringify(fetched));
    assert.equal(served.bytes - before, HEADER_READ + size, "the next load reads the header, then the whole model again");
    assert.ok(fetched.progress.some((p) => p.phase === "verify"), "and hashes it");
  } finally {
    await context.close();
  }
});

test("a site without room for the model is refused before any byte of it is downloaded, with the bytes named", { skip, timeout: 5 * MINUTES }, async () => {
  const context = await browser.newContext();
  try {
    const before = served.bytes;
    // A quota of 10 MB, 4 MB of it used, as a nearly full phone reports it.
    const full = () => {
      StorageManager.prototype.estimate = async () => ({ quota: 10e6, usage: 4e6 });
    };
    const r = await load(context, full);
    assert.equal(r.code, "storage_quota", JSON.stringify(r));
    assert.match(r.message, /needs \d+ MB more of storage and this site has 6 MB free/);
    assert.equal(served.bytes, before, "no byte of the model was downloaded");
  } finally {
    await context.close();
  }
});
