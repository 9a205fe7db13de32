// Forwarding under local workerd to the real cloud server (a process on 127.0.0.1 with the
// real model). Skips with a message when the binary or the model is not given.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startWorker, chat, admin, freePort, startCloud } from "./harness.mjs";
import { startFakeUpstream } from "./fake-upstream.mjs";

const cloudBin = process.env.STRADDLE_CLOUD_BIN;
const model = process.env.STRADDLE_TEST_MODEL;
const skip = !cloudBin || !model ? "set STRADDLE_CLOUD_BIN and STRADDLE_TEST_MODEL (cargo xtask test does)" : false;

let cloud, worker, deadWorker;
before(async () => {
  if (skip) return;
  cloud = await startCloud(cloudBin, model);
  worker = await startWorker({ UPSTREAM_URL: cloud.url });
  // An upstream port where nothing listens.
  deadWorker = await startWorker({ UPSTREAM_URL: `http://127.0.0.1:${await freePort()}` });
});
after(async () => {
  await worker?.mf.dispose();
  await deadWorker?.mf.dispose();
  cloud?.kill();
});

test("a chat request reaches the cloud server and streams back through workerd", { skip }, async () => {
  const res = await chat(worker.url, { messages: [{ role: "user", content: "List three primary colors." }], max_tokens: 8, stream: true });
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type"), /text\/event-stream/);
  const text = await res.text();
  assert.match(text, /data: \[DONE\]/);
  const content = text.split("\n").filter((l) => l.startsWith("data: {"))
    .map((l) => JSON.parse(l.slice(6))).flatMap((c) => c.choices).map((c) => c.delta.content ?? "").join("");
  assert.ok(content.length > 0, "streamed some text");
  // The stream was settled and recorded (in waitUntil, after the last byte).
  let usage;
  for (let i = 0; i < 50; i++) {
    usage = await (await admin(worker.url, "GET", "/v1/tenants/acme/usage?group_by=outcome")).json();
    if (usage.groups.length && usage.in_flight === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(usage.groups.find((g) => g.key === "ok")?.requests, 1);
  assert.ok(usage.groups[0].tokens_out > 0);
});

test("continue_final_message reaches the cloud, which continues the assistant's unfinished turn", { skip }, async () => {
  const ask = async (body) => {
    const res = await chat(worker.url, { max_tokens: 12, ...body });
    assert.equal(res.status, 200);
    return (await res.json()).choices[0].message.content;
  };
  const user = { role: "user", content: "List three primary colors." };
  const whole = await ask({ messages: [user] });
  const partial = whole.split(" ").slice(0, 3).join(" ");
  const rest = await ask({ messages: [user, { role: "assistant", content: partial }], continue_final_message: true });
  assert.ok((partial + rest).startsWith(whole), `${JSON.stringify(partial)} + ${JSON.stringify(rest)} vs ${JSON.stringify(whole)}`);
  // A turn that is not the assistant's cannot be continued: refused at the edge, named.
  const bad = await chat(worker.url, { messages: [user], continue_final_message: true });
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.param, "continue_final_message");
});

test("response_format, penalties and text parts pass through to the upstream as sent, and the real cloud holds the answer to the schema", { skip }, async () => {
  const schema = { type: "object", properties: { name: { type: "string" }, age: { type: "integer" } }, required: ["name", "age"] };
  const body = {
    messages: [{ role: "user", content: [{ type: "text", text: "Extract the person: Maria Lopez is 34 years old." }] }],
    response_format: { type: "json_schema", json_schema: { name: "person", strict: true, schema } },
    presence_penalty: 0.1, logit_bias: { "0": -100 }, max_tokens: 48,
  };
  const res = await chat(worker.url, body);
  const answer = await res.json();
  assert.equal(res.status, 200, JSON.stringify(answer));
  assert.equal(answer.choices[0].finish_reason, "stop");
  const person = JSON.parse(answer.choices[0].message.content);
  assert.deepEqual(Object.keys(person).sort(), ["age", "name"]);
  assert.ok(Number.isInteger(person.age));
  // A third-party upstream gets the fields as the page sent them, to enforce with its own
  // grammar engine.
  const fake = await startFakeUpstream();
  const viaFake = await startWorker({ UPSTREAM_URL: fake.url });
  try {
    const r = await chat(viaFake.url, body);
    assert.equal(r.status, 200);
    for (const field of ["response_format", "presence_penalty", "logit_bias", "messages"]) {
      assert.deepEqual(fake.state.last.body[field], body[field], field);
    }
    // A schema the cloud's grammar refuses is its 400, relayed with the field named.
    const bad = await chat(worker.url, { ...body, response_format: { type: "json_schema", json_schema: { name: "n", strict: true, schema: { type: "array", uniqueItems: true } } } });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.param, "response_format");
    // A field the protocol does not implement is refused at the worker, by name.
    const tools = await chat(worker.url, { ...body, tools: [] });
    assert.equal(tools.status, 400);
    assert.equal((await tools.json()).error.param, "tools");
  } finally {
    await viaFake.mf.dispose();
    fake.close();
  }
});

test("malformed JSON is refused at the edge with the field named", { skip }, async () => {
  const res = await chat(worker.url, '{"messages":[{"role":"user","content":"x"}],"max_token":5}');
  assert.equal(res.status, 400);
  const body = await res.json();
  assert.equal(body.error.param, "max_token");
});

test("an unreachable upstream is a 502 in OpenAI's error shape", { skip }, async () => {
  const res = await chat(deadWorker.url, { messages: [{ role: "user", content: "hi" }], max_tokens: 4 });
  assert.equal(res.status, 502);
  assert.equal((await res.json()).error.type, "upstream_error");
});

test("a card number is refused with 451 and never reaches the upstream", { skip }, async () => {
  // The dead upstream proves nothing was forwarded: forwarding would have produced a 502.
  const res = await chat(deadWorker.url, { messages: [{ role: "user", content: "charge 4111 1111 1111 1111 please" }] });
  assert.equal(res.status, 451);
  const body = await res.json();
  assert.equal(body.error.type, "privacy_refused");
  assert.match(body.error.message, /payment_card/);
  assert.doesNotMatch(JSON.stringify(body), /4111/);
});
