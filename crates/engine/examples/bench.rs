//! Engine throughput on one GGUF: prefill of an N-token prompt, then M decoded tokens.
//! `cargo run --profile fast -p straddle-engine --example bench -- <model.gguf> [prompt_tokens] [decode_tokens]`
//! Prints one JSON line, read by `cargo xtask bench engine`.

use std::time::Instant;

use straddle_engine::Engine;
use straddle_engine::gguf::FileSource;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: bench <model.gguf> [prompt_tokens] [decode_tokens]")?;
    let n_prompt: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(128);
    let n_decode: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(128);
    let t = Instant::now();
    let e = Engine::load(FileSource::open(path)?, 2048)?;
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    // The same token pattern the llama.cpp peer uses: ids 1000.. cycling, no special tokens.
    let prompt: Vec<u32> = (0..n_prompt as u32)
        .map(|i| 1000 + (i * 37) % 20000)
        .collect();
    let mut cache = e.new_cache(2048);
    let t = Instant::now();
    let mut logits = e
        .model
        .forward(&prompt, &mut cache, false)?
        .pop()
        .ok_or("no logits")?;
    let prefill_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..n_decode {
        let tok = straddle_engine::sample::argmax(&logits);
        logits = e
            .model
            .forward(&[tok], &mut cache, false)?
            .pop()
            .ok_or("no logits")?;
    }
    let decode_s = t.elapsed().as_secs_f64();
    println!(
        "{{\"engine\":\"straddle-cpu\",\"threads\":{},\"load_ms\":{load_ms:.0},\"prefill_tps\":{:.1},\"decode_tps\":{:.1},\"weights_mb\":{:.1},\"kv_mb\":{:.1}}}",
        rayon::current_num_threads(),
        n_prompt as f64 / prefill_s,
        n_decode as f64 / decode_s,
        e.model.weight_bytes() as f64 / 1e6,
        cache.bytes() as f64 / 1e6
    );
    Ok(())
}
