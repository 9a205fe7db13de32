//! Runs in headless Chromium through wasm-bindgen-test (see `webdriver.json`).
#![cfg(target_arch = "wasm32")]

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
    let json = straddle_web::route(
        "Write an essay; my card is 4111 1111 1111 1111",
        None,
        ctx,
        None,
    )
    .expect("decision");
    assert!(json.contains(r#""target":"edge""#), "{json}");
    assert!(json.contains(r#""rule":"privacy""#), "{json}");
}
