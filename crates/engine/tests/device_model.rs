//! The burn model ([`DeviceModel`]) against the CPU model and against llama.cpp, on burn's
//! `flex` CPU backend and on wgpu (Vulkan; Mesa lavapipe on a machine without a GPU).
//!
//! The CPU model quantizes activations to 8 bits per block (as llama.cpp does) except for F32
//! weights; the device model multiplies f32 activations by the exactly dequantized weights.
//! So the sharp check compares a quantized tiny model on the device with the CPU model of the
//! same weights dequantized to F32: both are then exact f32 arithmetic, differing only in
//! summation order.

mod common;
mod tiny;

use std::sync::OnceLock;

use straddle_engine::Device;
use straddle_engine::gguf::{FileSource, Gguf};
use straddle_engine::quant::TensorType;
use straddle_engine::{BlockingLm, Chunk, DeviceCache, DeviceModel};
use straddle_engine::{Engine, Prompt};
use straddle_engine::{Model, ModelError};
use straddle_testkit::llama_reference::{Reference, Tolerance};

/// Relative tolerance between the device model (f32 attention) and the CPU model on the same
/// f32 weights (attention at f16 precision, as llama.cpp's cache holds it).
const ATTENTION_TOL: f32 = 1e-2;

/// The device model's logits for `tokens` after `cache`: every position's where `all`, else
/// the last one's.
fn device_logits(
    dev: &DeviceModel,
    tokens: &[u32],
    cache: &mut DeviceCache,
    all: bool,
) -> Result<Vec<Vec<f32>>, ModelError> {
    match all {
        true => dev.forward_all_blocking(tokens, cache),
        false => dev.forward_last_blocking(tokens, cache).map(|l| vec![l]),
    }
}

/// One pass over `chunks[i]` at `caches[i]`'s next positions, logits where `want`.
fn device_chunks(
    dev: &DeviceModel,
    chunks: &[&[u32]],
    caches: &mut [&mut DeviceCache],
    want: &[bool],
) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
    let chunks: Vec<Chunk> = chunks
        .iter()
        .zip(caches.iter())
        .zip(want)
        .map(|((&tokens, cache), &want_logits)| Chunk {
            tokens,
            pass: cache.len()..cache.len() + tokens.len(),
            want_logits,
        })
        .collect();
    dev.forward_chunks_blocking(&chunks, caches)
}

/// The wgpu device, initialised once per test process (burn refuses a second init);
/// without an adapter, [`straddle_testkit::no_wgpu_adapter`].
fn wgpu_device() -> Option<Device> {
    static DEVICE: OnceLock<Option<Device>> = OnceLock::new();
    DEVICE
        .get_or_init(|| match Device::wgpu_options().init() {
            Ok(device) => Some(device),
            Err(e) => straddle_testkit::no_wgpu_adapter(&e.to_string()),
        })
        .clone()
}

