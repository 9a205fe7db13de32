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

/// Where the demo's cloud tier is.
enum CloudTier {
    /// `straddle-cloud` on 127.0.0.1 serving Qwen2.5-Coder-1.5B-Instruct, a larger model of
    /// the edge model's family: a stand-in for cloud GPUs, and the page says so.
    StandIn,
    /// `--upstream URL [--upstream-key-env VAR] [--upstream-model NAME]`: any
    /// OpenAI-compatible provider or server behind the worker.
    External {
        url: String,
        key: Option<String>,
        model: Option<String>,
    },
}

impl CloudTier {
    fn from_args(args: &[String]) -> anyhow::Result<Self> {
        let value = |flag: &str| -> anyhow::Result<Option<String>> {
            match args.iter().position(|a| a == flag) {
                None => Ok(None),
                Some(i) => args
                    .get(i + 1)
                    .filter(|v| !v.starts_with("--"))
                    .map(|v| Some(v.clone()))
                    .with_context(|| format!("{flag} needs a value")),
            }
        };
        let Some(url) = value("--upstream")? else {
            for flag in ["--upstream-key-env", "--upstream-model"] {
                if value(flag)?.is_some() {
                    bail!("{flag} goes with --upstream URL");
                }
            }
            return Ok(Self::StandIn);
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("--upstream {url}: an http(s) URL of an OpenAI-compatible API, without /v1");
        }
        let key = match value("--upstream-key-env")? {
            Some(var) => Some(std::env::var(&var).with_context(|| {
                format!("--upstream-key-env {var}: the variable {var} is not set")
            })?),
            None => None,
        };
        let model = value("--upstream-model")?;
        Ok(Self::External { url, key, model })
    }

    /// The upstream's base URL.
    fn url(&self, ports: &Ports) -> String {
        match self {
            Self::StandIn => format!("http://127.0.0.1:{}", ports.cloud),
            Self::External { url, .. } => url.clone(),
        }
    }

    /// What the page shows for the cloud tier, so no one mistakes the stand-in for a
    /// provider's model.
    fn label(&self) -> String {
        match self {
            Self::StandIn => format!(
                "{} on straddle-cloud at 127.0.0.1: a local stand-in for cloud GPUs (`cargo xtask demo --upstream URL` puts a provider here)",
                straddle_models::DEFAULT_CLOUD.title
            ),
            Self::External { url, model, .. } => format!(
                "{} at {url}",
                model.as_deref().unwrap_or("the model the page asks for")
            ),
        }
    }
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let check = args.iter().any(|a| a == "--check");
    let tier = CloudTier::from_args(args)?;
    let ports = Ports {
        cloud: port_arg(args, "--port-cloud", "STRADDLE_PORT_CLOUD", 8090)?,
        worker: port_arg(args, "--port-worker", "STRADDLE_PORT_WORKER", 8787)?,
        web: port_arg(args, "--port-web", "STRADDLE_PORT_WEB", 8080)?,
    };
    if matches!(tier, CloudTier::StandIn) {
        ensure_free(ports.cloud, "--port-cloud")?;
    }
    ensure_free(ports.worker, "--port-worker")?;
    ensure_free(ports.web, "--port-web")?;
    let tools = setup::run()?;
    build(&tools)?;
    let logs = util::target_dir().join("demo-logs");
    std::fs::create_dir_all(&logs)?;
    let stop = stop_on_signals()?;
    let mut services = Vec::new();
    let result = start_and_supervise(&tools, &tier, &ports, &logs, check, &stop, &mut services);
    for svc in services.iter_mut().rev() {
        svc.stop();
    }
    // An external upstream's key outlives the run nowhere.
    let _ = std::fs::remove_file(logs.join(KEY_FILE));
    result
}

fn build(tools: &setup::Tools) -> anyhow::Result<()> {
    eprintln!("demo: building (first time: several minutes)");
    // The test profile (dependencies and the engine optimised), resolved for the whole
    // workspace: `-p straddle-cloud` alone would resolve other features and compile burn a
    // second time; this shares every artefact with `cargo xtask test`.
    util::run(
        util::cargo()
            .args(["build", "--quiet", "--workspace", "--bins"])
            .current_dir(util::root()),
    )?;
    crate::build::web_with_profile(tools, "dev")?;
    crate::build::worker(tools)
}

