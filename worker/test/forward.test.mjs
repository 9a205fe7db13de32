// Forwarding under local workerd to the real cloud server (a process on 127.0.0.1 with the
// real model). Skips with a message when the binary or the model is not given.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startWorker, chat, admin, freePort, startCloud, mintToken, ORIGIN, needsEnv } from "./harness.mjs";
import { startFakeUpstream } from "./fake-upstream.mjs";

const cloudBin = process.env.STRADDLE_CLOUD_BIN;
const model = process.env.STRADDLE_TEST_MODEL;
const skip = needsEnv("STRADDLE_CLOUD_BIN", "STRADDLE_TEST_MODEL");

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
    const legacy = await chat(worker.url, { ...body, functions: [] });
    assert.equal(legacy.status, 400);
    assert.equal((await legacy.json()).error.param, "functions");
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

const weather = {
  type: "function",
  function: {
    name: "get_weather", description: "The current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false },
  },
};

test("the official openai client calls a tool through the worker, whole and streamed, and the tool's answer completes the turn", { skip }, async () => {
  const client = new OpenAI({ baseURL: `${worker.url}/v1`, apiKey: mintToken(), defaultHeaders: { origin: ORIGIN }, maxRetries: 0 });
  const question = { role: "user", content: "What is the weather in Paris?" };
  const whole = await client.chat.completions.create({ model: "default", messages: [question], tools: [weather], tool_choice: "required", max_tokens: 48 });
  assert.equal(whole.choices[0].finish_reason, "tool_calls", JSON.stringify(whole));
  const [call] = whole.choices[0].message.tool_calls;
  assert.equal(call.function.name, "get_weather");
  assert.equal(typeof JSON.parse(call.function.arguments).city, "string");

  // Streamed: the client's own stream helper assembles the call from the deltas.
  const stream = client.chat.completions.stream({
    model: "default", messages: [question], tools: [weather], max_tokens: 48,
    tool_choice: { type: "function", function: { name: "get_weather" } },
  });
  let argumentsDone = null;
  stream.on("tool_calls.function.arguments.done", (e) => { argumentsDone = e; });
  const streamed = await stream.finalChatCompletion();
  assert.equal(streamed.choices[0].finish_reason, "tool_calls");
  assert.deepEqual(streamed.choices[0].message.tool_calls[0].function, call.function, "the same call, streamed");
  assert.equal(argumentsDone?.name, "get_weather");

  const answer = await client.chat.completions.create({
    model: "default", max_tokens: 24, tools: [weather], tool_choice: "none",
    messages: [question, { role: "assistant", content: null, tool_calls: [call] },
      { role: "tool", tool_call_id: call.id, content: "18 degrees and sunny" }],
  });
  assert.equal(answer.choices[0].message.tool_calls, undefined);
  assert.ok(answer.choices[0].message.content.length > 0);

  // A choice naming a function that is not offered: the client's typed error, field named.
  await assert.rejects(
    client.chat.completions.create({ model: "default", messages: [question], tools: [weather], tool_choice: { type: "function", function: { name: "get_time" } } }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "tool_choice",
  );
});

test("tools pass through to a third-party upstream as sent", { skip }, async () => {
  const fake = await startFakeUpstream();
  const viaFake = await startWorker({ UPSTREAM_URL: fake.url });
  try {
    const body = { messages: [{ role: "user", content: "Weather in Oslo?" }], tools: [weather], tool_choice: "auto", parallel_tool_calls: false, max_tokens: 8 };
    const r = await chat(viaFake.url, body);
    assert.equal(r.status, 200);
    for (const field of ["tools", "tool_choice", "parallel_tool_calls"]) {
      assert.deepEqual(fake.state.last.body[field], body[field], field);
    }
  } finally {
    await viaFake.mf.dispose();
    fake.close();
  }
});

test("/v1/load relays the cloud server's load report; an upstream that has none answers 204", { skip }, async () => {
  const res = await fetch(`${worker.url}/v1/load`);
  assert.equal(res.status, 200);
  const load = await res.json();
  assert.ok(load.slots >= 1 && load.queued >= 0 && load.active >= 0, JSON.stringify(load));
  const fake = await startFakeUpstream();
  const viaFake = await startWorker({ UPSTREAM_URL: fake.url });
  try {
    assert.equal((await fetch(`${viaFake.url}/v1/load`)).status, 204);
  } finally {
    await viaFake.mf.dispose();
    fake.close();
  }
});