fn devices() -> Vec<(&'static str, Device)> {
    let mut all = vec![("flex", Device::flex())];
    if let Some(d) = wgpu_device() {
        all.push(("wgpu", d));
    }
    all
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0.0, |a, x| a.max(x.abs()))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn tiny_models_match_the_cpu_model_on_every_backend() {
    let tokens = [3u32, 17, 5, 39, 0, 22];
    for (backend, device) in devices() {
        for ty in [
            TensorType::F32,
            TensorType::F16,
            TensorType::BF16,
            TensorType::Q8_0,
            TensorType::Q5_0,
            TensorType::Q5_1,
            TensorType::Q4_0,
            TensorType::Q4_1,
            TensorType::Q4_K,
            TensorType::Q5_K,
            TensorType::Q6_K,
        ] {
            for (heads, kv_heads, untied) in [(4, 4, false), (4, 2, true), (8, 2, false)] {
                let g = Gguf::read(tiny::model(ty, heads, kv_heads, untied)).expect("tiny gguf");
                let exact = Gguf::read(tiny::model_as_f32(ty, heads, kv_heads, untied))
                    .expect("tiny f32 gguf");
                let cpu = Model::load(&exact, 64).expect("cpu load");
                let dev = DeviceModel::load(&g, 64, &device).expect("device load");
                let what = format!("{backend} {ty:?} heads {heads}/{kv_heads} untied {untied}");
                if ty.block_elements() > 1 {
                    // Block types stay packed on the device: at most 10 bits a weight (Q6_K
                    // as 8-bit values with an f32 scale per 16) against f32's 32.
                    let f32_bytes = DeviceModel::load(&exact, 64, &device)
                        .expect("f32 device load")
                        .weight_bytes();
                    let ratio = dev.weight_bytes() as f64 / f32_bytes as f64;
                    assert!(ratio < 0.33, "{what}: device weights {ratio:.2} of f32");
                }

                // Batched prefill of 5, then one decode step, against the CPU model.
                let mut cpu_cache = cpu.new_cache(64);
                let mut dev_cache = dev.new_cache(64);
                let mut want = cpu
                    .forward(&tokens[..5], &mut cpu_cache, true)
                    .expect("cpu prefill");
                want.extend(
                    cpu.forward(&tokens[5..], &mut cpu_cache, false)
                        .expect("cpu decode"),
                );
                let mut got = device_logits(&dev, &tokens[..5], &mut dev_cache, true)
                    .expect("device prefill");
                got.extend(
                    device_logits(&dev, &tokens[5..], &mut dev_cache, false)
                        .expect("device decode"),
                );
                assert_eq!(got.len(), want.len(), "{what}");
                assert_eq!(dev_cache.len(), 6);
                for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                    // f32 weights on both sides; the CPU model holds attention at f16
                    // precision (llama.cpp's cache type, `attention.rs`), the device model
                    // at f32, which moves a logit of these random-weight models by up to 10⁻² of the
                    // largest (an architecture mistake moves it by the order of the logits).
                    let tol = ATTENTION_TOL * max_abs(w) + ATTENTION_TOL;
                    let diff = max_diff(g, w);
                    assert!(
                        diff <= tol,
                        "{what} step {step}: |Δlogit| {diff} > {tol}\n got {:?}\nwant {:?}",
                        &g[..8],
                        &w[..8]
                    );
                }
            }
        }
    }
}

