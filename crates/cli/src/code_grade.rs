//! Grading a generated program by running it with its tests, the way HumanEval's harness
//! does: in a subprocess of its own, in a temporary directory, with a time limit, a memory
//! limit and the process's means of doing harm (network, other processes, deleting files)
//! switched off before the answer runs.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// How long one program and its tests may run.
pub const TIME_LIMIT: Duration = Duration::from_secs(10);

/// Run before the answer: HumanEval's `reliability_guard`, cut to what a short test program
/// can reach, plus a memory limit. It is a guard against accidents, not a sandbox.
const GUARD: &str = r#"
import builtins, faulthandler, os, resource, shutil, socket, subprocess
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
faulthandler.disable()
for name in ["kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid",
             "fork", "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink",
             "fchmod", "fchown", "chmod", "chown", "chroot", "lchown", "chdir"]:
    setattr(os, name, None)
shutil.rmtree = shutil.move = shutil.chown = None
subprocess.Popen = None
socket.socket = socket.create_connection = None
builtins.exit = builtins.quit = None
del builtins, faulthandler, os, resource, shutil, socket, subprocess
"#;

/// The program an answer makes: its code block (or its whole text when it has none), then
/// the task's setup (MBPP's builds the tests' inputs, often from the answer's own classes)
/// and its tests.
pub fn program(answer: &str, setup: &str, tests: &[String]) -> String {
    format!(
        "{GUARD}\n{}\n\n{setup}\n\n{}\n",
        code_of(answer),
        tests.join("\n")
    )
}

/// The code in a chat answer: its first fenced block (```python or ```), else the text.
pub fn code_of(answer: &str) -> &str {
    let Some(start) = answer.find("```") else {
        return answer;
    };
    let after = &answer[start + 3..];
    // The fence's language tag runs to the end of its line.
    let body = after.find('\n').map_or("", |nl| &after[nl + 1..]);
    let body = without_tag_line(body);
    match body.find("```") {
        Some(end) => &body[..end],
        None => body,
    }
}

/// `body` without a first line that is only a language's name: some models open a block with
/// a bare fence and put the tag on the next line, which a reader skips and Python would not.
fn without_tag_line(body: &str) -> &str {
    let (first, rest) = body.split_once('\n').unwrap_or((body, ""));
    match first.trim() {
        "python" | "python3" | "py" | "Python" => rest,
        _ => body,
    }
}

/// Whether `text` holds a whole fenced block: what [`code_of`] reads is complete.
pub fn closes_block(text: &str) -> bool {
    text.find("```").is_some_and(|start| {
        let after = &text[start + 3..];
        after
            .find('\n')
            .is_some_and(|nl| after[nl + 1..].contains("```"))
    })
}

/// Whether `answer` passes `tests` (after `setup`) within [`TIME_LIMIT`], run by `python`.
pub fn passes(python: &Path, answer: &str, setup: &str, tests: &[String]) -> anyhow::Result<bool> {
    let dir = tempfile::tempdir().context("creating a directory for the program")?;
    let file = dir.path().join("answer.py");
    std::fs::write(&file, program(answer, setup, tests))?;
    let mut child = Command::new(python)
        .args(["-I", "-B"])
        .arg(&file)
        .current_dir(dir.path())
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", python.display()))?;
    let deadline = Instant::now() + TIME_LIMIT;
    loop {
        if let Some(status) = child.try_wait()? {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            tracing::debug!(passed = status.success(), %err, "graded a program");
            return Ok(status.success());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The Python that runs answers: `$STRADDLE_PYTHON`, else `python3` on the path.
pub fn python() -> anyhow::Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("STRADDLE_PYTHON") {
        return Ok(p.into());
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
        .context("grading code needs python3 on the PATH (or STRADDLE_PYTHON)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(answer: &str, tests: &[&str]) -> bool {
        let Ok(python) = python() else {
            return straddle_testkit::missing::<()>("python3 for the code grader").is_some();
        };
        let tests: Vec<String> = tests.iter().map(|t| t.to_string()).collect();
        passes(&python, answer, "", &tests).expect("runs")
    }

    #[test]
    fn a_right_program_passes_and_a_wrong_one_fails() {
        let answer = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.";
        assert!(run(answer, &["assert add(2, 3) == 5"]));
        assert!(!run(answer, &["assert add(2, 3) == 6"]));
        assert!(!run("I cannot write that.", &["assert add(2, 3) == 5"]));
    }

    #[test]
    fn a_program_that_hangs_or_reaches_out_fails_in_time() {
        // Without the limit this test would never end.
        assert!(!run("def f():\n    while True: pass\nf()", &[]));
        let net = "import socket\ns = socket.socket()\n";
        assert!(!run(net, &[]), "the guard switched the network off");
        let kill = "import os\nos.system('true')\n";
        assert!(!run(kill, &[]), "the guard switched processes off");
    }

    #[test]
    fn the_code_block_is_taken_from_a_chat_answer() {
        assert_eq!(code_of("x = 1"), "x = 1");
        assert_eq!(code_of("a\n```python\nx = 1\n```\nb"), "x = 1\n");
        assert_eq!(code_of("```\ny = 2\n"), "y = 2\n");
        // A bare fence with the tag on its own line, as Qwen2.5-Coder-0.5B writes under a
        // prompt whose code sits in a bare fence.
        assert_eq!(code_of("```\npython\nx = 1\n```"), "x = 1\n");
        assert_eq!(code_of("```\npythonic = 1\n```"), "pythonic = 1\n");
    }

    #[test]
    fn a_block_is_closed_only_by_a_second_fence_after_its_opening_line() {
        assert!(!closes_block("Here:\n```python"));
        assert!(!closes_block("Here:\n```python\nx = 1\n"));
        assert!(closes_block("Here:\n```python\nx = 1\n```"));
        assert!(!closes_block("```"));
    }
}
