//! Writes the tiny random-weight GGUFs of `tests/tiny::family` (one per family, with the
//! default model's vocabulary) for `tests/reference/make_families.py` to run llama.cpp on:
//! `cargo run -p straddle-engine --example write_tiny_families -- <default model> <dir>`.

#[path = "../tests/tiny/mod.rs"]
mod tiny;

use straddle_engine::gguf::{FileSource, Gguf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(model), Some(dir)) = (args.get(1), args.get(2)) else {
        return Err("usage: write_tiny_families <default model.gguf> <out dir>".into());
    };
    let vocab = Gguf::read(FileSource::open(model)?)?;
    std::fs::create_dir_all(dir)?;
    for (name, arch, pre) in tiny::FAMILIES {
        let path = std::path::Path::new(dir).join(format!("tiny-{name}.gguf"));
        std::fs::write(&path, tiny::family(arch, pre, &vocab))?;
        println!("{}", path.display());
    }
    Ok(())
}
