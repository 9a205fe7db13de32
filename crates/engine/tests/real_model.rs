//! The real models end to end on the CPU: SmolLM2-135M-Instruct Q4_1, the smallest, and
//! Qwen2.5-Coder-0.5B-Instruct, the edge model, whose K-quants sum in an order set by a
//! token's place in its pass.

mod common;

use straddle_engine::gguf::FileSource;
use straddle_engine::speculative;
use straddle_engine::{ChatMessage, Engine, Finish, Flow, GenerateParams, Prompt, Sequence};

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
        let v = speculative::verify(
            &e.model,
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
    let v = speculative::verify(
        &e.model,
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
    let v = speculative::verify(
        &e.model,
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

#[test]
fn chunked_batched_prefill_gives_each_sequence_its_own_greedy_answer() {
    let Some(e) = engine() else { return };
    let prompts = [
        "What is the capital of France?",
        "Write one sentence about the sea.",
        "List three colours.",
    ];
    let params = GenerateParams {
        max_tokens: 12,
        ..Default::default()
    };
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let msgs = [ChatMessage::new("user", *p)];
            e.generate(Prompt::Messages(&msgs), &params, |_| Flow::Continue)
                .expect("generate")
                .tokens
        })
        .collect();
    // Two start together; the third joins while they decode. A budget of 7 prompt tokens a
    // step splits every prompt across several steps and mixes prefill rows with decode rows.
    let queue = |p: &str| {
        e.queue(Prompt::Messages(&[ChatMessage::new("user", p)]), &params)
            .expect("queue")
    };
    let mut seqs = vec![queue(prompts[0]), queue(prompts[1])];
    let mut steps = 0;
    while seqs.len() < 3 || seqs.iter().any(|s| !s.is_finished()) {
        if steps == 8 {
            seqs.push(queue(prompts[2]));
        }
        for s in seqs.iter_mut() {
            e.next_token(s).expect("sample");
        }
        let mut refs: Vec<&mut _> = seqs.iter_mut().collect();
        e.step(&mut refs, 7).expect("step");
        steps += 1;
        assert!(steps < 200, "the batch never finished");
    }
    let prefix = seqs[0]
        .prompt_prefix()
        .expect("the first prompt is in the cache");
    for (i, s) in seqs.into_iter().enumerate() {
        assert_eq!(s.into_completion().tokens, alone[i], "prompt {i}");
    }

    // A prompt that begins like an earlier one starts from its keys and values (here the
    // chat template's system prompt) and still gives its own answer, bit for bit.
    let msgs = [ChatMessage::new("user", prompts[1])];
    let mut again = e
        .queue_after(Prompt::Messages(&msgs), &params, Some(&prefix))
        .expect("queue");
    assert!(
        again.prompt_reused() > 10,
        "reused {} of {}",
        again.prompt_reused(),
        prefix.len()
    );
    while !again.is_finished() {
        e.next_token(&mut again).expect("sample");
        e.step(&mut [&mut again], 5).expect("step");
    }
    assert_eq!(again.into_completion().tokens, alone[1]);
}

/// The hidden state a prompt leaves once it is all fed, stepping `seq` with chunks of at
/// most `budget` prompt tokens.
fn prefilled_state(e: &Engine, mut seq: Sequence, budget: usize) -> Vec<u32> {
    while seq.prompt_unfed() > 0 {
        e.step(&mut [&mut seq], budget).expect("step");
    }
    let state = e.look(&seq).expect("look").state.expect("a state");
    state.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_prompt_fed_in_chunks_or_after_a_reused_prefix_gives_the_bits_of_one_pass() {
    // A server feeds a prompt in chunks under load and starts it from the keys and values of
    // an earlier prompt; neither may change its answer, or the same request would get
    // different answers by what else the server was doing.
    let Some(path) = common::qwen_edge_path() else {
        return;
    };
    let e = Engine::load(FileSource::open(path).expect("open model"), 1024).expect("load");
    let params = GenerateParams::default();
    let first = [ChatMessage::new(
        "user",
        "Write a Python function that reverses a list.",
    )];
    let next = [
        first[0].clone(),
        ChatMessage::new("assistant", "def reverse(xs):\n    return xs[::-1]"),
        ChatMessage::new("user", "Now do it in place, without slicing."),
    ];
    let other = [ChatMessage::new("user", "What does HTTP status 404 mean?")];
    let one_pass = |msgs: &[ChatMessage]| {
        let queued = e.queue(Prompt::Messages(msgs), &params).expect("queue");
        prefilled_state(&e, queued, usize::MAX)
    };
    let mut earlier = e.queue(Prompt::Messages(&first), &params).expect("queue");
    while earlier.prompt_unfed() > 0 {
        e.step(&mut [&mut earlier], usize::MAX).expect("step");
    }
    let prefix = earlier.prompt_prefix().expect("the prompt is in the cache");
    for (name, msgs) in [("the next turn", &next[..]), ("another question", &other)] {
        let want = one_pass(msgs);
        for budget in [1, 5, 9] {
            let chunked = e.queue(Prompt::Messages(msgs), &params).expect("queue");
            assert!(
                prefilled_state(&e, chunked, budget) == want,
                "{name}, {budget} a step"
            );
        }
        let after = e.queue_after(Prompt::Messages(msgs), &params, Some(&prefix));
        let after = after.expect("queue");
        assert!(
            after.prompt_reused() > 10,
            "{name} reused {}",
            after.prompt_reused()
        );
        assert!(
            prefilled_state(&e, after, 7) == want,
            "{name} after a prefix"
        );
    }
}
