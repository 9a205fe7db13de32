//! Engine throughput on one GGUF: prefill of an N-token prompt, then M decoded tokens.
//! `cargo run --profile fast -p straddle-engine --example bench -- <model.gguf> [prompt_tokens]
//! [decode_tokens] [cpu|flex|wgpu|wgpu-per-row|wgpu-burn]`
//! Prints one JSON line, read by `cargo xtask bench engine`. `cpu` is our own kernels
//! (`STRADDLE_CPU_KERNELS` picks a family other than the best: see `qmatrix::Kernels`);
//! `flex` and `wgpu` run the burn model (`DeviceModel`) on that burn device with our cubecl
//! kernels (`wgpu-per-row`: the product kernel for software adapters; `wgpu-burn`: burn's
//! operations only).

use std::time::Instant;

use straddle_engine::Kernels;
use straddle_engine::bandwidth;
use straddle_engine::gguf::{FileSource, Gguf};
use straddle_engine::{BlockingLm, Device, DeviceModel, Engine, MatvecKernel};

/// The context every row is measured at (the 2,048-token budget).
const CONTEXT: usize = 2048;

/// Buffer the host's read bandwidth is measured over: far past any cache.
const HOST_PROBE_BYTES: usize = 512 << 20;

/// Tensor a device's copy bandwidth is measured over: within wgpu's default 128 MiB limit on
/// one storage binding, and larger than the L2 of any GPU we know (an H200 has 60 MiB); a
/// launch per pass makes the figure a floor on a fast GPU (so the fraction a ceiling).
const DEVICE_PROBE_BYTES: usize = 96 << 20;

/// The JSON fields of a decode's bandwidth: what it read per second and what the memory
/// gave a plain streaming pass, in GB/s, and the fraction.
fn bandwidth_fields(decode_bytes_per_s: f64, bound_bytes_per_s: f64) -> String {
    format!(
        "\"decode_gbs\":{:.2},\"bound_gbs\":{:.2},\"bandwidth_fraction\":{:.3}",
        decode_bytes_per_s / 1e9,
        bound_bytes_per_s / 1e9,
        decode_bytes_per_s / bound_bytes_per_s
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or(
        "usage: bench <model.gguf> [prompt_tokens] [decode_tokens] [cpu|flex|wgpu|wgpu-per-row|wgpu-burn]",
    )?;
    let n_prompt: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(128);
    let n_decode: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(128);
    let backend = args.get(4).map_or("cpu", String::as_str);
    // The same token pattern the llama.cpp peer uses: ids 1000.. cycling, no special tokens.
    let prompt: Vec<u32> = (0..n_prompt as u32)
        .map(|i| 1000 + (i * 37) % 20000)
        .collect();
    match backend {
        "cpu" => bench_cpu(path, &prompt, n_decode),
        "flex" => bench_device(path, &prompt, n_decode, "burn-flex", Device::flex(), None),
        // Our kernels as a GPU gets them; with the product kernel a software adapter wants;
        // burn's operations alone.
        "wgpu" | "wgpu-per-row" | "wgpu-burn" => {
            let device = Device::wgpu_options().init()?;
            let kernels = match backend {
                "wgpu" => Some(MatvecKernel::Cooperative),
                "wgpu-per-row" => Some(MatvecKernel::PerRow),
                _ => None,
            };
            bench_device(
                path,
                &prompt,
                n_decode,
                &format!("burn-{backend}"),
                device,
                kernels,
            )
        }
        other => Err(format!(
            "unknown backend `{other}` (cpu, flex, wgpu, wgpu-per-row, wgpu-burn)"
        )
        .into()),
    }
}

fn bench_cpu(
    path: &str,
    prompt: &[u32],
    n_decode: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let t = Instant::now();
    let e = Engine::load(FileSource::open(path)?, CONTEXT)?;
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    // What the file's tensors take: the yardstick for what the loaded weights hold.
    let tensor_bytes: u64 = Gguf::read(FileSource::open(path)?)?
        .tensors
        .iter()
        .map(|t| t.size)
        .sum();
    // A warm-up pass first, as `llama-bench` runs one: the first pass also pays for the
    // pages of its buffers and the threads' scratch space, which a server pays once.
    e.model.forward(prompt, &mut e.new_cache(CONTEXT), false)?;
    let mut cache = e.new_cache(CONTEXT);
    let t = Instant::now();
    let mut logits = e
        .model
        .forward(prompt, &mut cache, false)?
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
    let bytes = bandwidth::decode_bytes(
        e.model.weight_bytes(),
        &e.model.config,
        prompt.len() + n_decode / 2,
    );
    let bound = bandwidth::host_read(HOST_PROBE_BYTES);
    println!(
        "{{\"engine\":\"straddle-cpu\",\"kernels\":\"{}\",\"threads\":{},\"load_ms\":{load_ms:.0},\"prefill_tps\":{:.1},\"decode_tps\":{:.1},\"weights_mb\":{:.1},\"tensor_mb\":{:.1},\"kv_mb\":{:.1},{}}}",
        Kernels::detected().name(),
        straddle_engine::parallel::threads(),
        prompt.len() as f64 / prefill_s,
        n_decode as f64 / decode_s,
        e.model.weight_bytes() as f64 / 1e6,
        tensor_bytes as f64 / 1e6,
        cache.bytes() as f64 / 1e6,
        bandwidth_fields(bytes * n_decode as f64 / decode_s, bound)
    );
    Ok(())
}

fn bench_device(
    path: &str,
    prompt: &[u32],
    n_decode: usize,
    name: &str,
    device: Device,
    kernels: Option<MatvecKernel>,
) -> Result<(), Box<dyn std::error::Error>> {
    let t = Instant::now();
    let g = Gguf::read(FileSource::open(path)?)?;
    let mut model = DeviceModel::load(&g, CONTEXT, &device)?;
    model.set_own_kernels(kernels.is_some());
    if let Some(kernel) = kernels {
        model.set_matvec_kernel(kernel);
    }
    device.sync()?;
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut peak = 0u64;
    let mut sample_peak = || {
        if let Some(u) = device.memory_pool_usage() {
            peak = peak.max(u.bytes_reserved);
        }
    };
    let mut cache = model.new_cache(CONTEXT);
    let t = Instant::now();
    let mut logits = model.forward_last_blocking(prompt, &mut cache)?;
    let prefill_s = t.elapsed().as_secs_f64();
    sample_peak();
    let t = Instant::now();
    for _ in 0..n_decode {
        let tok = straddle_engine::sample::argmax(&logits);
        logits = model.forward_last_blocking(&[tok], &mut cache)?;
        sample_peak();
    }
    let decode_s = t.elapsed().as_secs_f64();
    let bytes = bandwidth::decode_bytes(
        model.weight_bytes(),
        &model.config,
        prompt.len() + n_decode / 2,
    );
    let bound = bandwidth::device_copy(&device, DEVICE_PROBE_BYTES)?;
    println!(
        "{{\"engine\":\"{name}\",\"threads\":{},\"load_ms\":{load_ms:.0},\"prefill_tps\":{:.1},\"decode_tps\":{:.1},\"weights_mb\":{:.1},\"kv_mb\":{:.1},\"peak_device_mb\":{:.1},{}}}",
        straddle_engine::parallel::threads(),
        prompt.len() as f64 / prefill_s,
        n_decode as f64 / decode_s,
        model.weight_bytes() as f64 / 1e6,
        model.cache_bytes(cache.capacity()) as f64 / 1e6,
        peak as f64 / 1e6,
        bandwidth_fields(bytes * n_decode as f64 / decode_s, bound)
    );
    Ok(())
}
