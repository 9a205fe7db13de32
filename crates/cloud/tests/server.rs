//! The real `straddle-cloud` process on 127.0.0.1 with the real model.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use straddle_protocol::sse::Parser;

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn model() -> Option<std::path::PathBuf> {
    straddle_testkit::model(straddle_testkit::SMOLLM2)
}

fn start() -> Option<Server> {
    start_with(&[])
}

fn start_with(extra: &[&str]) -> Option<Server> {
    let model = model()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let child = Command::new(env!("CARGO_BIN_EXE_straddle-cloud"))
        .arg("--model")
        .arg(model)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn server");
    let mut server = Server { child, port };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if http(port, "GET", "/health", "").is_some_and(|(s, _)| s == 200) {
            return Some(server);
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            // Only a GPU backend may be missing.
            assert!(extra.contains(&"wgpu"), "server exited at start: {status}");
            return straddle_testkit::no_wgpu_adapter(&format!("the server exited: {status}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("server did not come up");
}

/// One HTTP/1.1 request with `Connection: close`; returns status and body.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Some((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The stream read by `eventsource-stream` (not our parser), fed in 7-byte pieces so events
/// straddle reads, and checked field by field against OpenAI's chunk shape: the text and
/// the completion tokens that the usage chunk reports.
fn independent_reading(sse: &str) -> (String, u64) {
    use eventsource_stream::Eventsource;
    use futures_util::StreamExt;
    let pieces: Vec<Result<Vec<u8>, std::convert::Infallible>> =
        sse.as_bytes().chunks(7).map(|c| Ok(c.to_vec())).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let events: Vec<_> = runtime.block_on(
        futures_util::stream::iter(pieces)
            .eventsource()
            .collect::<Vec<_>>(),
    );
    let (mut text, mut completion, mut done) = (String::new(), 0, false);
    for event in events {
        let event = event.expect("a well-formed event");
        assert_eq!(event.event, "message");
        assert!(!done, "nothing after [DONE]");
        if event.data == "[DONE]" {
            done = true;
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&event.data).expect("JSON data");
        assert_eq!(v["object"], "chat.completion.chunk");
        assert!(
            v["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("chatcmpl-"))
        );
        assert!(v["created"].is_u64() && v["model"].is_string());
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            completion = n;
        }
        if let Some(piece) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(piece);
        }
    }
    assert!(done, "the stream ends with [DONE]");
    (text, completion)
}

#[test]
fn answers_streamed_and_whole_and_rejects_bad_input() {
    let Some(server) = start() else { return };
    let p = server.port;
    let body = r#"{"model":"m","messages":[{"role":"user","content":"List three primary colors."}],"max_tokens":12}"#;
    let (status, whole) = http(p, "POST", "/v1/chat/completions", body).expect("response");
    assert_eq!(status, 200, "{whole}");
    let v: serde_json::Value = serde_json::from_str(&whole).expect("json");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    assert!(!text.is_empty());
    assert_eq!(v["usage"]["completion_tokens"], 12);
    // The load the page's router reads: nothing waits (the answer's own slot may still be
    // closing), and one sequence's rate.
    let (status, load) = http(p, "GET", "/v1/load", "").expect("load");
    assert_eq!(status, 200, "{load}");
    let load: straddle_protocol::LoadReport = serde_json::from_str(&load).expect("a load report");
    assert!(load.queued == 0 && load.active <= 1, "{load:?}");
    assert!(
        load.slots >= 1 && load.tokens_per_s.is_some_and(|r| r > 0.0),
        "{load:?}"
    );
    // The prompt with SmolLM2's template and default system prompt is 35 tokens (llama.cpp's count).
    assert_eq!(v["usage"]["prompt_tokens"], 35);

    let stream_body = body.replace(
        "\"max_tokens\":12",
        "\"max_tokens\":12,\"stream\":true,\"stream_options\":{\"include_usage\":true}",
    );
    let (status, sse) = http(p, "POST", "/v1/chat/completions", &stream_body).expect("stream");
    assert_eq!(status, 200);
    let events = Parser::new(1 << 16)
        .push(sse.as_bytes())
        .expect("valid SSE");
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
    let mut streamed = String::new();
    let mut usage = None;
    for e in &events[..events.len() - 1] {
        let chunk: straddle_protocol::ChatChunk = serde_json::from_str(&e.data).expect("chunk");
        if let Some(u) = chunk.usage {
            usage = Some(u);
        }
        for c in chunk.choices {
            streamed.push_str(c.delta.content.as_deref().unwrap_or(""));
        }
    }
    assert_eq!(streamed, text, "greedy stream equals the whole answer");
    assert_eq!(usage.map(|u| u.completion_tokens), Some(12));
    assert_eq!(independent_reading(&sse), (streamed, 12));

    // A reply handed over part-way (from speculation) continues where its text stops.
    let cut = text
        .char_indices()
        .filter(|&(_, c)| c == ' ')
        .nth(2)
        .map_or(text.len() / 2, |(i, _)| i);
    let partial = &text[..cut];
    let body = serde_json::json!({
        "messages": [
            {"role": "user", "content": "List three primary colors."},
            {"role": "assistant", "content": partial},
        ],
        "continue_final_message": true,
        "max_tokens": 12,
    })
    .to_string();
    let (status, cont) = http(p, "POST", "/v1/chat/completions", &body).expect("response");
    assert_eq!(status, 200, "{cont}");
    let v: serde_json::Value = serde_json::from_str(&cont).expect("json");
    let rest = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(
        format!("{partial}{rest}").starts_with(&text),
        "{partial:?} + {rest:?} does not go on as {text:?}"
    );

    for (bad, field) in [
        (
            r#"{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}"#,
            Some("continue_final_message"),
        ),
        ("{not json", None),
        (r#"{"messages":[]}"#, Some("messages")),
        (r#"{"messages":[{"role":"wizard","content":"x"}]}"#, None),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"temperature":9}"#,
            Some("temperature"),
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":100000}"#,
            Some("max_tokens"),
        ),
    ] {
        let (status, body) = http(p, "POST", "/v1/chat/completions", bad).expect("response");
        assert_eq!(status, 400, "{bad} → {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json error");
        if let Some(f) = field {
            assert_eq!(v["error"]["param"], f);
        }
    }
}

#[test]
fn response_format_holds_the_answer_to_its_schema_streamed_and_whole() {
    let Some(server) = start() else { return };
    let p = server.port;
    let schema = serde_json::json!({"type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]});
    let body = serde_json::json!({
        // Content as an array of text parts, as many clients send it.
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Extract the person: "},
            {"type": "text", "text": "Maria Lopez is 34 years old."}]}],
        "response_format": {"type": "json_schema",
            "json_schema": {"name": "person", "strict": true, "schema": schema}},
        "presence_penalty": 0.1, "frequency_penalty": 0.1, "logit_bias": {"0": -100},
        "max_tokens": 64,
    });
    let (status, whole) =
        http(p, "POST", "/v1/chat/completions", &body.to_string()).expect("response");
    assert_eq!(status, 200, "{whole}");
    let v: serde_json::Value = serde_json::from_str(&whole).expect("json");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    let answer: serde_json::Value = serde_json::from_str(text).expect("the answer is JSON");
    assert!(
        answer["name"].is_string() && answer["age"].is_i64(),
        "{text}"
    );
    assert_eq!(
        answer.as_object().map(|o| o.len()),
        Some(2),
        "strict: {text}"
    );

    let mut streamed_body = body.clone();
    streamed_body["stream"] = true.into();
    let (status, sse) = http(
        p,
        "POST",
        "/v1/chat/completions",
        &streamed_body.to_string(),
    )
    .expect("stream");
    assert_eq!(status, 200);
    assert_eq!(independent_reading(&sse).0, text, "the same JSON, streamed");

    let bad_schema = |format: serde_json::Value| {
        serde_json::json!({"messages": [{"role": "user", "content": "x"}],
                           "response_format": format, "stream": true})
        .to_string()
    };
    for (bad, field) in [
        (
            bad_schema(serde_json::json!({"type": "json_schema",
                "json_schema": {"name": "n", "schema": {"type": "wat"}}})),
            "response_format",
        ),
        (
            bad_schema(serde_json::json!({"type": "json_schema", "json_schema": {"name": "n",
                "strict": true, "schema": {"type": "array", "uniqueItems": true}}})),
            "response_format",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}"#
                .to_string(),
            "messages",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"functions":[]}"#.to_string(),
            "functions",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"x":1}}"#.to_string(),
            "logit_bias",
        ),
    ] {
        let (status, body) = http(p, "POST", "/v1/chat/completions", &bad).expect("response");
        assert_eq!(status, 400, "{bad} → {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json error");
        assert_eq!(v["error"]["param"], field, "{body}");
    }
}