/// Continuous batching on the device: sequences run together equal each run alone, a cache
/// grown mid-sequence keeps what it held, and a verification after a pending token accepts the
/// greedy continuation up to the first wrong token.
#[test]
fn batched_sequences_equal_each_alone_on_every_backend() {
    use straddle_engine::sample::{Rng, SamplingParams, argmax};
    let (a, b) = ([3u32, 17, 5], [9u32, 1, 2, 7, 4]);
    for (backend, device) in devices() {
        let g = Gguf::read(tiny::model(TensorType::Q4_1, 4, 2, false)).expect("tiny gguf");
        let dev = DeviceModel::load(&g, 64, &device).expect("device load");
        let close = |got: &[f32], want: &[f32], what: &str| {
            let tol = 1e-4 * max_abs(want) + 1e-4;
            let diff = max_diff(got, want);
            assert!(diff <= tol, "{backend} {what}: |Δlogit| {diff} > {tol}");
        };

        // Alone: each prompt, then one decoded token each.
        let (mut ca, mut cb) = (dev.new_cache(64), dev.new_cache(64));
        let la = device_logits(&dev, &a, &mut ca, false).expect("a")[0].clone();
        let lb = device_logits(&dev, &b, &mut cb, false).expect("b")[0].clone();
        let la2 = device_logits(&dev, &[6], &mut ca, false).expect("a+1")[0].clone();
        let lb2 = device_logits(&dev, &[8], &mut cb, false).expect("b+1")[0].clone();

        // Together, the first sequence in a cache too small for its decode step until grown.
        let (mut ta, mut tb) = (dev.new_cache(3), dev.new_cache(64));
        let both = device_chunks(&dev, &[&a, &b], &mut [&mut ta, &mut tb], &[true, true])
            .expect("batched prefill");
        close(both[0].as_deref().expect("logits a"), &la, "prefill a");
        close(both[1].as_deref().expect("logits b"), &lb, "prefill b");
        assert!(matches!(
            device_chunks(&dev, &[&[6], &[8]], &mut [&mut ta, &mut tb], &[true, true]),
            Err(ModelError::ContextFull { .. })
        ));
        assert_eq!(
            (ta.len(), tb.len()),
            (3, 5),
            "a refused batch moves no cache"
        );
        dev.reserve(&mut ta, 16);
        assert_eq!((ta.len(), ta.capacity()), (3, 16));
        let next = device_chunks(&dev, &[&[6], &[8]], &mut [&mut ta, &mut tb], &[false, true])
            .expect("batched decode");
        assert!(next[0].is_none(), "{backend}: logits came back unasked");
        close(next[1].as_deref().expect("logits b+1"), &lb2, "decode b");
        let again = device_logits(&dev, &[7], &mut ta, false).expect("a+2");
        let mut check = dev.new_cache(64);
        device_logits(&dev, &a, &mut check, false).expect("a");
        close(
            &device_logits(&dev, &[6], &mut check, false).expect("a+1")[0],
            &la2,
            "decode a alone twice",
        );
        close(
            &again[0],
            &device_logits(&dev, &[7], &mut check, false).expect("a+2")[0],
            "decode after growing",
        );

        // Verification after a pending token: the greedy continuation of `a` is accepted up
        // to a token that is not it.
        let mut greedy = Vec::new();
        let mut cache = dev.new_cache(64);
        let mut logits = device_logits(&dev, &a, &mut cache, false).expect("a")[0].clone();
        for _ in 0..3 {
            let t = argmax(&logits);
            greedy.push(t);
            logits = device_logits(&dev, &[t], &mut cache, false).expect("greedy")[0].clone();
        }
        let wrong = (greedy[2] + 1) % tiny::VOCAB as u32;
        let mut cache = dev.new_cache(64);
        device_logits(&dev, &a[..2], &mut cache, false).expect("held");
        let verdict = straddle_engine::speculative::verify_after(
            &dev,
            &mut cache,
            a[2],
            &[greedy[0], greedy[1], wrong],
            &SamplingParams::default(),
            &a[..2],
            &mut Rng::new(0),
        )
        .expect("verify");
        assert_eq!(
            (verdict.accepted, verdict.next_token),
            (2, greedy[2]),
            "{backend}"
        );
        assert_eq!(
            cache.len(),
            a.len() + 2,
            "{backend}: the cache keeps what was accepted"
        );
    }
}

#[test]
fn device_model_reports_bad_tokens_and_a_full_context() {
    let g = Gguf::read(tiny::model(TensorType::Q4_1, 4, 2, false)).expect("tiny gguf");
    let dev = DeviceModel::load(&g, 8, &Device::flex()).expect("load");
    let mut cache = dev.new_cache(8);
    assert!(matches!(
        device_logits(&dev, &[tiny::VOCAB as u32], &mut cache, false),
        Err(ModelError::BadToken(_))
    ));
    assert_eq!(
        cache.len(),
        0,
        "a rejected token must not advance the cache"
    );
    device_logits(&dev, &[1; 8], &mut cache, false).expect("fills the cache");
    assert!(matches!(
        device_logits(&dev, &[1], &mut cache, false),
        Err(ModelError::ContextFull {
            needed: 9,
            capacity: 8
        })
    ));
}

/// A header that lies about Gemma 3's head size (the Q/K norms and projections then disagree
/// with it) is the same typed error on the device as on the CPU, never a panic.
#[test]
fn a_lying_header_is_a_typed_error_on_the_device() {
    let bytes = tiny::gemma3_with_lying_heads();
    let g = Gguf::read(bytes).expect("still a valid GGUF");
    let err = DeviceModel::load(&g, 64, &Device::flex()).unwrap_err();
    assert!(matches!(&err, ModelError::Shape { .. }), "{err}");
}

