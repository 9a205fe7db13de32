//! `straddle chat --speculative` against the real cloud server with the real model: the
//! output is the cloud's greedy output token for token, and a verifier that dies mid-answer
//! leaves the edge to finish without repeating or dropping a token.

mod common;

use common::{Cloud, cloud_bin, model, start_cloud};

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

fn chat(args: &[&str], prompt: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_straddle"))
        .arg("chat")
        .args(args)
        .arg(prompt)
        .output()
        .expect("run straddle chat")
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "straddle chat failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// "N verify calls" from a speculative run's summary.
fn verify_calls(o: &Output) -> usize {
    let err = String::from_utf8_lossy(&o.stderr);
    err.split(" verify calls")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no verify count in {err}"))
}

const PROMPTS: [&str; 8] = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of France?",
    "Return a JSON object with the fields name and age for a fictional person.",
    "Write a haiku about autumn leaves.",
    "List three primary colors.",
    "Explain in two sentences why the sky is blue.",
    "Write a polite email asking a colleague to review a document.",
    "Give a YAML config with a server host and port.",
];

#[test]
fn speculative_output_equals_the_clouds_greedy_output_on_eight_prompts() {
    let (Some(model), Some(bin)) = (model(), cloud_bin()) else {
        return;
    };
    let cloud = start_cloud(&bin, &model);
    let url = format!("http://127.0.0.1:{}", cloud.port);
    // A lower-precision copy drafts, so drafts are often, not always, right.
    let drafter = std::env::temp_dir().join(format!("straddle-q4_0-{}.gguf", std::process::id()));
    let made = Command::new(env!("CARGO_BIN_EXE_straddle"))
        .arg("requant")
        .arg(&model)
        .arg(&drafter)
        .args(["--to", "q4-0"])
        .output()
        .expect("requant");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let drafter_arg = drafter.to_string_lossy().into_owned();
    let (mut calls, mut rejected_somewhere) = (0, false);
    for prompt in PROMPTS {
        let plain = stdout(&chat(
            &["--mode", "cloud", "--cloud", &url, "--max-tokens", "32"],
            prompt,
        ));
        let spec_out = chat(
            &[
                "--speculative",
                "--cloud",
                &url,
                "--model",
                &drafter_arg,
                "--max-tokens",
                "32",
            ],
            prompt,
        );
        assert_eq!(stdout(&spec_out), plain, "prompt {prompt:?}");
        calls += verify_calls(&spec_out);
        let err = String::from_utf8_lossy(&spec_out.stderr);
        rejected_somewhere |= err
            .split(" drafted tokens accepted")
            .next()
            .and_then(|s| {
                let mut w = s.rsplit(' ');
                let drafted: usize = w.next()?.parse().ok()?;
                let _of = w.next();
                let accepted: usize = w.next()?.parse().ok()?;
                Some(accepted < drafted)
            })
            .unwrap_or(false);
    }
    let _ = std::fs::remove_file(&drafter);
    assert!(
        rejected_somewhere,
        "the Q4_0 drafter never disagreed: the test proves nothing"
    );
    assert!(
        calls < 8 * 32,
        "{calls} verify calls for 256 tokens: no batching"
    );
}

/// Test double: a proxy to the cloud that forwards `answers` HTTP responses, then cuts every
/// connection and refuses new ones (a verifier that dies mid-answer).
fn dying_proxy(upstream: u16, answers: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(AtomicUsize::new(0));
    let dead = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { break };
            if dead.load(Ordering::SeqCst) {
                let _ = client.shutdown(Shutdown::Both);
                continue;
            }
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                break;
            };
            let (mut c_in, mut s_out) = (
                client.try_clone().expect("clone"),
                server.try_clone().expect("clone"),
            );
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_in, &mut s_out);
            });
            let (seen, dead) = (seen.clone(), dead.clone());
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n) = s_in.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let chunk = &buf[..n];
                    let mut cut = None;
                    for (i, w) in chunk.windows(9).enumerate() {
                        if w == b"HTTP/1.1 " && seen.fetch_add(1, Ordering::SeqCst) >= answers {
                            cut = Some(i);
                            break;
                        }
                    }
                    let end = cut.unwrap_or(n);
                    if c_out.write_all(&chunk[..end]).is_err() || cut.is_some() {
                        dead.store(true, Ordering::SeqCst);
                        let _ = c_out.shutdown(Shutdown::Both);
                        let _ = s_in.shutdown(Shutdown::Both);
                        break;
                    }
                }
            });
        }
    });
    port
}

