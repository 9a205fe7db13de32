// Every option and request field of the package's types, as a TypeScript user writes them;
// `tsc -p web/test/types` (web/test/types.test.mjs) must accept this file. The
// `@ts-expect-error` lines must stay errors: they prove the types are checked at all.
import Straddle, { StraddleError, type ChatCompletionChunk, type ChatMessage, type ResponseFormat, type Tool } from "../../src/index.js";

async function everyOption(): Promise<void> {
  const s = await Straddle.create({
    model: "/models/smollm2-135m-instruct-q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    worker: "https://router.example.workers.dev",
    token: async () => "token",
    policy: { preset: "balanced", keep_on_device_at: "medium", weights: { latency: 1, cost: 1, quality: 1 } },
    backend: "auto",
    threads: "auto",
    contextTokens: 2048,
    onProgress: (p) => console.log(p.phase, p.percent ?? 0),
    cloud: true,
    redact: true,
    cacheModel: true,
    waitForModel: false,
    battery: async () => ({ level: 0.5, charging: false }),
    firstByteTimeoutMs: 15_000,
    cloudModel: "default",
    session: "s-1",
    feature: "summarize",
    learn: true,
    reportUsage: true,
    speculative: true,
    wasmUrl: new URL("https://example.com/straddle_bg.wasm"),
  });
  const schema: ResponseFormat = {
    type: "json_schema",
    json_schema: {
      name: "person",
      strict: true,
      schema: { type: "object", properties: { name: { type: "string" } }, required: ["name"] },
    },
  };
  const whole = await s.chat.completions.create({
    messages: [
      { role: "system", content: "Answer in JSON." },
      { role: "user", content: [{ type: "text", text: "Ada Lovelace, " }, { type: "text", text: "36" }] },
    ],
    max_tokens: 64,
    temperature: 0,
    top_p: 1,
    seed: 1,
    stop: ["\n\n"],
    presence_penalty: 0.5,
    frequency_penalty: -0.5,
    logit_bias: { "17": -100 },
    response_format: schema,
    signal: new AbortController().signal,
    straddle: { route: "auto" },
  });
  const answer: string = whole.choices[0].message.content ?? "";
  console.log(JSON.parse(answer), whole.straddle.route, whole.usage.total_tokens);
  const stream = await s.chat.completions.create({
    messages: [{ role: "user", content: "Hi" }],
    stream: true,
    response_format: { type: "json_object" },
  });
  for await (const chunk of stream) {
    const c: ChatCompletionChunk = chunk;
    console.log(c.choices[0].delta.content ?? "", c.straddle?.cost.usd);
  }
  const weather: Tool = {
    type: "function",
    function: { name: "get_weather", description: "Weather in a city", parameters: { type: "object" }, strict: true },
  };
  const asked: ChatMessage = { role: "user", content: "Weather in Oslo?" };
  const called = await s.chat.completions.create({
    messages: [asked], tools: [weather], tool_choice: "required", parallel_tool_calls: false,
  });
  const call = called.choices[0].message.tool_calls?.[0];
  if (called.choices[0].finish_reason === "tool_calls" && call) {
    const reply = await s.chat.completions.create({
      messages: [asked, { role: "assistant", content: null, tool_calls: [call] },
        { role: "tool", tool_call_id: call.id, content: "-3C" }],
      tools: [weather], tool_choice: { type: "function", function: { name: "get_weather" } }, stream: true,
    });
    for await (const chunk of reply) console.log(chunk.choices[0].delta.tool_calls?.[0].function?.arguments);
  }
  const d = s.route({ messages: [{ role: "user", content: "Hi" }] });
  console.log(d.target, d.trace.rule, (await s.stats()).requests, s.device().backend, s.device().memory?.kvCache);
  await s.feedback(whole.id, 1);
  await s.setPolicy("battery-saver");
  s.setOffline(false);
  await s.unload();

  // @ts-expect-error: not a response format
  const yaml: ResponseFormat = { type: "yaml" };
  // @ts-expect-error: a json_schema format needs its name
  const nameless: ResponseFormat = { type: "json_schema", json_schema: { schema: {} } };
  // @ts-expect-error: only text parts are supported
  s.route({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] });
  // @ts-expect-error: logit_bias maps token ids to numbers
  s.route({ messages: [{ role: "user", content: "x" }], logit_bias: { "17": "ban" } });
  // @ts-expect-error: tool_choice is a mode or a named function
  s.route({ messages: [asked], tools: [weather], tool_choice: "always" });
  console.log(yaml, nameless);
}

try {
  await everyOption();
} catch (e) {
  if (e instanceof StraddleError) console.log(e.code, e.param);
}
