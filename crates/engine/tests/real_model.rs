//! The real default model (SmolLM2-135M-Instruct Q4_1) end to end on the CPU.

mod common;

use straddle_engine::gguf::FileSource;
use straddle_engine::{ChatMessage, Engine, Finish, Flow, GenerateParams, Prompt};

fn engine() -> Option<Engine> {
    let path = common::model_path()?;
    Some(Engine::load(FileSource::open(path).expect("open model"), 2048).expect("load model"))
}

#[test]
fn chat_messages_stream_the_reference_greedy_tokens() {
    let Some(e) = engine() else { return };
    let msgs = [ChatMessage::new("user", "What is the capital of France?")];
    let mut streamed = String::new();
    let c = e
        .generate(
            Prompt::Messages(&msgs),
            &GenerateParams {
                max_tokens: 32,
                ..Default::default()
            },
            |ev| {
                streamed.push_str(&ev.text);
                Flow::Continue
            },
        )
        .expect("generate");
    eprintln!(
        "{:?} prefill {:.0} ms, decode {:.1} tok/s",
        c.text,
        c.prefill_ms,
        c.decode_tokens_per_s()
    );
    // The chat template (with SmolLM2's default system prompt) and the loop reproduce
    // llama.cpp's greedy tokens up to its first near-tie (tests/reference, case en-capital).
    assert_eq!(c.tokens[..7], [60, 23, 39614, 1141, 552, 28, 2618]);
    assert_eq!(streamed, c.text);
    assert_eq!(c.text, e.tokenizer.decode(&c.tokens).expect("decode"));
    assert_eq!(c.finish, Finish::Length);
    assert!(c.logprobs.iter().all(|&l| l <= 0.0 && l.is_finite()));
}

#[test]
fn cancellation_stops_between_tokens() {
    let Some(e) = engine() else { return };
    let mut n = 0;
    let c = e
        .generate(
            Prompt::Text("Once upon a time"),
            &GenerateParams {
                max_tokens: 50,
                ..Default::default()
            },
            |_| {
                n += 1;
                if n == 3 { Flow::Cancel } else { Flow::Continue }
            },
        )
        .expect("generate");
    assert_eq!(c.finish, Finish::Cancelled);
    assert_eq!(c.tokens.len(), 3);
}
