//! Memory bandwidth as measured on this machine: the bound a decoded token is compared to.
//! Decoding one token reads every weight once (and the cached keys and values), so its speed
//! is a fraction of what the memory delivers; `cargo xtask bench engine` reports it.

use std::sync::atomic::{AtomicU64, Ordering};

use web_time::Instant;

use crate::config::Config;

/// Passes each measurement takes the best of.
const PASSES: usize = 5;

/// Bytes one decoded token reads at `positions` earlier positions: every weight once, and
/// each layer's cached keys and values (f32).
pub fn decode_bytes(weight_bytes: usize, config: &Config, positions: usize) -> f64 {
    let kv = config.n_layers * 2 * config.kv_dim() * positions * std::mem::size_of::<f32>();
    (weight_bytes + kv) as f64
}

/// The host's read bandwidth in bytes per second: a `bytes`-long buffer summed by the
/// threads of [`crate::parallel`], best of a few passes.
pub fn host_read(bytes: usize) -> f64 {
    let words = vec![1u64; (bytes / 8).max(1)];
    // Many more tasks than threads, so a slow thread does not hold the pass.
    let chunks: Vec<&[u64]> = words.chunks(words.len().div_ceil(64)).collect();
    let mut best = f64::INFINITY;
    for _ in 0..PASSES {
        let total = AtomicU64::new(0);
        let t = Instant::now();
        crate::parallel::for_each(chunks.clone(), |chunk| {
            let sum = chunk.iter().fold(0u64, |a, &w| a.wrapping_add(w));
            total.fetch_add(sum, Ordering::Relaxed);
        });
        best = best.min(t.elapsed().as_secs_f64());
        // The sums are used, so the reads cannot be optimised away.
        assert_eq!(total.into_inner(), words.len() as u64);
    }
    (words.len() * 8) as f64 / best
}

/// A burn device's copy bandwidth in bytes per second, reads and writes counted: `x + 1`
/// over a `bytes`-long tensor, best of a few passes.
#[cfg(feature = "device")]
pub fn device_copy(
    device: &burn::tensor::Device,
    bytes: usize,
) -> Result<f64, crate::config::ModelError> {
    use burn::tensor::Tensor;
    let sync = || {
        device
            .sync()
            .map_err(|e| crate::config::ModelError::Device(format!("{e:?}")))
    };
    let n = (bytes / 4).max(1);
    let x = Tensor::<1>::ones([n], device);
    sync()?;
    let mut best = f64::INFINITY;
    for _ in 0..PASSES {
        let t = Instant::now();
        let y = x.clone().add_scalar(1.0);
        sync()?;
        best = best.min(t.elapsed().as_secs_f64());
        drop(y);
    }
    Ok(2.0 * (n * 4) as f64 / best)
}