/// The data of every event of a stream, read by `eventsource-stream`.
fn event_data(sse: &str) -> Vec<serde_json::Value> {
    use eventsource_stream::Eventsource;
    use futures_util::StreamExt;
    let pieces = [Ok::<_, std::convert::Infallible>(sse.as_bytes().to_vec())];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let events = runtime.block_on(
        futures_util::stream::iter(pieces)
            .eventsource()
            .collect::<Vec<_>>(),
    );
    events
        .into_iter()
        .map(|e| e.expect("a well-formed event").data)
        .filter(|d| d != "[DONE]")
        .map(|d| serde_json::from_str(&d).expect("JSON data"))
        .collect()
}

#[test]
fn a_tool_call_round_trip_whole_and_streamed() {
    let Some(server) = start() else { return };
    let p = server.port;
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"], "additionalProperties": false}}}]);
    let question = serde_json::json!({"role": "user", "content": "What is the weather in Paris?"});
    let body = serde_json::json!({"messages": [question], "tools": tools,
        "tool_choice": "required", "max_tokens": 48});
    let (status, whole) =
        http(p, "POST", "/v1/chat/completions", &body.to_string()).expect("response");
    assert_eq!(status, 200, "{whole}");
    let v: serde_json::Value = serde_json::from_str(&whole).expect("json");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{whole}");
    let call = v["choices"][0]["message"]["tool_calls"][0].clone();
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_"))
    );
    let arguments: serde_json::Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("a string"))
            .expect("arguments are JSON");
    assert!(arguments["city"].is_string(), "{arguments}");

    // The same call streamed: one delta carries it whole, then the finish reason.
    let mut streamed = body.clone();
    streamed["stream"] = true.into();
    streamed["tool_choice"] =
        serde_json::json!({"type": "function", "function": {"name": "get_weather"}});
    let (status, sse) =
        http(p, "POST", "/v1/chat/completions", &streamed.to_string()).expect("stream");
    assert_eq!(status, 200);
    let chunks = event_data(&sse);
    let deltas: Vec<_> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(deltas.len(), 1, "{sse}");
    assert_eq!(deltas[0]["index"], 0);
    assert_eq!(
        deltas[0]["function"], call["function"],
        "the same call, streamed"
    );
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "tool_calls")
    );
    assert!(
        chunks.iter().all(|c| c["choices"][0]["delta"]["content"]
            .as_str()
            .is_none_or(str::is_empty)),
        "a call is never shown as content: {sse}"
    );

    // The tool's answer goes into the next turn, and the model answers in text.
    let second = serde_json::json!({"messages": [question,
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 degrees and sunny"}],
        "tools": tools, "tool_choice": "none", "max_tokens": 24});
    let (status, body) =
        http(p, "POST", "/v1/chat/completions", &second.to_string()).expect("response");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert!(v["choices"][0]["message"]["tool_calls"].is_null());
    assert!(
        !v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .is_empty()
    );

    let bad = |choice: serde_json::Value, tools: serde_json::Value| {
        serde_json::json!({"messages": [{"role": "user", "content": "x"}],
            "tools": tools, "tool_choice": choice})
        .to_string()
    };
    let named = |n: &str| serde_json::json!({"type": "function", "function": {"name": n}});
    for (body, field) in [
        (bad(named("get_time"), tools.clone()), "tool_choice"),
        (bad("required".into(), serde_json::json!([])), "tool_choice"),
        (
            bad(
                "auto".into(),
                serde_json::json!([{"type": "function", "function": {"name": "get weather"}}]),
            ),
            "tools[0].function.name",
        ),
        (
            bad(
                "auto".into(),
                serde_json::json!([{"type": "function", "function": {"name": "f",
                "strict": true, "parameters": {"type": "array", "uniqueItems": true}}}]),
            ),
            "tools",
        ),
    ] {
        let (status, reply) = http(p, "POST", "/v1/chat/completions", &body).expect("response");
        assert_eq!(status, 400, "{body} → {reply}");
        let v: serde_json::Value = serde_json::from_str(&reply).expect("json error");
        assert_eq!(v["error"]["param"], field, "{reply}");
    }
}

