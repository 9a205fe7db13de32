//! The CLI's client for a cloud tier's `/v1/chat/completions` (a worker or `straddle-cloud`):
//! one streamed answer, read as it arrives. `chat` and `speculative` both use it.

use std::io::Read;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use anyhow::Context;
use straddle_engine::{ChatMessage, GenerateParams};
use straddle_protocol::sse::{DONE, Parser};
use straddle_protocol::{ChatChunk, ChatRequest, Message, Role, StreamOptions};

/// What a plain cloud stream delivered.
#[derive(Debug, Clone)]
pub struct Streamed {
    pub text: String,
    pub completion_tokens: u32,
    pub elapsed: Duration,
}

/// Streams an answer from `/v1/chat/completions` at `base`; with `continues`, the rest of the
/// last message, the assistant's, instead (`continue_final_message`).
pub fn stream_cloud(
    base: &str,
    token: Option<&str>,
    messages: &[ChatMessage],
    params: &GenerateParams,
    timeout: Duration,
    continues: bool,
    on_text: impl FnMut(&str),
) -> anyhow::Result<Streamed> {
    let started = Instant::now();
    let req = chat_request(messages, params, continues);
    let body = post_chat(base, token, &req, timeout)?;
    let mut on_text = on_text;
    let mut out = read_stream(body, |piece, _| {
        on_text(piece);
        ControlFlow::Continue(())
    })?;
    out.elapsed = started.elapsed();
    Ok(out)
}

/// Streams an answer from `/v1/chat/completions` at `base` until `done` says the text so far
/// is enough: the rest is not read, and the server stops when the connection closes.
pub fn answer_until(
    base: &str,
    messages: &[ChatMessage],
    params: &GenerateParams,
    timeout: Duration,
    mut done: impl FnMut(&str) -> bool,
) -> anyhow::Result<String> {
    let req = chat_request(messages, params, false);
    let body = post_chat(base, None, &req, timeout)?;
    let streamed = read_stream(body, |_, so_far| {
        if done(so_far) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    Ok(streamed.text)
}

/// POSTs `req` to `base`'s `/v1/chat/completions` and returns the body of a 200 answer.
fn post_chat(
    base: &str,
    token: Option<&str>,
    req: &ChatRequest,
    timeout: Duration,
) -> anyhow::Result<impl Read> {
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .new_agent();
    let url = format!("{}/v1/chat/completions", base.trim_end_matches('/'));
    let mut request = agent.post(&url).header("content-type", "application/json");
    if let Some(t) = token {
        request = request.header("authorization", &format!("Bearer {t}"));
    }
    let mut resp = request
        .send(&serde_json::to_vec(req)?[..])
        .with_context(|| format!("POST {url}"))?;
    let status = resp.status().as_u16();
    if status != 200 {
        let body = resp.body_mut().read_to_string().unwrap_or_default();
        anyhow::bail!("{url} answered {status}: {body}");
    }
    Ok(resp.into_body().into_reader())
}

/// The streamed request for `messages` under `params`.
fn chat_request(messages: &[ChatMessage], params: &GenerateParams, continues: bool) -> ChatRequest {
    let messages = messages
        .iter()
        .map(|m| {
            let role = match m.role.as_str() {
                "system" => Role::System,
                "assistant" => Role::Assistant,
                _ => Role::User,
            };
            Message::new(role, m.content.clone())
        })
        .collect();
    ChatRequest {
        messages,
        stream: true,
        stream_options: Some(StreamOptions {
            include_usage: true,
        }),
        max_tokens: Some(params.max_tokens as u32),
        temperature: Some(params.sampling.temperature),
        seed: Some(params.sampling.seed),
        continue_final_message: continues.then_some(true),
        ..Default::default()
    }
}

/// Reads an SSE chat stream to `[DONE]` (or its end, or until `on_text` breaks), handing on
/// each piece of text and the text so far.
fn read_stream(
    mut reader: impl Read,
    mut on_text: impl FnMut(&str, &str) -> ControlFlow<()>,
) -> anyhow::Result<Streamed> {
    let mut parser = Parser::new(1 << 20);
    let mut buf = [0u8; 4096];
    let mut out = Streamed {
        text: String::new(),
        completion_tokens: 0,
        elapsed: Duration::ZERO,
    };
    loop {
        let n = reader.read(&mut buf).context("reading the stream")?;
        if n == 0 {
            return Ok(out);
        }
        for ev in parser.push(&buf[..n])? {
            if ev.data == DONE {
                return Ok(out);
            }
            let chunk: ChatChunk = serde_json::from_str(&ev.data)
                .with_context(|| format!("an unreadable chunk: {}", ev.data))?;
            if let Some(u) = &chunk.usage {
                out.completion_tokens = u.completion_tokens;
            }
            for t in chunk
                .choices
                .iter()
                .filter_map(|c| c.delta.content.as_deref())
            {
                out.text.push_str(t);
                if on_text(t, &out.text).is_break() {
                    return Ok(out);
                }
            }
        }
    }
}
