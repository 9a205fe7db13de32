//! `straddle`: the command-line face of the engine and the router.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use straddle_engine::gguf::{FileSource, Gguf, Value};

#[derive(Parser)]
#[command(version, about = "Straddle: hybrid edge-cloud LLM inference")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a GGUF file's metadata and tensor directory.
    Gguf {
        path: PathBuf,
        /// Also list every tensor.
        #[arg(long)]
        tensors: bool,
    },
    /// Scan text for personal data and print the entity classes found.
    Pii { text: String },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Gguf { path, tensors } => gguf(&path, tensors),
        Command::Pii { text } => {
            for span in straddle_router::pii::detect(&text) {
                println!(
                    "{:?}\t{}..{}\t{:.2}",
                    span.kind, span.start, span.end, span.confidence
                );
            }
            Ok(())
        }
    }
}

fn gguf(path: &std::path::Path, tensors: bool) -> anyhow::Result<()> {
    let source = FileSource::open(path).with_context(|| format!("opening {}", path.display()))?;
    let g = Gguf::read(source).with_context(|| format!("reading {}", path.display()))?;
    println!(
        "GGUF v{}: {} metadata keys, {} tensors",
        g.version,
        g.metadata.len(),
        g.tensors.len()
    );
    for (k, v) in &g.metadata {
        println!("  {k} = {}", short(v));
    }
    if tensors {
        for t in &g.tensors {
            println!("  {:<40} {:?} {:?} {} bytes", t.name, t.ty, t.shape, t.size);
        }
    }
    Ok(())
}

fn short(v: &Value) -> String {
    match v {
        Value::Array(items) => format!("[{} items]", items.len()),
        Value::String(s) if s.len() > 80 => {
            format!("{:?}…", s.chars().take(80).collect::<String>())
        }
        other => format!("{other:?}"),
    }
}
