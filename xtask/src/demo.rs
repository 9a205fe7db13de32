//! `cargo xtask demo`: builds, fetches the model, starts the cloud server, the worker
//! (`wrangler dev --local`) and the demo page's static server, and supervises them.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::setup;
use crate::util::{self, root};

struct Ports {
    cloud: u16,
    worker: u16,
    web: u16,
}

fn port_arg(args: &[String], flag: &str, env: &str, default: u16) -> anyhow::Result<u16> {
    if let Some(i) = args.iter().position(|a| a == flag) {
        let v = args
            .get(i + 1)
            .with_context(|| format!("{flag} needs a port number"))?;
        return v
            .parse()
            .with_context(|| format!("{flag} {v}: not a port number"));
    }
    match std::env::var(env) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{env}={v}: not a port number")),
        Err(_) => Ok(default),
    }
}

/// A supervised child process whose output goes to a log file.
struct Service {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Service {
    fn start(name: &'static str, cmd: &mut Command, logs: &Path) -> anyhow::Result<Self> {
        let log = logs.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let child = cmd
            .stdout(file.try_clone()?)
            .stderr(file)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {name}: `{}`", util::describe(cmd)))?;
        Ok(Self { name, child, log })
    }

    fn tail(&self, n: usize) -> String {
        let lines: Vec<String> = std::fs::File::open(&self.log)
            .map(|f| BufReader::new(f).lines().map_while(Result::ok).collect())
            .unwrap_or_default();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn stop(&mut self) {
        // SIGTERM first so servers finish in-flight work; then make sure.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ensure_free(port: u16, flag: &str) -> anyhow::Result<()> {
    TcpListener::bind(("127.0.0.1", port))
        .map(drop)
        .with_context(|| format!("port {port} is in use; choose another with {flag} <port>"))
}

fn get(url: &str) -> Result<(u16, String), String> {
    let agent = util::http(Duration::from_secs(5));
    let mut resp = agent.get(url).call().map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    Ok((status, resp.body_mut().read_to_string().unwrap_or_default()))
}

fn post_json(url: &str, body: &str, token: &str) -> Result<(u16, String), String> {
    let agent = util::http(Duration::from_secs(120));
    let mut resp = agent
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", &format!("Bearer {token}"))
        .send(body)
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    Ok((status, resp.body_mut().read_to_string().unwrap_or_default()))
}

fn wait_up(
    svc: &mut Service,
    url: &str,
    timeout: Duration,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if stop.load(Ordering::SeqCst) {
            bail!("stopped while {} was starting", svc.name);
        }
        if let Ok(Some(status)) = svc.child.try_wait() {
            bail!(
                "{} exited ({status}) while starting; last log lines:\n{}",
                svc.name,
                svc.tail(20)
            );
        }
        if matches!(get(url), Ok((200, _))) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!(
        "{} did not answer {url} within {timeout:?}; last log lines:\n{}",
        svc.name,
        svc.tail(20)
    )
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let check = args.iter().any(|a| a == "--check");
    let ports = Ports {
        cloud: port_arg(args, "--port-cloud", "STRADDLE_PORT_CLOUD", 8090)?,
        worker: port_arg(args, "--port-worker", "STRADDLE_PORT_WORKER", 8787)?,
        web: port_arg(args, "--port-web", "STRADDLE_PORT_WEB", 8080)?,
    };
    ensure_free(ports.cloud, "--port-cloud")?;
    ensure_free(ports.worker, "--port-worker")?;
    ensure_free(ports.web, "--port-web")?;

    let tools = setup::run()?;
    eprintln!("demo: building (first time: several minutes)");
    // The test profile (dependencies and the engine optimised), resolved for the whole
    // workspace: `-p straddle-cloud` alone would resolve other features and compile burn a
    // second time; this shares every artefact with `cargo xtask test`.
    util::run(
        util::cargo()
            .args(["build", "--quiet", "--workspace", "--bins"])
            .current_dir(util::root()),
    )?;
    crate::build::web_with_profile(&tools, "dev")?;
    crate::build::worker(&tools)?;

    let logs = util::target_dir().join("demo-logs");
    std::fs::create_dir_all(&logs)?;
    let stop = stop_on_signals()?;

    // The demo tenant's secret lives only as long as this run; the token below is what a
    // tenant's backend would hand its page.
    let secret = demo_secret();
    let mut services = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        let cloud_url = format!("http://127.0.0.1:{}", ports.cloud);
        let worker_url = format!("http://127.0.0.1:{}", ports.worker);
        let web_url = format!("http://127.0.0.1:{}", ports.web);
        services.push(Service::start(
            "cloud",
            Command::new(util::target_dir().join("debug/straddle-cloud"))
                .arg("--model")
                .arg(&tools.model)
                .arg("--listen")
                .arg(format!("127.0.0.1:{}", ports.cloud)),
            &logs,
        )?);
        let up = |svc: Option<&mut Service>, url: String, secs| match svc {
            Some(svc) => wait_up(svc, &url, Duration::from_secs(secs), &stop),
            None => Ok(()),
        };
        up(services.last_mut(), format!("{cloud_url}/health"), 60)?;
        services.push(Service::start(
            "worker",
            Command::new(root().join("worker/node_modules/.bin/wrangler"))
                .args([
                    "dev",
                    "--local",
                    "--ip",
                    "127.0.0.1",
                    "--port",
                    &ports.worker.to_string(),
                ])
                .args(["--var", &format!("UPSTREAM_URL:{cloud_url}")])
                .args(["--var", &format!("TENANT_SECRET_DEMO:{secret}")])
                .args(["--var", &format!("ALLOWED_ORIGINS:{web_url}")])
                .arg("--show-interactive-dev-session=false")
                .env("WASM_BINDGEN_BIN", &tools.wasm_bindgen)
                .env("ESBUILD_BIN", &tools.esbuild)
                .env("WRANGLER_SEND_METRICS", "false")
                .current_dir(root().join("worker")),
            &logs,
        )?);
        up(services.last_mut(), format!("{worker_url}/health"), 300)?;
        // The page's token is bound to the page's origin, as a tenant's backend would mint it.
        let page_token = demo_token(&secret, Some(&web_url));
        services.push(Service::start(
            "web",
            Command::new("node")
                .arg(root().join("web/scripts/serve.mjs"))
                .args(["--port", &ports.web.to_string(), "--root"])
                .arg(root().join("web"))
                .arg("--models")
                .arg(tools.model.parent().unwrap_or(Path::new(".")))
                .args(["--worker", &worker_url, "--token", &page_token])
                // Cross-origin isolation lets the CPU model use every core (wasm threads).
                .arg("--isolated"),
            &logs,
        )?);
        up(services.last_mut(), format!("{web_url}/demo/"), 30)?;

        println!("\nStraddle demo is running:");
        println!("  demo page     {web_url}/demo/");
        println!("  worker        {worker_url}   (wrangler dev --local)");
        println!("  cloud server  {cloud_url}");
        println!("  logs          {}", logs.display());
        let token = demo_token(&secret, None);
        println!("  tenant token  {token}");
        println!("                (tenant `demo`, 1 hour; send as `Authorization: Bearer …`)");
        if check {
            return check_stack(&cloud_url, &worker_url, &web_url, &token);
        }
        println!("Press Ctrl-C to stop.");
        std::io::stdout().flush()?;
        supervise(&mut services, &stop)
    })();
    for svc in services.iter_mut().rev() {
        svc.stop();
    }
    result
}

/// A flag raised by Ctrl-C, SIGTERM (a process manager) or SIGHUP (a closed terminal)
/// alike, so the children are stopped whichever way the demo is ended.
fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let raise = stop.clone();
    ctrlc::set_handler(move || raise.store(true, Ordering::SeqCst))
        .context("installing the signal handler")?;
    Ok(stop)
}