/// `straddle chat --speculative` for 40 tokens with the cloud's own file as the drafter and
/// drafts of exactly two tokens (so each call settles three and counts are predictable).
fn speculate_in_twos(
    cloud_url: &str,
    model: &std::path::Path,
    extra: &[&str],
    prompt: &str,
) -> Output {
    let model_arg = model.to_string_lossy().into_owned();
    let mut args = vec![
        "--speculative",
        "--cloud",
        cloud_url,
        "--model",
        &model_arg,
        "--max-tokens",
        "40",
        "--draft",
        "2",
        "--max-draft",
        "2",
    ];
    args.extend_from_slice(extra);
    chat(&args, prompt)
}

const LIGHTHOUSE: &str = "Write a short story about a lighthouse keeper.";

/// The cloud server with the real model, the model's path and the cloud's plain greedy answer
/// to [`LIGHTHOUSE`] for 40 tokens.
fn lighthouse() -> Option<(Cloud, PathBuf, String)> {
    let (model, bin) = (model()?, cloud_bin()?);
    let cloud = start_cloud(&bin, &model);
    let url = format!("http://127.0.0.1:{}", cloud.port);
    let plain = stdout(&chat(
        &["--mode", "cloud", "--cloud", &url, "--max-tokens", "40"],
        LIGHTHOUSE,
    ));
    Some((cloud, model, plain))
}

#[test]
fn a_verifier_that_dies_mid_answer_leaves_the_edge_to_finish_without_losing_a_token() {
    let Some((cloud, model, plain)) = lighthouse() else {
        return;
    };
    // Two verify answers get through, then the verifier is gone. The edge model is the cloud's
    // own file, so any repeated or dropped token would show in the text.
    let proxy = dying_proxy(cloud.port, 2);
    let out = speculate_in_twos(
        &format!("http://127.0.0.1:{proxy}"),
        &model,
        &[],
        LIGHTHOUSE,
    );
    assert_eq!(stdout(&out), plain);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("2 verify calls"), "{err}");
    assert!(err.contains("from the edge alone"), "{err}");
}

/// Speculation hands the rest of the answer to plain cloud streaming when drafts keep being
/// rejected (here: a threshold no running acceptance reaches, so after the fourth call); the
/// cloud continues the same turn, and if it fails then, the edge does.
#[test]
fn a_hand_off_to_plain_streaming_continues_the_same_answer_and_survives_a_dead_cloud() {
    let Some((cloud, model, plain)) = lighthouse() else {
        return;
    };
    let url = format!("http://127.0.0.1:{}", cloud.port);
    let speculate = |cloud_url: &str| {
        speculate_in_twos(cloud_url, &model, &["--hand-off-below", "1"], LIGHTHOUSE)
    };
    let out = speculate(&url);
    // The cloud continues the same turn from the text shown, which is plain's (none of it lost
    // or repeated). Past it the cloud reads the answer so far as a prompt, whose sums
    // llama.cpp's order takes unlike a decoded token's, so the continuation equals plain
    // decoding's only up to float noise: a near-tie may go the other way.
    let (text, shown) = (
        stdout(&out),
        "As the last light of the day was extinguished, a lone",
    );
    assert!(plain.starts_with(shown), "{plain}");
    assert!(text.starts_with(shown), "{text}");
    assert_eq!(text.matches(shown).count(), 1, "{text}");
    assert!(text.len() > shown.len() + 40, "the cloud continued: {text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("4 verify calls"), "{err}");
    assert!(
        err.contains("handed to plain cloud streaming after 12 tokens"),
        "{err}"
    );
    // Four verify answers get through; the hand-off's stream does not: the edge finishes.
    // It continues from the same text the cloud did, the same way: the same answer.
    let proxy = dying_proxy(cloud.port, 4);
    let out = speculate(&format!("http://127.0.0.1:{proxy}"));
    assert_eq!(stdout(&out), text);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the hand-off to the cloud failed"), "{err}");
}
