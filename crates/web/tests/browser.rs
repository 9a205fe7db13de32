//! Runs in headless Chromium through wasm-bindgen-test (see `webdriver.json`).
#![cfg(target_arch = "wasm32")]

use straddle_testkit::llama_reference::{Case, Reference, Tolerance};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

#[wasm_bindgen_test]
async fn webgpu_adapter_is_found_with_the_limits_we_design_for() {
    let info = straddle_web::probe_device().await;
    assert!(
        info.webgpu,
        "no WebGPU adapter: is Chromium started with --enable-unsafe-webgpu?"
    );
    assert!(info.max_invocations_per_workgroup >= 256);
}

#[wasm_bindgen_test]
fn pii_scan_runs_in_the_browser() {
    assert_eq!(
        straddle_web::pii_kinds("card 4111 1111 1111 1111"),
        vec!["payment_card".to_string()]
    );
}

#[wasm_bindgen_test]
fn routing_runs_in_the_browser_and_keeps_a_card_on_the_device() {
    let ctx = r#"{"online":true,"edge_available":true,"edge_tokens_per_s":30,"rtt_ms":50,"edge_languages":["en"]}"#;
    let turns = vec![
        "my card is 4111 1111 1111 1111".to_string(),
        "Noted.".to_string(),
        "Write an essay".to_string(),
    ];
    let json = straddle_web::route(turns, None, ctx, None).expect("decision");
    assert!(json.contains(r#""target":"edge""#), "{json}");
    assert!(json.contains(r#""rule":"privacy""#), "{json}");
    // A rule's edge decision is never escalated at the first token.
    let unsure = r#"{"entropy":9.0,"logprob":-9.0,"margin":0.0}"#;
    let check = straddle_web::first_token(&json, unsure, None).expect("check");
    assert!(check.contains(r#""escalate":null"#), "{check}");
}

/// The model URL a test was built with. Without one the test is ignored (see `build.rs`)
/// except under `CI=true`, where it runs to this failure.
fn served(url: Option<&'static str>, var: &str) -> &'static str {
    url.unwrap_or_else(|| {
        panic!("CI=true: {var} was unset when the tests were built (run `cargo xtask test`)")
    })
}

/// Feeds `model` `prompt`, then llama.cpp's greedy continuation of `case` (teacher forcing,
/// so one near-tie does not end the comparison) for `steps` steps, each held to llama.cpp's
/// by [`Case::check_step`] within `tol`. Returns how many steps were decisive.
async fn teacher_forced<M: straddle_engine::CausalLm>(
    model: &M,
    prompt: &[u32],
    case: &Case,
    steps: usize,
    tol: f64,
) -> usize {
    let mut cache = model.new_cache(prompt.len() + steps);
    let mut tokens = prompt.to_vec();
    for step in 0..steps.min(case.greedy.len()) {
        let logits = model
            .forward_last(&tokens, &mut cache)
            .await
            .expect("forward");
        let who = std::any::type_name::<M>();
        case.check_step(who, step, &logits, Tolerance::Absolute(tol));
        tokens = vec![case.greedy[step]];
    }
    (0..steps.min(case.greedy.len()))
        .filter(|&s| case.decisive(s))
        .count()
}

thread_local! {
    /// The page's WebGPU device: burn registers one per device id and refuses a second.
    static DEVICE: std::cell::RefCell<Option<straddle_engine::Device>> =
        const { std::cell::RefCell::new(None) };
}

/// The WebGPU device, initialised by the first test that asks for it.
async fn webgpu_device() -> straddle_engine::Device {
    if let Some(device) = DEVICE.with(|d| d.borrow().clone()) {
        return device;
    }
    let device = straddle_engine::Device::wgpu_options()
        .init_async()
        .await
        .expect("WebGPU device");
    DEVICE.with(|d| *d.borrow_mut() = Some(device.clone()));
    device
}

/// Fetches `url` into memory, as a page loads a model from a CDN.
async fn fetch_bytes(url: &str) -> Vec<u8> {
    use wasm_bindgen::JsCast;
    use wasm_bindgen_futures::JsFuture;
    let global = js_sys::global();
    let fetch: js_sys::Function = js_sys::Reflect::get(&global, &"fetch".into())
        .expect("fetch")
        .dyn_into()
        .expect("fetch is a function");
    let response = JsFuture::from(js_sys::Promise::from(
        fetch.call1(&global, &url.into()).expect("fetch call"),
    ))
    .await
    .expect("fetch the model: is the xtask file server up?");
    let array_buffer: js_sys::Function = js_sys::Reflect::get(&response, &"arrayBuffer".into())
        .expect("arrayBuffer")
        .dyn_into()
        .expect("arrayBuffer is a function");
    let buffer = JsFuture::from(js_sys::Promise::from(
        array_buffer.call0(&response).expect("arrayBuffer call"),
    ))
    .await
    .expect("model body");
    js_sys::Uint8Array::new(&buffer).to_vec()
}

/// The real model, fetched over HTTP and run through burn on WebGPU (SwiftShader here),
/// agrees with llama.cpp exactly as the native backends must in
/// `crates/engine/tests/device_model.rs`: fed llama.cpp's greedy continuation, it picks the
/// same token at every step where llama.cpp's top-1 leads clearly, with top-5 logits within
/// 1.5 ([`teacher_forced`]).
#[wasm_bindgen_test]
#[cfg_attr(
    no_test_model_url,
    ignore = "STRADDLE_TEST_MODEL_URL unset when built (cargo xtask test sets it)"
)]
async fn real_model_on_webgpu_agrees_with_llama_cpp() {
    straddle_web::run_constructors_once();
    let url = served(
        option_env!("STRADDLE_TEST_MODEL_URL"),
        "STRADDLE_TEST_MODEL_URL",
    );
    let reference = Reference::parse(include_str!(
        "../../../tests/reference/smollm2-135m-q4_1.json"
    ));
    let bytes = fetch_bytes(url).await;
    let device = webgpu_device().await;
    let engine = straddle_engine::Engine::load_on(bytes, 256, &device).expect("load on WebGPU");
    // One short prompt (8 tokens, 5 decisive steps): SwiftShader runs ≈ 0.3 tokens/s.
    let case = reference.case("code-python");
    let ids = engine
        .prompt_tokens(straddle_engine::Prompt::Text(&case.prompt))
        .expect("tokenize");
    let clear_steps = teacher_forced(&engine.model, &ids, case, 8, 1.5).await;
    console_log!("webgpu: {clear_steps} clear-margin steps agree with llama.cpp");
    assert_eq!(clear_steps, 5);
}

/// Gemma 3 on the wasm CPU kernels (what the page runs on a software adapter or without
/// WebGPU): its SentencePiece tokenizer gives llama.cpp's ids for every reference prompt, and
/// fed llama.cpp's greedy continuation of a short one (8 tokens, 5 clear-margin steps of 8),
/// it picks the same token at every clear-margin step with top-5 logits within 2.5.
#[wasm_bindgen_test]
#[cfg_attr(
    no_test_gemma_url,
    ignore = "STRADDLE_TEST_GEMMA_URL unset when built (cargo xtask test sets it)"
)]
async fn gemma3_on_the_wasm_cpu_kernels_agrees_with_llama_cpp() {
    straddle_web::run_constructors_once();
    let url = served(
        option_env!("STRADDLE_TEST_GEMMA_URL"),
        "STRADDLE_TEST_GEMMA_URL",
    );
    let reference = Reference::parse(include_str!(
        "../../../tests/reference/gemma-3-270m-q4_k_m.json"
    ));
    let engine = straddle_engine::Engine::load(fetch_bytes(url).await, 256).expect("load");
    for case in &reference.cases {
        let ids = engine
            .prompt_tokens(straddle_engine::Prompt::Text(&case.prompt))
            .expect("tokenize");
        assert_eq!(ids, case.prompt_tokens, "{}: token ids", case.name);
    }
    let case = reference.case("list");
    let clear_steps = teacher_forced(&engine.model, &case.prompt_tokens, case, 8, 2.5).await;
    console_log!("gemma3 (wasm cpu): {clear_steps} clear-margin steps agree with llama.cpp");
    assert_eq!(clear_steps, 5);
}

/// Gemma 3 through burn on WebGPU (SwiftShader here): its sliding-window and global layers,
/// head norms, GELU and an output head of 262,144 rows uploaded in parts, fed llama.cpp's
/// greedy continuation of a short prompt for 6 steps (3 with a clear margin): the same token
/// at every clear-margin step, top-5 logits within 2.5.
#[wasm_bindgen_test]
#[cfg_attr(
    no_test_gemma_url,
    ignore = "STRADDLE_TEST_GEMMA_URL unset when built (cargo xtask test sets it)"
)]
async fn gemma3_on_webgpu_agrees_with_llama_cpp() {
    straddle_web::run_constructors_once();
    let url = served(
        option_env!("STRADDLE_TEST_GEMMA_URL"),
        "STRADDLE_TEST_GEMMA_URL",
    );
    let reference = Reference::parse(include_str!(
        "../../../tests/reference/gemma-3-270m-q4_k_m.json"
    ));
    let device = webgpu_device().await;
    let engine = straddle_engine::Engine::load_on(fetch_bytes(url).await, 64, &device)
        .expect("load on WebGPU");
    let case = reference.case("list");
    // SwiftShader runs a 270M model at a fraction of a token a second.
    let clear_steps = teacher_forced(&engine.model, &case.prompt_tokens, case, 6, 2.5).await;
    console_log!("gemma3 (webgpu): {clear_steps} clear-margin steps agree with llama.cpp");
    assert_eq!(clear_steps, 3);
}

/// The wasm SIMD128 kernels of the CPU engine (what the page runs on a software adapter or
/// without WebGPU) agree with the portable loops they replace.
#[wasm_bindgen_test]
fn simd_kernels_match_the_portable_dot_products() {
    use straddle_engine::quant::{TensorType, encode};
    use straddle_engine::{QActs, QMatrix};
    let (rows, cols) = (37, 160);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 211) as f32 - 105.0) / 60.0)
        .collect();
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 31 % 23) as f32 / 7.0) - 1.6)
        .collect();
    // The K-quants' super-blocks hold 256 values: their rows are two of them wide.
    let w6: Vec<f32> = (0..rows * 512)
        .map(|i| ((i * 7919 % 211) as f32 - 105.0) / 60.0)
        .collect();
    let x6: Vec<f32> = (0..512)
        .map(|i| ((i * 31 % 23) as f32 / 7.0) - 1.6)
        .collect();
    for (ty, bytes) in [
        (TensorType::Q4_1, encode::q4_1(&w)),
        (TensorType::Q8_0, encode::q8_0(&w)),
        (TensorType::Q5_0, encode::q5_0(&w)),
        (TensorType::Q5_1, encode::q5_1(&w)),
        (TensorType::Q4_K, encode::q4_k(&w6)),
        (TensorType::Q6_K, encode::q6_k(&w6)),
        (TensorType::Q5_K, encode::q5_k(&w6)),
    ] {
        let (cols, x) = match ty {
            TensorType::Q4_K | TensorType::Q6_K | TensorType::Q5_K => (512, &x6),
            _ => (cols, &x),
        };
        let m = QMatrix::from_gguf(ty, &bytes, rows, cols).expect("matrix");
        // In the rounding each format's products take (the K-quants' Q8_K with its sums).
        let acts = &QActs::quantize_as(x, m.act_format());
        for r in 0..rows {
            let (fast, portable) = (m.dot_row(r, acts), m.dot_row_portable(r, acts));
            assert!(
                (fast - portable).abs() <= 1e-4 * portable.abs().max(1.0),
                "{ty:?} row {r}: {fast} vs {portable}"
            );
        }
        // The product takes rows in pairs (an odd count leaves one), for one token or several.
        for tokens in [1, 3] {
            let xs = vec![acts.clone(); tokens];
            let mut out = vec![0f32; tokens * rows];
            m.matmul(&xs, &mut out);
            for (i, &fast) in out.iter().enumerate() {
                let portable = m.dot_row_portable(i % rows, acts);
                assert!(
                    (fast - portable).abs() <= 1e-4 * portable.abs().max(1.0),
                    "{ty:?} {tokens} tokens, row {}: {fast} vs {portable}",
                    i % rows
                );
            }
        }
    }
}

/// The sampler's log-probability and entropy (wasm SIMD's exponentials, ggml's polynomial
/// without fused multiply-adds) equal the definitions, over logits spanning f32's range of
/// eˣ and beyond it, with a masked one.
#[wasm_bindgen_test]
fn sampler_confidence_matches_the_definitions_in_wasm_simd() {
    use straddle_engine::sample::{Rng, SamplingParams, sample};
    let mut logits: Vec<f32> = (0..4099)
        .map(|i| 20.0 - (i as f32 * 0.061).rem_euclid(130.0))
        .collect();
    logits[7] = f32::NEG_INFINITY;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = max
        + logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let entropy: f64 = -logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| (l as f64 - log_sum).exp() * (l as f64 - log_sum))
        .sum::<f64>();
    let s = sample(&logits, &SamplingParams::default(), &[], &mut Rng::new(0));
    assert_eq!(s.token, 0);
    assert!(
        (s.logprob as f64 - (logits[0] as f64 - log_sum)).abs() < 1e-5,
        "{s:?}"
    );
    assert!(
        (s.entropy as f64 - entropy).abs() < 1e-5,
        "{s:?} vs {entropy}"
    );
}
