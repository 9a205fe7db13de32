//! `straddle-cloud`: serves a GGUF model over an OpenAI-compatible API.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use straddle_engine::DEFAULT_CONTEXT;
use straddle_engine::gguf::FileSource;

#[derive(Parser, Debug)]
#[command(version, about = "OpenAI-compatible cloud tier for Straddle")]
struct Args {
    /// GGUF model file (default: the model fetched by `cargo xtask setup`).
    #[arg(long, env = "STRADDLE_CLOUD_MODEL")]
    model: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "STRADDLE_CLOUD_LISTEN", default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// Requests that may wait for a decode slot before new ones get 503.
    #[arg(long, env = "STRADDLE_CLOUD_QUEUE", default_value_t = 64)]
    queue: usize,
    /// Sequences decoded together in one batched step.
    #[arg(long, env = "STRADDLE_CLOUD_MAX_BATCH", default_value_t = 32)]
    max_batch: usize,
    /// Prompt tokens prefilled per batched step, shared by the new requests: larger fills
    /// prompts faster, smaller keeps the running streams' pauses short.
    #[arg(long, env = "STRADDLE_CLOUD_PREFILL_CHUNK", default_value_t = 256)]
    prefill_chunk: usize,
    /// Seconds a `/v1/verify` session keeps its KV cache while idle (its tokens stay ten
    /// times longer, so a later call re-prefills instead of failing).
    #[arg(long, env = "STRADDLE_CLOUD_VERIFY_IDLE", default_value_t = 60)]
    verify_idle: u64,
    /// `/v1/verify` sessions that may hold a KV cache at once (the least recent give theirs up).
    #[arg(long, env = "STRADDLE_CLOUD_VERIFY_SESSIONS", default_value_t = 16)]
    verify_sessions: usize,
    /// Seconds the server keeps answering what it holds after Ctrl-C or SIGTERM before it
    /// exits anyway (a process manager's grace period; Kubernetes' default is 30).
    #[arg(long, env = "STRADDLE_CLOUD_DRAIN_SECONDS", default_value_t = 30)]
    drain_seconds: u64,
    /// Where the model runs: `auto` takes a GPU through wgpu (Vulkan, Metal, DX12) when one is
    /// present and the CPU kernels otherwise; `wgpu` insists, even on a software adapter.
    #[arg(long, env = "STRADDLE_CLOUD_BACKEND", value_enum, default_value_t = BackendChoice::Auto)]
    backend: BackendChoice,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum BackendChoice {
    Auto,
    Cpu,
    Wgpu,
}

/// The model on the backend it runs best on, served until Ctrl-C or SIGTERM.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let args = Args::parse();
    let model = args
        .model
        .clone()
        .unwrap_or_else(|| straddle_models::DEFAULT_CLOUD.path());
    let started = Instant::now();
    // Bound before the model loads, so a taken port fails at once, not after the weights.
    let listener = bind(args.listen).await?;
    let source = open_model(&model)?;
    let (backend, why) = choose_backend(args.backend).await;
    tracing::info!(backend = %backend, reason = %why, "backend chosen");
    let loader = Loader {
        path: &model,
        started,
        args: &args,
    };
    let state = match backend {
        Backend::Cpu => loader.on_cpu(source)?,
        Backend::Wgpu {
            ref adapter,
            software,
        } => loader.on_wgpu(source, adapter, software)?,
    };
    let app = straddle_cloud::router(Arc::new(state));
    let stopping = Arc::new(tokio::sync::Notify::new());
    let signalled = stopping.clone();
    let serving = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown_signal().await;
        signalled.notify_one();
    });
    tokio::select! {
        served = serving.into_future() => Ok(served?),
        () = drained_for(&stopping, Duration::from_secs(args.drain_seconds)) => {
            tracing::warn!(seconds = args.drain_seconds, "answers still open after the drain; exiting");
            // Leaving `main` would drop the runtime, which waits for blocking work: exit now.
            std::process::exit(0)
        }
    }
}

/// Resolves `drain` after `stopping` is notified: how long a shutdown may wait for the
/// answers still streaming (the default graceful shutdown waits for every one).
async fn drained_for(stopping: &tokio::sync::Notify, drain: Duration) {
    stopping.notified().await;
    tracing::info!(seconds = drain.as_secs(), "draining the open answers");
    tokio::time::sleep(drain).await;
}

/// Logs go where `RUST_LOG` says, so operators tune them without a rebuild.
fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
}

/// The listener on `addr`, with a hint at the usual cause when the port is taken.
async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr} (in use? pass --listen or STRADDLE_CLOUD_LISTEN)")
    })?;
    tracing::info!(addr = %addr, "listening");
    Ok(listener)
}

/// The GGUF file at `model`, with a hint at how to get one when it is missing.
fn open_model(model: &Path) -> anyhow::Result<FileSource> {
    FileSource::open(model).with_context(|| {
        format!(
            "opening model {} (run `cargo xtask setup`, or pass --model)",
            model.display()
        )
    })
}

/// What loading on either backend shares: the file's path for messages and the model id, the
/// start time for the load log, and the serving settings.
struct Loader<'a> {
    path: &'a Path,
    started: Instant,
    args: &'a Args,
}

