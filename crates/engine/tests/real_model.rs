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

#[test]
fn greedy_verify_of_a_corrupted_draft_reproduces_plain_greedy_decoding() {
    let Some(e) = engine() else { return };
    let prompt = e
        .prompt_tokens(Prompt::Text("The three primary colors are"))
        .expect("tokens");
    let params = GenerateParams {
        max_tokens: 24,
        ..Default::default()
    };
    let plain = e
        .generate(Prompt::Tokens(&prompt), &params, |_| Flow::Continue)
        .expect("plain")
        .tokens;

    // Speculative loop: drafts are the true greedy tokens with every third one corrupted,
    // so the verifier must reject there and supply the greedy token itself.
    let mut cache = e.new_cache(256);
    let mut rng = straddle_engine::sample::Rng::new(0);
    let mut logits = e
        .model
        .forward(&prompt, &mut cache, false)
        .expect("prefill")
        .pop()
        .expect("logits");
    let mut out: Vec<u32> = Vec::new();
    let mut passes = 0;
    while out.len() < plain.len() {
        let k = 4.min(plain.len() - out.len());
        let draft: Vec<u32> = (0..k)
            .map(|i| {
                if (out.len() + i) % 3 == 2 {
                    7
                } else {
                    plain[out.len() + i]
                }
            })
            .collect();
        let v = e
            .model
            .verify(
                &mut cache,
                &logits,
                &draft,
                &Default::default(),
                &[],
                &mut rng,
            )
            .expect("verify");
        passes += 1;
        out.extend_from_slice(&draft[..v.accepted]);
        if out.len() < plain.len() {
            out.push(v.next_token);
            logits = e
                .model
                .forward(&[v.next_token], &mut cache, false)
                .expect("step")
                .pop()
                .expect("logits");
        }
    }
    assert_eq!(out, plain);
    assert!(
        passes < plain.len(),
        "verification batched tokens: {passes} passes for {} tokens",
        plain.len()
    );
}

#[test]
fn a_greedy_draft_from_the_same_model_is_accepted_whole() {
    let Some(e) = engine() else { return };
    let prompt = e
        .prompt_tokens(Prompt::Text("def add(a, b):"))
        .expect("tokens");
    let mut draft_cache = e.new_cache(64);
    let logits = e
        .model
        .forward(&prompt, &mut draft_cache, false)
        .expect("prefill")
        .pop()
        .expect("logits");
    let mut rng = straddle_engine::sample::Rng::new(0);
    let d = e.model.draft(&mut draft_cache, &logits, 5).expect("draft");
    assert_eq!(d.tokens.len(), 5);
    assert_eq!(draft_cache.len(), prompt.len() + 4);
    assert!(d.probs.iter().all(|&p| p > 0.0 && p <= 1.0));
    let mut verify_cache = e.new_cache(64);
    let v = e
        .model
        .verify(
            &mut verify_cache,
            &logits,
            &[],
            &Default::default(),
            &[],
            &mut rng,
        )
        .expect("empty draft");
    assert_eq!(v.accepted, 0);
    e.model
        .forward(&prompt, &mut verify_cache, false)
        .expect("prefill");
    let v = e
        .model
        .verify(
            &mut verify_cache,
            &logits,
            &d.tokens,
            &Default::default(),
            &[],
            &mut rng,
        )
        .expect("verify");
    assert_eq!(v.accepted, 5);
    assert_eq!(verify_cache.len(), prompt.len() + 5);
}