/// Starts the cloud stand-in (unless the tier is external), the worker and the page's
/// server, each once the one before answers, then prints where they are and supervises them.
fn start_and_supervise(
    tools: &setup::Tools,
    tier: &CloudTier,
    ports: &Ports,
    logs: &Path,
    check: bool,
    stop: &AtomicBool,
    services: &mut Vec<Service>,
) -> anyhow::Result<()> {
    let cloud_url = tier.url(ports);
    let worker_url = format!("http://127.0.0.1:{}", ports.worker);
    let web_url = format!("http://127.0.0.1:{}", ports.web);
    if matches!(tier, CloudTier::StandIn) {
        let cloud = Service::start(
            "cloud",
            Command::new(util::target_dir().join("debug/straddle-cloud"))
                .arg("--model")
                .arg(&tools.qwen_cloud)
                .arg("--listen")
                .arg(format!("127.0.0.1:{}", ports.cloud)),
            logs,
        )?;
        // A gigabyte of weights: give the load time on a slow disk.
        launch(services, cloud, &format!("{cloud_url}/health"), 300, stop)?;
    }
    // The demo tenant's secret lives only as long as this run; the tokens below are what a
    // tenant's backend would hand its page and its servers.
    let secret = demo_secret();
    let worker = start_worker(tools, tier, ports, &secret, &web_url, logs)?;
    launch(services, worker, &format!("{worker_url}/health"), 300, stop)?;
    // The page's token is bound to the page's origin, as a tenant's backend would mint it.
    let page_token = demo_token(&secret, Some(&web_url));
    let web = Service::start(
        "web",
        Command::new("node")
            .arg(root().join("web/scripts/serve.mjs"))
            .args(["--port", &ports.web.to_string(), "--root"])
            .arg(root().join("web"))
            .arg("--models")
            .arg(tools.qwen_edge.parent().unwrap_or(Path::new(".")))
            .args(["--catalog", &straddle_models::page_catalog()])
            .args(["--worker", &worker_url, "--token", &page_token])
            .args(["--cloud-label", &tier.label()])
            // Cross-origin isolation lets the CPU model use every core (wasm threads).
            .arg("--isolated"),
        logs,
    )?;
    launch(services, web, &format!("{web_url}/demo/"), 30, stop)?;
    println!("\nStraddle demo is running:");
    println!("  demo page     {web_url}/demo/");
    println!("  worker        {worker_url}   (wrangler dev --local)");
    println!(
        "  edge model    {} (the page's default)",
        straddle_models::DEFAULT_EDGE.title
    );
    println!("  cloud         {}", tier.label());
    println!("  logs          {}", logs.display());
    let token = demo_token(&secret, None);
    println!("  tenant token  {token}");
    println!("                (tenant `demo`, 1 hour; send as `Authorization: Bearer …`)");
    if check {
        return check_stack(tier, &cloud_url, &worker_url, &web_url, &token);
    }
    println!("Press Ctrl-C to stop.");
    std::io::stdout().flush()?;
    supervise(services, stop)
}

/// Keeps `svc` among the supervised `services` and waits until `url` answers.
fn launch(
    services: &mut Vec<Service>,
    svc: Service,
    url: &str,
    secs: u64,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    services.push(svc);
    match services.last_mut() {
        Some(svc) => wait_up(svc, url, Duration::from_secs(secs), stop),
        None => Ok(()),
    }
}

/// The worker under `wrangler dev --local`, in front of the tier's upstream. An external
/// upstream's key goes through an env file only this user can read, never the command line.
fn start_worker(
    tools: &setup::Tools,
    tier: &CloudTier,
    ports: &Ports,
    secret: &str,
    web_url: &str,
    logs: &Path,
) -> anyhow::Result<Service> {
    let mut cmd = Command::new(root().join("worker/node_modules/.bin/wrangler"));
    cmd.args(["dev", "--local", "--ip", "127.0.0.1", "--port"])
        .arg(ports.worker.to_string())
        .args(["--var", &format!("TENANT_SECRET_DEMO:{secret}")])
        .args(["--var", &format!("ALLOWED_ORIGINS:{web_url}")])
        .arg("--show-interactive-dev-session=false")
        .env("WASM_BINDGEN_BIN", &tools.wasm_bindgen)
        .env("ESBUILD_BIN", &tools.esbuild)
        .env("WRANGLER_SEND_METRICS", "false")
        .current_dir(root().join("worker"));
    match tier {
        CloudTier::StandIn => {
            cmd.args(["--var", &format!("UPSTREAM_URL:{}", tier.url(ports))]);
        }
        CloudTier::External { url, key, model } => {
            let upstreams = external_upstreams(url, key.is_some(), model.as_deref());
            cmd.args(["--var", &format!("UPSTREAMS:{upstreams}")]);
            if let Some(key) = key {
                cmd.arg("--env-file").arg(key_file(logs, key)?);
            }
        }
    }
    Service::start("worker", &mut cmd, logs)
}

