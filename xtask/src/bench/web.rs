//! `cargo xtask bench web`: the engine in Chromium beside wllama in the same browser.

use super::{model_flag, section_name, write_section};
use crate::util::{self, root};
use std::process::Command;
use straddle_models::{KnownModel, SMOLLM2};

/// The page's engine beside wllama (llama.cpp in wasm) in the same Chromium, same GGUF, same
/// run, on `known`.
pub(super) fn web(release: bool, known: KnownModel) -> anyhow::Result<()> {
    let tools = crate::setup::run()?;
    let profile = if release { "release" } else { "dev" };
    crate::build::web_with_profile(&tools, profile)?;
    let model = tools.path_of(known);
    let table = util::output(
        Command::new("node")
            .arg(root().join("web/bench/browser.mjs"))
            .arg("--model")
            .arg(model)
            .current_dir(root().join("web")),
    )?;
    print!("{table}");
    let flags = format!(
        "{}{}",
        if release { " --release" } else { "" },
        model_flag(known)
    );
    let title = match known {
        SMOLLM2 => "Browser: edge engine beside wllama".to_string(),
        other => format!(
            "Browser: edge engine beside wllama, {}",
            section_name(other)
        ),
    };
    write_section(
        &title,
        &format!(
            "Command: `cargo xtask bench web{flags}` (Debian's Chromium, headless, SwiftShader WebGPU; \
             wasm built with the `{profile}` profile of wasm-pack.toml, debug assertions off as in \
             every wasm32 build; wllama 3.13.0 from npm; \
             the 1-thread rows on a plain page, the 2-thread rows on a cross-origin-isolated one \
             (COOP/COEP), where Straddle runs `web/pkg-threads` and wllama its pthreads)\n\n{table}"
        ),
    )
}
