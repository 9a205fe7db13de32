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
    run(util::cargo()
        .args([
            "build",
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
    run(Command::new(&tools.wasm_bindgen)
        .args([
            "--target",
            &cfg.build.target,
            "--out-name",
            "straddle",
            "--out-dir",
        ])
        .arg(&out)
        .arg(&wasm))?;
    // The script-tag build is a small classic script that imports the module next to it.
    let dist = root().join("web/dist");
    std::fs::create_dir_all(&dist)?;
    std::fs::copy(
        root().join("web/src/script-tag.js"),
        dist.join("straddle.js"),
    )
    .context("copying the script-tag build to web/dist")?;
    let size = std::fs::metadata(out.join("straddle_bg.wasm"))
        .map(|m| m.len())
        .unwrap_or(0);
    eprintln!(
        "build-web: {} ({:.1} MB wasm)",
        out.display(),
        size as f64 / 1e6
    );
    Ok(())
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