#[test]
fn verify_accepts_the_greedy_continuation_and_corrects_a_wrong_token() {
    let Some(server) = start() else { return };
    let p = server.port;
    // The greedy continuation from the non-streamed route, as token ids via the verify route:
    // first learn the greedy tokens one verify call at a time, then check a batch at once.
    let prefix: Vec<u32> = vec![504, 1782, 4683, 359]; // any valid ids will do
    let mut greedy = Vec::new();
    for _ in 0..4 {
        let mut pre = prefix.clone();
        pre.extend(&greedy);
        let body = serde_json::json!({"prefix_tokens": pre, "draft_tokens": [0]}).to_string();
        let (status, text) = http(p, "POST", "/v1/verify", &body).expect("verify");
        assert_eq!(status, 200, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        greedy.push(v["next_token"].as_u64().expect("next") as u32);
    }
    let body = serde_json::json!({"prefix_tokens": prefix, "draft_tokens": greedy}).to_string();
    let (_, text) = http(p, "POST", "/v1/verify", &body).expect("verify");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["accepted"], 4, "{text}");
    let mut wrong = greedy.clone();
    wrong[2] = if wrong[2] == 7 { 8 } else { 7 };
    let body = serde_json::json!({"prefix_tokens": prefix, "draft_tokens": wrong}).to_string();
    let (_, text) = http(p, "POST", "/v1/verify", &body).expect("verify");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["accepted"], 2);
    assert_eq!(v["next_token"], greedy[2]);

    let body = serde_json::json!({"prefix_tokens": prefix, "draft_tokens": [1], "tokenizer_hash": "other"}).to_string();
    let (status, text) = http(p, "POST", "/v1/verify", &body).expect("verify");
    assert_eq!(status, 409, "{text}");
    let body = serde_json::json!({"prefix_tokens": prefix, "draft_tokens": [999999]}).to_string();
    assert_eq!(http(p, "POST", "/v1/verify", &body).expect("verify").0, 400);
}