/// Waits until `stop` is raised (`Ok`) or a service exits on its own (an error with its
/// last log lines).
fn supervise(services: &mut [Service], stop: &AtomicBool) -> anyhow::Result<()> {
    while !stop.load(Ordering::SeqCst) {
        for svc in services.iter_mut() {
            if let Ok(Some(status)) = svc.child.try_wait() {
                bail!(
                    "{} exited ({status}); last log lines:\n{}",
                    svc.name,
                    svc.tail(20)
                );
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("\ndemo: stopping");
    Ok(())
}

/// `cargo xtask supervise-probe`: the demo's supervisor over one child (`sleep`), whose pid
/// it prints, so a test can signal the supervisor and check that the child is gone.
pub fn probe() -> anyhow::Result<()> {
    let stop = stop_on_signals()?;
    let logs = std::env::temp_dir();
    let mut services = vec![Service::start(
        "probe",
        Command::new("sleep").arg("600"),
        &logs,
    )?];
    println!("{}", services[0].child.id());
    std::io::stdout().flush()?;
    let result = supervise(&mut services, &stop);
    for svc in services.iter_mut().rev() {
        svc.stop();
    }
    result
}

/// A per-run secret for the demo tenant.
fn demo_secret() -> String {
    use sha2::{Digest, Sha256};
    let seed = format!(
        "{:?}-{}-{:?}",
        std::time::SystemTime::now(),
        std::process::id(),
        std::collections::hash_map::RandomState::new()
    );
    hex::encode(Sha256::digest(seed.as_bytes()))
}

/// A one-hour token for the demo tenant: a page's, bound to `origin`, or without one a
/// server's (the headless check).
fn demo_token(secret: &str, origin: Option<&str>) -> String {
    use straddle_protocol::token::{AUDIENCE, Claims, TokenKind, mint};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let claims = Claims {
        ten: "demo".into(),
        sub: "demo-user".into(),
        sid: format!("demo-{now}"),
        aud: AUDIENCE.into(),
        exp: now + 3600,
        nbf: now,
        iat: now,
        kind: if origin.is_some() {
            TokenKind::Browser
        } else {
            TokenKind::Server
        },
        origin: origin.map(str::to_owned),
        feat: Some("demo".into()),
    };
    mint(&claims, secret.as_bytes())
}

/// Headless check: each component's health, then one prompt through the worker.
fn check_stack(cloud: &str, worker: &str, web: &str, token: &str) -> anyhow::Result<()> {
    println!("\ncomponents:");
    for (name, url) in [
        ("cloud", format!("{cloud}/health")),
        ("worker", format!("{worker}/health")),
        ("page", format!("{web}/demo/")),
    ] {
        match get(&url) {
            Ok((200, _)) => println!("  {name:<8} up"),
            Ok((s, _)) => println!("  {name:<8} answered {s}"),
            Err(e) => println!("  {name:<8} down ({e})"),
        }
    }
    let body = r#"{"model":"default","messages":[{"role":"user","content":"List three primary colors."}],"max_tokens":32}"#;
    println!("\nprompt: List three primary colors.");
    match post_json(&format!("{worker}/v1/chat/completions"), body, token) {
        Ok((200, text)) => {
            let v: serde_json::Value =
                serde_json::from_str(&text).context("the worker's answer is not JSON")?;
            println!(
                "answer: {}",
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or("<none>")
            );
            // This check posts to the worker itself; the page routes in the browser first.
            println!("route:  cloud (worker → cloud server; the demo page routes in the browser)");
        }
        Ok((status, text)) => {
            let msg = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or(text);
            println!("answer: not built yet — the worker answered {status}: {msg}");
        }
        Err(e) => println!("answer: worker unreachable ({e})"),
    }
    Ok(())
}