/// The real model on each backend, fed llama.cpp's own greedy continuation (teacher forcing,
/// so one near-tie does not end the comparison): at every step where llama.cpp's top-1 beats
/// its top-2 by `TIE_MARGIN` we choose the same token, and its top-5 logits agree within
/// `LOGIT_TOL`. llama.cpp rounds activations to 8 bits for its quantized dot products and the
/// device model does not, so the gap is llama.cpp's rounding noise: measured up to ≈ 1.1 on
/// logits of magnitude 15–35, against 0.83 for our CPU model, which rounds as llama.cpp does.
#[test]
fn real_model_agrees_with_llama_cpp_on_every_backend() {
    // Short prompts (13 and 8 tokens) with 8 decisive steps among their first 8: the slow
    // software backends spend their time on decode, not on long prefills.
    let Some(path) = common::model_path() else {
        return;
    };
    let reference = include_str!("../../../tests/reference/smollm2-135m-q4_1.json");
    agrees_with_llama_cpp(&path, reference, &["en-story", "code-python"], 1.5);
}

/// Gemma 3 270M on each backend, as [`real_model_agrees_with_llama_cpp_on_every_backend`]
/// checks the default model: its sliding-window and global layers, QK and post norms, GELU,
/// and Q5_0/Q8_0/Q4_K/Q6_K weights kept quantized. The tolerance is the wasm CPU test's:
/// Gemma's 256-wide heads round more.
#[test]
fn gemma3_agrees_with_llama_cpp_on_every_backend() {
    let Some(path) = common::gemma_path() else {
        return;
    };
    let reference = include_str!("../../../tests/reference/gemma-3-270m-q4_k_m.json");
    agrees_with_llama_cpp(&path, reference, &["list"], 2.5);
}

/// The model at `path` on every backend against llama.cpp's `reference` on the prompts
/// `cases`, for their first 8 steps.
fn agrees_with_llama_cpp(path: &std::path::Path, reference: &str, cases: &[&str], tol: f64) {
    const STEPS: usize = 8;
    let reference = Reference::parse(reference);
    let engine = Engine::load(FileSource::open(path).expect("open"), 512).expect("load");
    let g = Gguf::read(FileSource::open(path).expect("open")).expect("gguf");
    let chosen = || {
        reference
            .cases
            .iter()
            .filter(|c| cases.contains(&c.name.as_str()))
    };
    let decisive = chosen()
        .flat_map(|c| (0..STEPS.min(c.top5.len())).filter(|&s| c.decisive(s)))
        .count();
    assert!(
        decisive >= 5,
        "the reference has only {decisive} decisive steps"
    );
    for (backend, device) in devices() {
        let dev = DeviceModel::load(&g, 512, &device).expect("device load");
        let mut max_err = 0f64;
        for case in chosen() {
            let ids = engine
                .prompt_tokens(Prompt::Text(&case.prompt))
                .expect("tokenize");
            let mut cache = dev.new_cache(512);
            let mut tokens = ids;
            for step in 0..STEPS.min(case.greedy.len()) {
                let logits = device_logits(&dev, &tokens, &mut cache, false)
                    .expect("forward")
                    .pop()
                    .expect("logits");
                let err = case.check_step(backend, step, &logits, Tolerance::Absolute(tol));
                max_err = max_err.max(err);
                tokens = vec![case.greedy[step]];
            }
        }
        eprintln!(
            "{backend}: {decisive} clear-margin steps agree with llama.cpp; max |Δlogit| {max_err:.3}"
        );
    }
}