fn post_verify(port: u16, body: serde_json::Value) -> (u16, serde_json::Value) {
    let (status, text) = http(port, "POST", "/v1/verify", &body.to_string()).expect("verify");
    (status, serde_json::from_str(&text).expect("json"))
}

/// The greedy continuation of `prefix`, one verify call per token in one session.
fn greedy_tokens(port: u16, prefix: &[u32], n: usize) -> Vec<u32> {
    // One session, a draft of one arbitrary token a call: the server decodes each emitted
    // token as plain generation does (a fresh call per step would read the answer so far as a
    // prompt, whose sums llama.cpp's order takes otherwise).
    let session = format!(
        "greedy-{}",
        prefix.iter().map(u32::to_string).collect::<String>()
    );
    let (mut out, mut held) = (Vec::new(), serde_json::Value::Null);
    while out.len() < n {
        let body = if out.is_empty() {
            serde_json::json!({"session": session, "prefix_tokens": prefix, "draft_tokens": [0]})
        } else {
            serde_json::json!({"session": session, "session_length": held, "draft_tokens": [0]})
        };
        let (status, v) = post_verify(port, body);
        assert_eq!(status, 200, "{v}");
        if v["accepted"] == 1 {
            out.push(0);
        }
        out.push(v["next_token"].as_u64().expect("next") as u32);
        held = v["session_length"].clone();
    }
    out.truncate(n);
    out
}

