//! What the CLI's integration tests share: the test model and the real cloud server,
//! started as a process on 127.0.0.1.
#![allow(dead_code)] // each test file uses its own part

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// SmolLM2-135M, the smallest real model.
pub fn model() -> Option<PathBuf> {
    straddle_testkit::model(straddle_testkit::SMOLLM2)
}

/// The cloud server binary: `STRADDLE_CLOUD_BIN`, else beside this test's binary directory
/// (a workspace build puts it there).
pub fn cloud_bin() -> Option<PathBuf> {
    let path = std::env::var_os("STRADDLE_CLOUD_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.join("straddle-cloud"))
        })?;
    if path.is_file() {
        return Some(path);
    }
    straddle_testkit::missing(&format!("no straddle-cloud binary at {}", path.display()))
}

/// The cloud server, stopped when dropped.
pub struct Cloud {
    child: Child,
    pub port: u16,
}

impl Drop for Cloud {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Starts `bin` serving `model` and waits until its `/health` answers.
pub fn start_cloud(bin: &PathBuf, model: &PathBuf) -> Cloud {
    let port = free_port();
    let child = Command::new(bin)
        .arg("--model")
        .arg(model)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn cloud");
    let cloud = Cloud { child, port };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            // Listening comes before the model is loaded; /health answers after.
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                let _ =
                    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                let mut text = String::new();
                let _ = s.read_to_string(&mut text);
                if text.starts_with("HTTP/1.1 200") {
                    return cloud;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the cloud server did not come up");
}