/// Every architecture on the device against the CPU model of the same weights in F32 (so
/// both are exact f32 arithmetic): Gemma 3 with a prompt that outgrows its sliding windows
/// around a global layer, then decoding past them; and the families `tiny::family` writes
/// (Qwen 2's biases, Qwen 3's head norms and wide heads, Llama 3, Phi 3's fused tensors).
#[test]
fn every_architecture_matches_the_cpu_model_on_every_backend() {
    let mut models = vec![("gemma3".to_string(), tiny::gemma3(TensorType::Q5_0, 7, 3))];
    if let Some(path) = common::model_path() {
        let vocab = Gguf::read(FileSource::open(path).expect("open")).expect("the default model");
        for (name, arch, pre) in tiny::FAMILIES {
            models.push((name.to_string(), tiny::family(arch, pre, &vocab)));
        }
    }
    let prompt = [3u32, 17, 5, 39, 0, 22, 9, 31];
    for (backend, device) in devices() {
        for (name, bytes) in &models {
            let g = Gguf::read(bytes.clone()).expect("tiny gguf");
            let cpu = Model::load(&Gguf::read(tiny::as_f32(&g)).expect("f32 twin"), 64)
                .expect("cpu load");
            let dev = DeviceModel::load(&g, 64, &device).expect("device load");
            let (mut cpu_cache, mut dev_cache) = (cpu.new_cache(64), dev.new_cache(64));
            let mut want = cpu.forward(&prompt, &mut cpu_cache, true).expect("cpu");
            let mut got = device_logits(&dev, &prompt, &mut dev_cache, true).expect("device");
            for tok in [7u32, 2, 11] {
                want.extend(cpu.forward(&[tok], &mut cpu_cache, false).expect("cpu"));
                got.extend(device_logits(&dev, &[tok], &mut dev_cache, false).expect("device"));
            }
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                let tol = ATTENTION_TOL * max_abs(w) + ATTENTION_TOL;
                let diff = max_diff(g, w);
                assert!(
                    diff <= tol,
                    "{backend} {name} row {step}: |Δlogit| {diff} > {tol}"
                );
            }
        }
    }
}

/// Gemma 3's sliding-window layers keep a ring of their window plus one pass's rows on the
/// device, as on the CPU: a prompt that wraps the ring twice (run in parts of a pass's rows)
/// and decoding past it give the CPU model's logits, from a cache that holds less than every
/// position.
#[test]
fn gemma3_ring_cache_on_the_device_matches_the_cpu_model() {
    const CONTEXT: usize = 512;
    let g = Gguf::read(tiny::gemma3_with_context(
        TensorType::Q8_0,
        7,
        3,
        CONTEXT as u32,
    ))
    .expect("tiny gemma3");
    let cpu =
        Model::load(&Gguf::read(tiny::as_f32(&g)).expect("f32 twin"), CONTEXT).expect("cpu load");
    let every_position = 2 * cpu.config.n_layers * CONTEXT * cpu.config.kv_dim() * 4;
    let prompt: Vec<u32> = (0..300u32).map(|i| i * 7919 % tiny::VOCAB as u32).collect();
    for (backend, device) in devices() {
        let dev = DeviceModel::load(&g, CONTEXT, &device).expect("device load");
        assert!(
            dev.cache_bytes(CONTEXT) < every_position / 2,
            "{backend}: the window layers hold only their ring"
        );
        let (mut cpu_cache, mut dev_cache) = (cpu.new_cache(CONTEXT), dev.new_cache(CONTEXT));
        let mut want = cpu.forward(&prompt, &mut cpu_cache, true).expect("cpu");
        let mut got = device_logits(&dev, &prompt, &mut dev_cache, true).expect("device");
        assert_eq!(dev_cache.len(), prompt.len());
        for tok in [7u32, 2, 11] {
            want.extend(cpu.forward(&[tok], &mut cpu_cache, false).expect("cpu"));
            got.extend(device_logits(&dev, &[tok], &mut dev_cache, false).expect("device"));
        }
        assert_eq!(got.len(), want.len());
        for (row, (g, w)) in got.iter().zip(&want).enumerate() {
            let tol = ATTENTION_TOL * max_abs(w) + ATTENTION_TOL;
            let diff = max_diff(g, w);
            assert!(diff <= tol, "{backend} row {row}: |Δlogit| {diff} > {tol}");
        }
    }
}