#[test]
fn a_verify_session_carries_only_new_drafts_and_survives_losing_its_cache() {
    // One live KV cache at a time: a second session takes it from the first, which must then
    // be re-prefilled from its tokens without the client noticing.
    let Some(server) = start_with(&["--verify-sessions", "1"]) else {
        return;
    };
    let p = server.port;
    let prefix: Vec<u32> = vec![504, 1782, 4683, 359, 260];
    let g = greedy_tokens(p, &prefix, 9);

    let (status, v) = post_verify(
        p,
        serde_json::json!({"session": "a", "prefix_tokens": prefix, "draft_tokens": g[..3]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["accepted"].as_u64(), v["next_token"].as_u64()),
        (Some(3), Some(g[3] as u64))
    );
    let mut held = prefix.len() + 4;
    assert_eq!(v["session_length"], held);
    assert_eq!(v["usage"]["prompt_tokens"], prefix.len() + 3);

    // The continuation sends the draft alone; the second drafted token is wrong.
    let wrong = if g[5] == 7 { 8 } else { 7 };
    let (status, v) = post_verify(
        p,
        serde_json::json!({"session": "a", "session_length": held, "draft_tokens": [g[4], wrong]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["accepted"].as_u64(), v["next_token"].as_u64()),
        (Some(1), Some(g[5] as u64))
    );
    held += 2;
    assert_eq!(v["session_length"], held);
    assert_eq!(
        v["usage"]["prompt_tokens"], 3,
        "the pending token and the draft"
    );

    // Another session takes the only live cache; "a" continues from its tokens.
    let (status, _) = post_verify(
        p,
        serde_json::json!({"session": "b", "prefix_tokens": [1, 2, 3], "draft_tokens": [4]}),
    );
    assert_eq!(status, 200);
    let (status, v) = post_verify(
        p,
        serde_json::json!({"session": "a", "session_length": held, "draft_tokens": g[6..9]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["accepted"], 3, "{v}");

    // A client whose count differs is told so, and the session is gone after it.
    let (status, v) = post_verify(
        p,
        serde_json::json!({"session": "a", "session_length": 3, "draft_tokens": [1]}),
    );
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "session_out_of_sync");
    let (status, v) = post_verify(
        p,
        serde_json::json!({"session": "a", "session_length": held + 4, "draft_tokens": [1]}),
    );
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "session_unknown");
    let (status, v) = post_verify(p, serde_json::json!({"session": "b", "draft_tokens": [1]}));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "session_length");
}

#[test]
fn sampled_verification_is_seeded_and_refuses_sampled_drafts() {
    let Some(server) = start() else { return };
    let p = server.port;
    let body = serde_json::json!({"prefix_tokens": [504, 1782, 4683], "draft_tokens": [359, 260, 10],
        "temperature": 0.8, "seed": 11});
    let (status, first) = post_verify(p, body.clone());
    assert_eq!(status, 200, "{first}");
    let (_, again) = post_verify(p, body);
    assert_eq!(first, again, "one seed, one verdict");
    let (status, v) = post_verify(
        p,
        serde_json::json!({"prefix_tokens": [1], "draft_tokens": [2], "temperature": 0.8, "draft_probs": [0.4]}),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "draft_probs");
}

fn metric(port: u16, name: &str) -> f64 {
    let (_, text) = http(port, "GET", "/metrics", "").expect("metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("metric {name} missing:\n{text}"))
}

/// The server's active sequences once none is left, or after `seconds`, whichever is first.
fn idle_sequences(port: u16, seconds: u64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        let active = metric(port, "straddle_active_sequences");
        if active == 0.0 || Instant::now() >= deadline {
            return active;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A streamed story of `max_tokens` that cannot end early (its end-of-turn tokens banned).
fn endless_story(max_tokens: u32) -> String {
    format!(
        r#"{{"messages":[{{"role":"user","content":"Tell me a long story."}}],"max_tokens":{max_tokens},"stream":true,"logit_bias":{{"0":-100,"1":-100,"2":-100}}}}"#
    )
}

/// Sends `body` as a streamed chat request and reads until its first token's text: the
/// connection, and what it has read.
fn stream_until_first_token(port: u16, body: &str) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).expect("send");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let mut seen = Vec::new();
    while !has_text(&String::from_utf8_lossy(&seen)) {
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).expect("first bytes");
        assert!(n > 0, "the stream ended before its first token");
        seen.extend_from_slice(&buf[..n]);
    }
    (s, seen)
}

/// Whether an SSE stream so far carries a delta with some text (not only the role chunk).
fn has_text(sse: &str) -> bool {
    const KEY: &str = "\"content\":\"";
    sse.match_indices(KEY).any(|(i, _)| {
        sse[i + KEY.len()..]
            .chars()
            .next()
            .is_some_and(|c| c != '"')
    })
}

#[test]
fn sixteen_concurrent_streams_complete_in_shared_batches_and_a_dropped_client_frees_its_slot() {
    let Some(server) = start() else { return };
    let p = server.port;
    let handles: Vec<_> = (0..16)
        .map(|i| {
            std::thread::spawn(move || {
                let body = format!(r#"{{"messages":[{{"role":"user","content":"Count to {i}."}}],"max_tokens":8,"stream":true}}"#);
                http(p, "POST", "/v1/chat/completions", &body)
            })
        })
        .collect();
    for h in handles {
        let (status, sse) = h.join().expect("thread").expect("response");
        assert_eq!(status, 200);
        assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
    }
    assert!(
        metric(p, "straddle_batch_size_max") > 1.0,
        "sequences were decoded together"
    );
    // The scheduler frees a slot just after the stream's last chunk is written.
    assert_eq!(idle_sequences(p, 10), 0.0, "every slot freed");
    let reused_before = metric(p, "straddle_prefix_reused_tokens_total");

    // A client that goes away mid-stream: its sequence must stop long before max_tokens, in an
    // answer that cannot end early (its end-of-turn tokens banned).
    let before = metric(p, "straddle_generated_tokens_total");
    // Hang up once the first token's text has arrived: the sequence is then live, and the
    // server's count of active sequences already includes it.
    drop(stream_until_first_token(p, &endless_story(400)));
    // The bound is generous because a loaded test machine decodes slowly; what proves the
    // cancellation is that far fewer than max_tokens were generated.
    assert_eq!(idle_sequences(p, 90), 0.0, "slot freed");
    let generated = metric(p, "straddle_generated_tokens_total") - before;
    assert!(
        generated < 200.0,
        "generation was cancelled ({generated} tokens)"
    );
    // A prompt after the others starts from their system prompt's keys and values.
    let (status, _) = http(
        p,
        "POST",
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"Name a river."}],"max_tokens":4}"#,
    )
    .expect("response");
    assert_eq!(status, 200);
    assert!(
        metric(p, "straddle_prefix_reused_tokens_total") - reused_before > 10.0,
        "the shared prompt prefix was reused"
    );
}

