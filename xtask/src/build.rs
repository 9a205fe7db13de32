//! `build-web` and `build-worker`: the two wasm artefacts.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;
use serde::Deserialize;

use crate::setup::Tools;
use crate::util::{self, root, run};

#[derive(Deserialize)]
struct WasmPackToml {
    build: BuildSection,
    profile: std::collections::BTreeMap<String, ProfileSection>,
}

#[derive(Deserialize)]
struct BuildSection {
    #[serde(rename = "crate")]
    krate: String,
    out_dir: String,
    target: String,
}

#[derive(Deserialize)]
struct ProfileSection {
    cargo_profile: String,
    wasm_opt: bool,
    #[serde(default)]
    wasm_opt_args: Vec<String>,
}

/// Builds `crates/web` to `web/pkg` (wasm + JS glue + .d.ts).
pub fn web(tools: &Tools) -> anyhow::Result<()> {
    let release = std::env::args().any(|a| a == "--release");
    web_with_profile(tools, if release { "release" } else { "dev" })
}

/// Builds the web package with the named wasm-pack.toml profile.
pub fn web_with_profile(tools: &Tools, profile_name: &str) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(root().join("wasm-pack.toml")).context("reading wasm-pack.toml")?;
    let cfg: WasmPackToml = toml::from_str(&text).context("parsing wasm-pack.toml")?;
    let profile = cfg
        .profile
        .get(profile_name)
        .with_context(|| format!("wasm-pack.toml has no [profile.{profile_name}]"))?;
    let manifest = root().join(&cfg.build.krate).join("Cargo.toml");
    run(util::cargo_building("build")
        .args([
            "--quiet",
            "--lib",
            "--target",
            "wasm32-unknown-unknown",
            "--profile",
            &profile.cargo_profile,
            "--manifest-path",
        ])
        .arg(&manifest))?;
    let dir_name = if profile.cargo_profile == "dev" {
        "debug"
    } else {
        profile.cargo_profile.as_str()
    };
    let lib = cfg.build.krate.rsplit('/').next().unwrap_or("web");
    let mut wasm: PathBuf = util::target_dir()
        .join("wasm32-unknown-unknown")
        .join(dir_name)
        .join(format!("straddle_{lib}.wasm"));
    if profile.wasm_opt {
        if util::which("wasm-opt").is_some() {
            let opt = wasm.with_extension("opt.wasm");
            run(Command::new("wasm-opt")
                .args(&profile.wasm_opt_args)
                .arg(&wasm)
                .arg("-o")
                .arg(&opt))?;
            wasm = opt;
        } else {
            eprintln!(
                "build-web: wasm-opt not found (Debian: apt-get install binaryen); shipping unoptimised wasm"
            );
        }
    }
    let out = root().join(&cfg.build.out_dir);
    bindgen(tools, &cfg.build.target, &wasm, &out)?;
    // The script-tag build is a small classic script that imports the module next to it.
    let dist = root().join("web/dist");
    std::fs::create_dir_all(&dist)?;
    std::fs::copy(
        root().join("web/src/script-tag.js"),
        dist.join("straddle.js"),
    )
    .context("copying the script-tag build to web/dist")?;
    report(&out);
    web_threads(tools, &cfg, profile)
}

/// The threaded build (`web/pkg-threads`): the CPU model on a pool of Web Workers sharing
/// one memory. Needs the standard library rebuilt with atomics, so a nightly toolchain, and
/// its own target directory (other RUSTFLAGS would rebuild the main build's every time).
fn web_threads(tools: &Tools, cfg: &WasmPackToml, profile: &ProfileSection) -> anyhow::Result<()> {
    let out = root()
        .join(&cfg.build.out_dir)
        .with_file_name("pkg-threads");
    let Some(toolchain) = &tools.threads_toolchain else {
        eprintln!(
            "build-web: no nightly toolchain with rust-src here; {} is not built (pages run the CPU model on one thread)",
            out.display()
        );
        if out.exists() {
            std::fs::remove_dir_all(&out)?;
        }
        return Ok(());
    };
    let target_dir = util::target_dir().join("threads");
    let manifest = root().join(&cfg.build.krate).join("Cargo.toml");
    // `cargo rustc` gives the link arguments to the final crate alone, so changing them never
    // rebuilds the dependencies. wasm-bindgen needs the memory imported and shared, and the
    // thread-local storage hooks exported, to start a module per thread.
    let link_args = [
        "--shared-memory",
        "--import-memory",
        // Shared memory has a fixed maximum: let it grow to wasm32's 4 GiB.
        "--max-memory=4294967296",
        "--export=__wasm_init_tls",
        "--export=__tls_size",
        "--export=__tls_align",
        "--export=__tls_base",
    ];
    run(Command::new("rustup")
        .args(["run", toolchain, "cargo", "rustc", "--quiet", "--lib"])
        .args(["-Z", "build-std=panic_abort,std"])
        .args(["--target", "wasm32-unknown-unknown"])
        .args(["--profile", &profile.cargo_profile])
        .args(["--no-default-features", "--features", "threads"])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--")
        .args(
            link_args
                .iter()
                .flat_map(|a| ["-C".to_string(), format!("link-arg={a}")]),
        )
        // The outer `cargo xtask` is the stable toolchain's; its settings must not leak in.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env("CARGO_TARGET_DIR", &target_dir)
        // The main build's target flags (.cargo/config.toml), which this variable replaces,
        // plus what sharing memory needs.
        .env(
            "RUSTFLAGS",
            "-C target-feature=+atomics,+bulk-memory,+mutable-globals,+simd128 -C debug-assertions=off -C overflow-checks=off",
        ))
    .context("building the threaded browser package")?;
    let dir_name = if profile.cargo_profile == "dev" {
        "debug"
    } else {
        profile.cargo_profile.as_str()
    };
    let lib = cfg.build.krate.rsplit('/').next().unwrap_or("web");
    let mut wasm = target_dir
        .join("wasm32-unknown-unknown")
        .join(dir_name)
        .join(format!("straddle_{lib}.wasm"));
    if profile.wasm_opt && util::which("wasm-opt").is_some() {
        let opt = wasm.with_extension("opt.wasm");
        run(Command::new("wasm-opt")
            .args(&profile.wasm_opt_args)
            .arg("--enable-threads")
            .arg(&wasm)
            .arg("-o")
            .arg(&opt))?;
        wasm = opt;
    }
    bindgen(tools, &cfg.build.target, &wasm, &out)?;
    report(&out);
    Ok(())
}

fn bindgen(
    tools: &Tools,
    target: &str,
    wasm: &std::path::Path,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    run(Command::new(&tools.wasm_bindgen)
        .args(["--target", target, "--out-name", "straddle", "--out-dir"])
        .arg(out)
        .arg(wasm))
}

fn report(out: &std::path::Path) {
    let size = std::fs::metadata(out.join("straddle_bg.wasm"))
        .map(|m| m.len())
        .unwrap_or(0);
    eprintln!(
        "build-web: {} ({:.1} MB wasm)",
        out.display(),
        size as f64 / 1e6
    );
}

/// Builds `worker/` for workerd with worker-build, offline: every tool comes from setup.
pub fn worker(tools: &Tools) -> anyhow::Result<()> {
    run(Command::new(&tools.worker_build)
        .arg("--release")
        .current_dir(root().join("worker"))
        .env("WASM_BINDGEN_BIN", &tools.wasm_bindgen)
        .env("ESBUILD_BIN", &tools.esbuild))
    .context("building the worker")
}
