// False refusals and overshoot of the tenant budget, worst-case holds beside growing holds:
// the worker under local workerd in front of the real cloud server, a tenant with a daily
// token budget, short real answers asked for with a large max_tokens. First a burst of
// concurrent streams, then (on a fresh tenant) requests one at a time until the first
// refusal. Prints a Markdown table.
//
//   node bench/budget.mjs --cloud <straddle-cloud> --model <file.gguf>
import { startWorker, startCloud, admin, chat, mintToken } from "../test/harness.mjs";

const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
};
const cloudBin = arg("cloud");
const model = arg("model");
if (!cloudBin || !model) throw new Error("--cloud <straddle-cloud> and --model <file.gguf> are required");
const BURST = Number(arg("burst", 200));
const SEQUENTIAL = Number(arg("sequential", 100));
const DAILY_TOKENS = Number(arg("daily-tokens", 5000));
const MAX_TOKENS = Number(arg("max-tokens", 512));
const TOPICS = ["rain", "tea", "chess", "bees", "maps", "jazz", "salt", "kites", "glass", "owls",
  "bread", "tides", "clocks", "moss", "ink", "snow", "bridges", "lemons", "wolves", "paper"];

/** One streamed request; what came of it. */
async function ask(tenant, i) {
  const body = {
    messages: [{ role: "user", content: `In one short sentence, what is ${TOPICS[i % TOPICS.length]}?` }],
    max_tokens: MAX_TOKENS, temperature: 0, stream: true, stream_options: { include_usage: true },
  };
  const token = mintToken({ ten: tenant, sub: `user-${i % 7}` }, `${tenant}-secret`);
  const res = await chat(worker.url, body, { token });
  if (res.status !== 200) {
    const text = await res.text();
    if (res.status === 402) return { outcome: "refused" };
    let message = "";
    try { message = JSON.parse(text).error?.message ?? ""; } catch { /* not JSON */ }
    return { outcome: `${res.status} ${message}`.trim() };
  }
  const events = (await res.text()).split("\n").filter((l) => l.startsWith("data: {")).map((l) => JSON.parse(l.slice(6)));
  const cut = events.some((e) => e.straddle?.budget_exhausted);
  const usage = events.find((e) => e.usage)?.usage;
  const error = events.find((e) => e.error)?.error?.message;
  return { outcome: cut ? "cut" : usage ? "served" : `incomplete${error ? `: ${error}` : ""}`, tokens: usage?.total_tokens };
}

async function spent(tenant) {
  for (let i = 0; i < 100; i++) {
    const u = await (await admin(worker.url, "GET", `/v1/tenants/${tenant}/usage`)).json();
    if (u.in_flight === 0) return (u.groups[0]?.tokens_in ?? 0) + (u.groups[0]?.tokens_out ?? 0);
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${tenant}: holds still in flight`);
}

const count = (results, outcome) => results.filter((r) => r.outcome === outcome).length;
/** The outcomes that are neither served, ended by the budget nor refused, with counts. */
function otherKinds(results) {
  const kinds = new Map();
  for (const { outcome } of results) {
    if (!["served", "cut", "refused"].includes(outcome)) kinds.set(outcome, (kinds.get(outcome) ?? 0) + 1);
  }
  return [...kinds].map(([k, n]) => `${n}× ${k}`).join("; ");
}

async function burst(tenant, holds) {
  await admin(worker.url, "PUT", `/v1/tenants/${tenant}`, { holds, daily_tokens: DAILY_TOKENS });
  const results = await Promise.all(Array.from({ length: BURST }, (_, i) => ask(tenant, i)));
  return { results, spent: await spent(tenant), unspentAtRefusal: null };
}

async function oneAtATime(tenant, holds) {
  await admin(worker.url, "PUT", `/v1/tenants/${tenant}`, { holds, daily_tokens: DAILY_TOKENS });
  const results = [];
  let unspentAtRefusal = null;
  for (let i = 0; i < SEQUENTIAL; i++) {
    const r = await ask(tenant, i);
    results.push(r);
    if (r.outcome === "refused" && unspentAtRefusal === null) unspentAtRefusal = DAILY_TOKENS - (await spent(tenant));
    if (r.outcome === "refused") break;
  }
  return { results, spent: await spent(tenant), unspentAtRefusal };
}

// The server queues the whole burst, so the table measures the budget, not the upstream's
// own admission (its default queue of 64 answers 503 past that, and the breaker opens).
process.env.STRADDLE_CLOUD_QUEUE = String(BURST + 16);
const cloud = await startCloud(cloudBin, model);
const rows = [];
let worker;
try {
  for (const [phase, run, tenant, holds] of [
    [`burst of ${BURST}`, burst, "bw", "worst_case"], [`burst of ${BURST}`, burst, "bg", "growing"],
    ["one at a time", oneAtATime, "sw", "worst_case"], ["one at a time", oneAtATime, "sg", "growing"],
  ]) {
    // A fresh worker a row: no breaker or isolate state carries over.
    worker = await startWorker({ UPSTREAM_URL: cloud.url, PRICE_IN_PER_1K: "1", PRICE_OUT_PER_1K: "1",
      [`TENANT_SECRET_${tenant.toUpperCase()}`]: `${tenant}-secret` });
    const r = await run(tenant, holds);
    await worker.mf.dispose();
    worker = null;
    const served = r.results.filter((x) => x.outcome === "served");
    const mean = served.reduce((a, x) => a + x.tokens, 0) / Math.max(1, served.length);
    rows.push({ phase, holds, sent: r.results.length, served: served.length, cut: count(r.results, "cut"),
      refused: count(r.results, "refused"), other: r.results.length - served.length - count(r.results, "cut") - count(r.results, "refused"),
      mean, k: DAILY_TOKENS / Math.max(1, mean), spent: r.spent, unspent: r.unspentAtRefusal,
      otherKinds: otherKinds(r.results) });
  }
} finally {
  await worker?.mf.dispose();
  cloud.kill();
}
console.log(`Tenant budget: daily_tokens ${DAILY_TOKENS}; every request max_tokens ${MAX_TOKENS}, streamed, temperature 0.\n`);
console.log("| phase | holds | sent | served in full | ended by the budget | refused | other | mean tokens of a served exchange | K = budget ÷ mean | tokens billed | unspent at the first refusal |");
console.log("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
const others = rows.filter((r) => r.other).map((r) => `- ${r.phase}, ${r.holds}: ${r.otherKinds}`);
for (const r of rows) {
  console.log(`| ${r.phase} | ${r.holds} | ${r.sent} | ${r.served} | ${r.cut} | ${r.refused} | ${r.other} | ${r.mean.toFixed(1)} | ${r.k.toFixed(0)} | ${r.spent} of ${DAILY_TOKENS} | ${r.unspent ?? "—"} |`);
}
if (others.length) console.log(`\nOther outcomes:\n${others.join("\n")}`);
