//! The browser tests fetch real models from URLs fixed when they are compiled (a wasm test
//! reads no environment). Where a URL is unset, the tests that need it are marked ignored, so
//! the runner counts them as skipped; under `CI=true` they stay and fail, naming the variable.

/// Each URL variable and the cfg that marks its tests ignored.
const URLS: [(&str, &str); 2] = [
    ("STRADDLE_TEST_MODEL_URL", "no_test_model_url"),
    ("STRADDLE_TEST_GEMMA_URL", "no_test_gemma_url"),
];

fn main() {
    println!("cargo::rerun-if-env-changed=CI");
    let ci = straddle_testkit::in_ci();
    for (var, cfg) in URLS {
        println!("cargo::rerun-if-env-changed={var}");
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if std::env::var_os(var).is_none() && !ci {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
