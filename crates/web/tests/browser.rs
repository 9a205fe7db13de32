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