impl Loader<'_> {
    /// The routes' state over the CPU kernels.
    fn on_cpu(&self, source: FileSource) -> anyhow::Result<straddle_cloud::AppState> {
        let engine = straddle_engine::Engine::load(source, DEFAULT_CONTEXT)
            .with_context(|| self.loading_message())?;
        tracing::info!(
            model = engine.name.as_deref().unwrap_or("unnamed"),
            weights_mb = engine.model.weight_bytes() / 1_000_000,
            load_ms = self.started.elapsed().as_millis() as u64,
            "engine ready on the CPU"
        );
        let card = straddle_cloud::ModelCard::new(
            engine.name.as_deref(),
            &self.fallback_id(),
            engine.model.config.arch.name(),
            engine.model.config.context_length,
            &engine.tokenizer.hash,
            "cpu",
        );
        Ok(self.state_over(engine, card))
    }

    /// The routes' state over the burn model on the wgpu `adapter`.
    fn on_wgpu(
        &self,
        source: FileSource,
        adapter: &str,
        software: bool,
    ) -> anyhow::Result<straddle_cloud::AppState> {
        let device = straddle_engine::Device::wgpu_options()
            .init()
            .map_err(|e| anyhow::anyhow!("starting wgpu: {e}"))?;
        let mut engine = straddle_engine::Engine::load_on(source, DEFAULT_CONTEXT, &device)
            .with_context(|| self.loading_message())?;
        if software {
            // Barriers are context switches on a CPU adapter (see the engine's kernels).
            engine
                .model
                .set_matvec_kernel(straddle_engine::MatvecKernel::PerRow);
        }
        tracing::info!(
            model = engine.name.as_deref().unwrap_or("unnamed"),
            adapter = %adapter,
            weights_mb = engine.model.weight_bytes() / 1_000_000,
            load_ms = self.started.elapsed().as_millis() as u64,
            "engine ready on the GPU"
        );
        let card = straddle_cloud::ModelCard::new(
            engine.name.as_deref(),
            &self.fallback_id(),
            engine.model.config.arch.name(),
            engine.model.config.context_length,
            &engine.tokenizer.hash,
            &format!("wgpu ({adapter})"),
        );
        Ok(self.state_over(engine, card))
    }

    /// The model's id when the GGUF names none, so `/v1/models` still lists something to ask for.
    fn fallback_id(&self) -> String {
        self.path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The context for a failed load: the path tells which of several files was bad.
    fn loading_message(&self) -> String {
        format!("loading model {}", self.path.display())
    }

    /// `engine` behind the routes; both backends end here so their settings cannot drift.
    fn state_over<M: straddle_cloud::backend::ServedModel>(
        &self,
        engine: straddle_engine::Engine<M>,
        card: straddle_cloud::ModelCard,
    ) -> straddle_cloud::AppState {
        serve(
            Arc::new(straddle_cloud::backend::Served::new(engine)),
            card,
            self.args,
        )
    }
}

/// Where the model runs, with the wgpu adapter's name and whether it is a software one.
#[derive(Debug)]
enum Backend {
    Cpu,
    Wgpu { adapter: String, software: bool },
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Cpu => f.write_str("cpu"),
            Backend::Wgpu { adapter, .. } => write!(f, "wgpu ({adapter})"),
        }
    }
}

/// The backend for `choice`, and why. A software adapter (lavapipe, llvmpipe, WARP) is not
/// taken on `auto`: the CPU kernels decode about 20 times faster than the device model on one
/// (BENCHMARKS.md, "Engine on burn devices").
async fn choose_backend(choice: BackendChoice) -> (Backend, String) {
    if choice == BackendChoice::Cpu {
        return (Backend::Cpu, "asked for".into());
    }
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        })
        .await;
    let info = match adapter {
        Ok(a) => a.get_info(),
        Err(e) if choice == BackendChoice::Wgpu => {
            // Asked for wgpu: let its own start say what is missing.
            return (
                Backend::Wgpu {
                    adapter: "unknown".into(),
                    software: false,
                },
                format!("asked for, though no adapter was found: {e}"),
            );
        }
        Err(e) => return (Backend::Cpu, format!("no GPU adapter: {e}")),
    };
    let software = info.device_type == wgpu::DeviceType::Cpu;
    let adapter = format!("{} via {:?}", info.name, info.backend);
    match choice {
        BackendChoice::Auto if software => (
            Backend::Cpu,
            format!("the only adapter, {adapter}, runs on the CPU: the CPU kernels are faster"),
        ),
        BackendChoice::Auto => (
            Backend::Wgpu { adapter, software },
            format!("{:?} found", info.device_type),
        ),
        _ => (Backend::Wgpu { adapter, software }, "asked for".into()),
    }
}

/// The routes' state over `served`: its decode loop and its verify sessions.
fn serve<M: straddle_cloud::backend::ServedModel>(
    served: Arc<straddle_cloud::backend::Served<M>>,
    model: straddle_cloud::ModelCard,
    args: &Args,
) -> straddle_cloud::AppState {
    let scheduler = straddle_cloud::scheduler::Scheduler::spawn(
        served.clone(),
        args.queue,
        args.max_batch,
        args.prefill_chunk,
    );
    let sessions = straddle_cloud::verify::Sessions::new(
        std::time::Duration::from_secs(args.verify_idle),
        args.verify_sessions,
    );
    straddle_cloud::AppState {
        model,
        scheduler: Some(scheduler),
        verifier: Some(Arc::new(straddle_cloud::verify::Verifier::new(
            served, sessions,
        ))),
    }
}

/// Resolves on Ctrl-C or SIGTERM (what `cargo xtask demo` and process managers send).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}
