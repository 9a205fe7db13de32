//! `straddle chat --mode auto` with the real model routes as the page does: a question the
//! edge answers right, with a confident first token, stays on the device; a multi-step word
//! problem goes to the cloud before any edge text is printed. The cloud address is a closed
//! local port, so a request that escalates fails visibly instead of being answered.

use std::path::PathBuf;
use std::process::{Command, Output};

fn model() -> Option<PathBuf> {
    straddle_testkit::model(straddle_testkit::SMOLLM2)
}

fn chat(model: &PathBuf, prompt: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_straddle"))
        .args(["chat", "--mode", "auto", "--max-tokens", "24"])
        .args(["--cloud", "http://127.0.0.1:9", "--timeout", "5"])
        .arg("--model")
        .arg(model)
        .arg(prompt)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("runs straddle")
}

#[test]
fn a_question_the_edge_answers_with_a_confident_first_token_stays_on_the_edge() {
    let Some(model) = model() else { return };
    let out = chat(&model, "Tell me the capital of Italy.");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.starts_with("route: edge (quality:"), "{stderr}");
    assert!(!stderr.contains("route: cloud"), "{stderr}");
    assert!(stdout.contains("Rome"), "{stdout}");
}

#[test]
fn a_multi_step_word_problem_goes_to_the_cloud_before_any_edge_text() {
    let Some(model) = model() else { return };
    let out = chat(
        &model,
        "A baker makes 14 trays of 18 rolls, sells 3/4 of them at $1.25 each and gives half of \
         the rest to a shelter. How many dollars does she earn, and how many rolls are left?",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("route: cloud ("), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "edge text was printed: {:?}",
        out.stdout
    );
    // The closed port stands in for an unreachable cloud: the failure names it.
    assert!(
        !out.status.success() && stderr.contains("127.0.0.1:9"),
        "{stderr}"
    );
}
