//! `straddle-cloud`: serves a GGUF model over an OpenAI-compatible API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let model = args
        .model
        .unwrap_or_else(straddle_engine::default_model_path);
    let started = std::time::Instant::now();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (in use? pass --listen or STRADDLE_CLOUD_LISTEN)",
                args.listen
            )
        })?;
    tracing::info!(addr = %args.listen, "listening");
    let source = straddle_engine::gguf::FileSource::open(&model).with_context(|| {
        format!(
            "opening model {} (run `cargo xtask setup`, or pass --model)",
            model.display()
        )
    })?;
    let engine = straddle_engine::Engine::load(source, straddle_engine::generate::DEFAULT_CONTEXT)
        .with_context(|| format!("loading model {}", model.display()))?;
    tracing::info!(
        model = engine.name.as_deref().unwrap_or("unnamed"),
        weights_mb = engine.model.weight_bytes() / 1_000_000,
        load_ms = started.elapsed().as_millis() as u64,
        "engine ready (CPU)"
    );
    let fallback_id = model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let card = straddle_cloud::ModelCard::of(&engine, &fallback_id);
    let engine = Arc::new(engine);
    let scheduler = straddle_cloud::scheduler::Scheduler::spawn(
        engine.clone(),
        args.queue,
        args.max_batch,
        args.prefill_chunk,
    );
    let app = straddle_cloud::router(Arc::new(straddle_cloud::AppState {
        model: card,
        engine: Some(engine),
        scheduler: Some(scheduler),
        verify_sessions: Arc::new(straddle_cloud::verify::Sessions::new(
            std::time::Duration::from_secs(args.verify_idle),
            args.verify_sessions,
        )),
    }));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    Ok(())
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
