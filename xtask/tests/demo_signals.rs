//! `cargo xtask demo` stops its children however it is ended: Ctrl-C, SIGTERM from a process
//! manager, or SIGHUP from a closed terminal. The probe runs the demo's own supervisor over
//! one real child process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn alive(pid: &str) -> bool {
    Command::new("kill")
        .args(["-0", pid])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn stops_its_child_on(signal: &str) {
    let mut supervisor = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("supervise-probe")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the probe");
    let mut line = String::new();
    let stdout = supervisor.stdout.take().expect("stdout");
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the child's pid");
    let child = line.trim().to_string();
    assert!(alive(&child), "the child runs before the signal");
    let status = Command::new("kill")
        .args([signal, &supervisor.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while supervisor.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the supervisor ignored {signal}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The supervisor waits for its child before it exits.
    assert!(!alive(&child), "{signal} left the child {child} running");
}

#[test]
fn sigterm_stops_the_children() {
    stops_its_child_on("-TERM");
}

#[test]
fn sighup_stops_the_children() {
    stops_its_child_on("-HUP");
}

#[test]
fn ctrl_c_stops_the_children() {
    stops_its_child_on("-INT");
}