#[test]
fn sigterm_ends_the_drain_after_its_bound_with_answers_still_open() {
    let Some(mut server) = start_with(&["--drain-seconds", "1"]) else {
        return;
    };
    let p = server.port;
    // Answers that cannot end early (end-of-turn tokens banned) and share the batch: each
    // would stream for far longer than the drain.
    let others: Vec<_> = (0..5)
        .map(|_| {
            std::thread::spawn(move || {
                http(p, "POST", "/v1/chat/completions", &endless_story(1800))
            })
        })
        .collect();
    let (mut s, mut seen) = stream_until_first_token(p, &endless_story(1800));
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "SIGTERM sent");
    // The server exits with our answer still open: the stream is cut, not finished.
    let _ = s.read_to_end(&mut seen);
    let sse = String::from_utf8_lossy(&seen);
    assert!(
        !sse.contains("[DONE]"),
        "the answer was cut by the exit: {sse}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let exited = loop {
        match server.child.try_wait().expect("wait") {
            Some(status) => break Some(status),
            None if Instant::now() > deadline => break None,
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert!(
        exited.is_some_and(|s| s.success()),
        "exited after the drain: {exited:?}"
    );
    for h in others {
        let _ = h.join();
    }
}

/// A system prompt in place of the template's default: lavapipe spends about as long on each
/// prompt position as on a generated token, and SmolLM2's default system prompt is most of a
/// short question's positions.
const BRIEF: &str = "Be brief.";

/// The chat answer's text, behind the [`BRIEF`] system prompt.
fn answer(port: u16, content: &str, max_tokens: u32) -> String {
    let body = serde_json::json!({
        "messages": [{"role": "system", "content": BRIEF}, {"role": "user", "content": content}],
        "max_tokens": max_tokens,
    })
    .to_string();
    let (status, text) = http(port, "POST", "/v1/chat/completions", &body).expect("response");
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string()
}

/// The device model behind the same routes, on wgpu (lavapipe here: a software adapter, so
/// only when asked for). Prefill chunks of 15 keep every pass within our product kernel's 16
/// rows, where lavapipe is quick enough for a test.
#[test]
fn the_gpu_backend_batches_and_verifies_with_the_cpu_s_tokenizer() {
    let Some(gpu) = start_with(&[
        "--backend",
        "wgpu",
        "--prefill-chunk",
        "15",
        "--max-batch",
        "4",
    ]) else {
        return;
    };
    let Some(cpu) = start_with(&["--backend", "cpu"]) else {
        return;
    };
    let health = |port| -> serde_json::Value {
        serde_json::from_str(&http(port, "GET", "/health", "").expect("health").1).expect("json")
    };
    assert!(
        health(gpu.port)["backend"]
            .as_str()
            .is_some_and(|b| b.starts_with("wgpu")),
        "{}",
        health(gpu.port)
    );
    assert_eq!(health(cpu.port)["backend"], "cpu");
    let hash = |port| -> serde_json::Value {
        let (_, text) = http(port, "GET", "/v1/models", "").expect("models");
        serde_json::from_str::<serde_json::Value>(&text).expect("json")["data"][0]["tokenizer_hash"]
            .clone()
    };
    assert_eq!(hash(gpu.port), hash(cpu.port));

    // Two requests at once: decoded in shared steps, each what it is alone. (Not compared
    // with the CPU server's text: the CPU kernels round activations to 8 bits as llama.cpp
    // does and the device does not, so a near-tie may go either way; for "What is the
    // capital of France?" behind SmolLM2's default system prompt the CPU says "L'Étoile", the device
    // "The capital of France is Paris".)
    let prompts = [
        "What is the capital of France?",
        "List three primary colors.",
    ];
    let alone = prompts.map(|c| answer(gpu.port, c, 8));
    assert_eq!(metric(gpu.port, "straddle_batch_size_max"), 1.0);
    let port = gpu.port;
    let handles = prompts.map(|c| std::thread::spawn(move || answer(port, c, 8)));
    for ((content, handle), alone) in prompts.iter().zip(handles).zip(&alone) {
        assert!(!alone.is_empty(), "{content}");
        assert_eq!(&handle.join().expect("thread"), alone, "{content}");
    }
    assert!(
        metric(gpu.port, "straddle_batch_size_max") >= 2.0,
        "the two sequences were decoded together"
    );

    // Verification: the greedy tokens, learned one session call at a time, are accepted in
    // one call of another session, and a continuing call carries only its draft.
    let messages = serde_json::json!([
        {"role": "system", "content": BRIEF},
        {"role": "user", "content": prompts[0]}
    ]);
    let (status, first) = post_verify(
        gpu.port,
        serde_json::json!({"messages": messages, "draft_tokens": [0], "session": "c"}),
    );
    assert_eq!(status, 200, "{first}");
    let mut greedy = vec![first["next_token"].as_u64().expect("next") as u32];
    let mut length = first["session_length"].as_u64().expect("length");
    while greedy.len() < 6 {
        let (status, v) = post_verify(
            gpu.port,
            serde_json::json!({"session": "c", "session_length": length, "draft_tokens": [0]}),
        );
        assert_eq!((status, v["accepted"].as_u64()), (200, Some(0)), "{v}");
        greedy.push(v["next_token"].as_u64().expect("next") as u32);
        length = v["session_length"].as_u64().expect("length");
    }
    let (status, v) = post_verify(
        gpu.port,
        serde_json::json!({"messages": messages, "draft_tokens": &greedy[..4], "session": "g"}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["accepted"].as_u64(), v["next_token"].as_u64()),
        (Some(4), Some(greedy[4] as u64))
    );
    let (status, v) = post_verify(
        gpu.port,
        serde_json::json!({
            "session": "g",
            "session_length": v["session_length"],
            "draft_tokens": [greedy[5]],
        }),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["accepted"], 1, "{v}");
    assert_eq!(
        v["usage"]["prompt_tokens"], 2,
        "the pending token and the draft"
    );
}