/// The env file that hands an external upstream's key to wrangler, in the logs folder.
const KEY_FILE: &str = "upstream.env";

/// The name of the secret binding that holds an external upstream's key.
const UPSTREAM_KEY_BINDING: &str = "DEMO_UPSTREAM_API_KEY";

/// The worker's `UPSTREAMS` for one external upstream: the page's `default` model renamed to
/// the provider's, its key read from a secret binding.
fn external_upstreams(url: &str, has_key: bool, model: Option<&str>) -> String {
    let mut upstream = serde_json::json!({ "name": "upstream", "url": url.trim_end_matches('/') });
    if let Some(model) = model {
        // The page asks for `default`; a client that names the provider's model gets it too.
        let names = [("default", model), (model, model)];
        upstream["models"] = names
            .into_iter()
            .map(|(asked, sent)| (asked.to_owned(), serde_json::Value::from(sent)))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    if has_key {
        upstream["api_key_secret"] = UPSTREAM_KEY_BINDING.into();
    }
    serde_json::json!([upstream]).to_string()
}

/// Writes the key to an env file readable by this user alone; returns its path.
fn key_file(logs: &Path, key: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = logs.join(KEY_FILE);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)?;
    writeln!(file, "{UPSTREAM_KEY_BINDING}={key}")?;
    Ok(path)
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
fn check_stack(
    tier: &CloudTier,
    cloud: &str,
    worker: &str,
    web: &str,
    token: &str,
) -> anyhow::Result<()> {
    println!("\ncomponents:");
    // An external provider has no `/health` of ours; the prompt below reaches it.
    let cloud_health =
        matches!(tier, CloudTier::StandIn).then(|| ("cloud", format!("{cloud}/health")));
    let ours = [
        ("worker", format!("{worker}/health")),
        ("page", format!("{web}/demo/")),
    ];
    for (name, url) in cloud_health.into_iter().chain(ours) {
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
            println!("route:  cloud (worker → {cloud}; the demo page routes in the browser)");
            println!("model:  {}", v["model"].as_str().unwrap_or("<none>"));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_stand_in_serves_unless_an_upstream_is_named() -> anyhow::Result<()> {
        assert!(matches!(
            CloudTier::from_args(&args(&["--check"]))?,
            CloudTier::StandIn
        ));
        let tier = CloudTier::from_args(&args(&[
            "--upstream",
            "https://api.example.com",
            "--upstream-model",
            "big-1",
        ]))?;
        let CloudTier::External { url, key, model } = &tier else {
            bail!("expected an external tier");
        };
        assert_eq!(url, "https://api.example.com");
        assert_eq!((key.as_deref(), model.as_deref()), (None, Some("big-1")));
        assert_eq!(tier.label(), "big-1 at https://api.example.com");
        assert!(
            CloudTier::StandIn
                .label()
                .starts_with("Qwen2.5-Coder-1.5B-Instruct")
        );
        Ok(())
    }

    #[test]
    fn upstream_flags_are_checked_before_anything_starts() {
        let refused = |list: &[&str]| CloudTier::from_args(&args(list)).is_err();
        assert!(refused(&["--upstream"]), "no URL");
        assert!(refused(&["--upstream", "api.example.com"]), "not http(s)");
        assert!(
            refused(&["--upstream-model", "m"]),
            "model without upstream"
        );
        assert!(refused(&[
            "--upstream",
            "http://x",
            "--upstream-key-env",
            "STRADDLE_SURELY_UNSET_VAR"
        ]));
    }

    #[test]
    fn an_external_upstream_renames_the_pages_model_and_names_its_key_binding() {
        let json: serde_json::Value = serde_json::from_str(&external_upstreams(
            "https://p.example/",
            true,
            Some("m-7b"),
        ))
        .unwrap_or_default();
        assert_eq!(json[0]["url"], "https://p.example");
        assert_eq!(json[0]["models"]["default"], "m-7b");
        assert_eq!(json[0]["models"]["m-7b"], "m-7b");
        assert_eq!(json[0]["api_key_secret"], UPSTREAM_KEY_BINDING);
        let bare: serde_json::Value =
            serde_json::from_str(&external_upstreams("http://x", false, None)).unwrap_or_default();
        assert!(bare[0].get("models").is_none() && bare[0].get("api_key_secret").is_none());
    }
}
