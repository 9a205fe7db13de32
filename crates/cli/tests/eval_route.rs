//! `straddle eval route --cloud-url`: the cloud tier's answers come from a real
//! OpenAI-compatible server (ours, on 127.0.0.1), each prompt asked once and cached; an
//! endpoint that is not there is named in the error.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{cloud_bin, model, start_cloud};

/// Three routine prompts and one programming task, in `../shared/data`'s layout.
fn fixture(dir: &Path) {
    let review = |text: &str, answer: usize| {
        format!(
            "{{\"prompt\": \"Is this review negative, neutral or positive?\\nReview: {text}\\nAnswer:\", \"choices\": [\"negative\", \"neutral\", \"positive\"], \"answer\": {answer}}}\n"
        )
    };
    let reviews =
        review("Awful, it broke.", 0) + &review("It is blue.", 1) + &review("I love it!", 2);
    std::fs::create_dir_all(dir.join("classify")).expect("classify/");
    std::fs::create_dir_all(dir.join("code")).expect("code/");
    std::fs::write(dir.join("classify/reviews.jsonl"), reviews).expect("reviews");
    std::fs::write(
        dir.join("code/tiny.jsonl"),
        "{\"task_id\": 1, \"prompt\": \"Write a Python function double(x) that returns twice x.\", \"test_setup_code\": \"\", \"tests\": [\"assert double(2) == 4\"]}\n",
    )
    .expect("code");
}

fn eval_route(dir: &Path, model: &Path, cloud_url: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_straddle"))
        .args(["eval", "route", "--json", "--cloud-url", cloud_url])
        .args(extra)
        .arg("--data")
        .arg(dir)
        .arg("--edge")
        .arg(model)
        .arg("--cache")
        .arg(dir.join("cache"))
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("runs straddle")
}

/// Lines in the cache files whose names start with `prefix`.
fn cached_answers(dir: &Path, prefix: &str) -> usize {
    std::fs::read_dir(dir.join("cache"))
        .expect("cache dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| {
            std::fs::read_to_string(e.path())
                .expect("read")
                .lines()
                .count()
        })
        .sum()
}

#[test]
fn the_cloud_tier_is_asked_over_http_once_per_prompt() {
    let (Some(model), Some(bin)) = (model(), cloud_bin()) else {
        return;
    };
    let cloud = start_cloud(&bin, &model);
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path());
    let url = format!("http://127.0.0.1:{}", cloud.port);
    let first = eval_route(dir.path(), &model, &url, &[]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&first.stdout).expect("json");
    assert!(
        report["cloud"].as_str().is_some_and(|c| c.contains(&url)),
        "{report}"
    );
    for bench in ["reviews", "code"] {
        let cloud_accuracy = &report["benchmarks"][bench]["cloud_accuracy"];
        assert!(cloud_accuracy.is_number(), "{bench}: {report}");
    }
    assert_eq!(
        cached_answers(dir.path(), "cloud-"),
        4,
        "one answer per prompt"
    );
    // Asked again, the endpoint answers nothing new and the report is the same.
    let second = eval_route(dir.path(), &model, &url, &[]);
    assert!(second.status.success());
    assert_eq!(cached_answers(dir.path(), "cloud-"), 4);
    let again: serde_json::Value = serde_json::from_slice(&second.stdout).expect("json");
    for bench in ["reviews", "code"] {
        // Everything but the router's own timing, which is measured afresh.
        for field in ["cloud_accuracy", "edge_accuracy", "routers"] {
            let (a, b) = (
                &again["benchmarks"][bench][field],
                &report["benchmarks"][bench][field],
            );
            assert_eq!(a, b, "{bench}.{field}");
        }
    }
    // A quality model from a file routes instead of the bundled one, and the report says so.
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../router/data/quality-models/qwen2.5-coder-0.5b.json"
    );
    let version = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(file).expect("the bundled model's file"),
    )
    .expect("json")["version"]
        .as_str()
        .expect("version")
        .to_string();
    let chosen = eval_route(dir.path(), &model, &url, &["--quality-model", file]);
    assert!(
        chosen.status.success(),
        "{}",
        String::from_utf8_lossy(&chosen.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&chosen.stdout).expect("json");
    assert!(
        report["quality_model"]
            .as_str()
            .is_some_and(|m| m.starts_with(&format!("{version} (trained for another edge model"))),
        "{report}"
    );
}

#[test]
fn an_endpoint_that_is_not_there_is_named() {
    let Some(model) = model() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path());
    let out = eval_route(dir.path(), &model, "http://127.0.0.1:9", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("http://127.0.0.1:9/v1/models"), "{stderr}");
}

#[test]
fn a_quality_model_that_does_not_parse_is_named_before_any_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path());
    let bad = dir.path().join("quality.json");
    std::fs::write(&bad, "{\"format\": \"straddle-quality/2\", \"weights\": [").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_straddle"))
        .args(["eval", "route", "--cloud-upper-bound", "--quality-model"])
        .arg(&bad)
        .arg("--data")
        .arg(dir.path())
        .arg("--edge")
        .arg(dir.path().join("no-such-model.gguf"))
        .output()
        .expect("runs straddle");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&*bad.to_string_lossy()), "{stderr}");
    assert!(stderr.contains("not valid JSON"), "{stderr}");
}
