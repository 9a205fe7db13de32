//! The `straddle` binary as a user runs it.

use std::process::Command;

use straddle_engine::gguf::{GgufWriter, Value};
use straddle_engine::quant::TensorType;

#[test]
fn gguf_prints_metadata_and_tensors_and_rejects_garbage() {
    let dir = std::env::temp_dir().join(format!("straddle-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let good = dir.join("tiny.gguf");
    let bytes = GgufWriter::new()
        .kv("general.architecture", Value::String("llama".into()))
        .tensor("w", &[32], TensorType::F32, vec![0u8; 128])
        .to_bytes();
    std::fs::write(&good, bytes).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_straddle"))
        .args(["gguf", "--tensors"])
        .arg(&good)
        .output()
        .expect("run");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("general.architecture = String(\"llama\")"),
        "{text}"
    );
    assert!(text.contains("F32 [32] 128 bytes"), "{text}");

    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\0\0\0\xff\xff").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_straddle"))
        .arg("gguf")
        .arg(&bad)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("truncated"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn pii_lists_entity_classes() {
    let out = Command::new(env!("CARGO_BIN_EXE_straddle"))
        .args(["pii", "write to jo@example.org"])
        .output()
        .expect("run");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Email\t"));
}