/// Runs a future to completion on this thread (the device model's readback is async).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Speculation drafting on the device (what the page does on WebGPU), verified greedily by
/// the CPU model: the output is the verifier's own greedy output token for token, drafts are
/// mostly accepted (the cache is rewound to the accepted prefix correctly), and a switch to the
/// device alone mid-answer continues from exactly the tokens shown.
#[test]
fn drafting_on_the_device_gives_the_verifier_s_greedy_output() {
    use straddle_engine::speculative::{DraftLength, Speculation, Verdict};
    use straddle_engine::{ChatMessage, GenerateParams};

    const TOKENS: usize = 14;
    let Some(path) = common::model_path() else {
        return;
    };
    let Some(device) = wgpu_device() else {
        return;
    };
    let cpu = Engine::load(FileSource::open(&path).expect("open"), 256).expect("cpu load");
    let dev = Engine::load_on(FileSource::open(&path).expect("open"), 256, &device).expect("load");
    let params = GenerateParams {
        max_tokens: TOKENS,
        context: 256,
        ..Default::default()
    };
    let mut accepted = 0;
    let mut drafted = 0;
    for (i, question) in [
        "Write a short story about a robot who learns to paint.",
        "Explain how a bicycle works.",
    ]
    .into_iter()
    .enumerate()
    {
        let messages = [ChatMessage::new("user", question)];
        let greedy = cpu
            .generate(Prompt::Messages(&messages), &params, |_| {
                straddle_engine::Flow::Continue
            })
            .expect("cpu greedy");
        // The verifier: greedy verification against the CPU model's answer.
        let verify = |shown: &[u32], draft: &[u32]| {
            let at = |j: usize| greedy.tokens.get(j).copied();
            let accepted = draft
                .iter()
                .enumerate()
                .take_while(|&(j, &t)| at(shown.len() + j) == Some(t))
                .count();
            let next_token = at(shown.len() + accepted)
                .unwrap_or_else(|| cpu.tokenizer.stop_ids.first().copied().unwrap_or(0));
            Verdict {
                accepted,
                next_token,
            }
        };
        let mut spec = block_on(Speculation::start_with(
            &dev,
            Prompt::Messages(&messages),
            &params,
            DraftLength::default(),
        ))
        .expect("start");
        // The second question switches to the device alone after two verify calls.
        let alone_after = if i == 1 { 2 } else { usize::MAX };
        let mut calls = 0;
        while calls < alone_after {
            let Some(draft) = block_on(spec.draft_with(&dev.model)).expect("draft") else {
                break;
            };
            let draft = draft.to_vec();
            let v = verify(spec.tokens(), &draft);
            drafted += draft.len();
            accepted += v.accepted;
            block_on(spec.settle_with(&dev.model, &dev.tokenizer, v)).expect("settle");
            calls += 1;
        }
        if alone_after == usize::MAX {
            assert_eq!(spec.tokens(), greedy.tokens, "{question}");
            assert_eq!(spec.text(), greedy.text, "{question}");
            assert!(calls < greedy.tokens.len(), "{calls} calls");
        } else {
            let shown = spec.tokens().to_vec();
            assert_eq!(shown, greedy.tokens[..shown.len()], "{question}");
            while block_on(spec.step_alone_with(&dev.model, &dev.tokenizer))
                .expect("alone")
                .is_some()
            {}
            assert_eq!(&spec.tokens()[..shown.len()], shown.as_slice());
            assert_eq!(spec.tokens().len(), TOKENS, "{question}: nothing dropped");
            assert_eq!(
                spec.text(),
                dev.tokenizer.decode(spec.tokens()).expect("decode")
            );
            assert_eq!(spec.stats().edge_alone, TOKENS - shown.len());
        }
    }
    let rate = accepted as f64 / drafted as f64;
    eprintln!("device drafts: {accepted}/{drafted} accepted");
    assert!(rate >= 0.5, "device drafts accepted {rate:.2}");
}
