//! The K-quant driver both lane families share (`avx2_k_quants`, `avx512_k_quants`): a
//! task's rows in whole tiles of a register's lanes go through the family's [`LanePanel`],
//! unpacked once for every token it takes; a decoded token's Q4_K rows, read in place by
//! eights; the rest, one row at a time through the AVX2 kernel.

use super::super_blocks::q6k_tiled;
use super::{QActs, QMatrix, avx2, avx2_k_quants};

/// A kernel family's rows side by side in a register's lanes.
pub(super) trait LanePanel: Sized {
    /// Rows side by side.
    const LANES: usize;
    /// Tokens a tile computes at once.
    const TOKENS: usize;
    /// Fewest tokens whose products pay for unpacking the rows.
    const MIN_TOKENS: usize;

    /// Runs `f` with this thread's panel, reused from task to task.
    fn with<R>(f: impl FnOnce(&mut Self) -> R) -> R;

    /// Rows `first..first + LANES` of `w`.
    ///
    /// # Safety
    /// The machine runs the family's instruction set, and the rows lie inside `w`.
    unsafe fn unpack(&mut self, w: &QMatrix, first: usize);

    /// The panel's rows against `xs` (at most [`Self::TOKENS`]): `put(j, lane, value)` for
    /// token `xs[j]` and the row in `lane`.
    ///
    /// # Safety
    /// As [`Self::unpack`]; the panel holds `w`'s rows, and every token holds its columns
    /// in Q8_K.
    unsafe fn tile(&self, w: &QMatrix, xs: &[&QActs], put: &mut dyn FnMut(usize, usize, f32));
}

/// Rows `first..first + count` against every token of `xs` into `out[k * xs.len() + t]`.
///
/// # Safety
/// The machine runs `P`'s instruction set, and the rows lie inside `w`.
pub(super) unsafe fn rows<P: LanePanel>(
    w: &QMatrix,
    first: usize,
    count: usize,
    xs: &[QActs],
    out: &mut [f32],
) {
    let n = xs.len();
    if n < P::MIN_TOKENS {
        // A decoded token: Q4_K's woven rows read in place, every other row alone, with
        // nothing to allocate per task.
        let woven = match w {
            QMatrix::Q4K { .. } => avx2_k_quants::woven_rows(w, first, count, xs, out),
            _ => 0..0,
        };
        return each_row(w, first, xs, out, |k, _| !woven.contains(&k));
    }
    let tiled: Vec<usize> = (0..n).filter(|&t| takes_tiles(w, &xs[t])).collect();
    let whole = match tiled.len() >= P::MIN_TOKENS {
        true => count / P::LANES * P::LANES,
        false => 0,
    };
    // Each tile's tokens, gathered once for every tile of rows.
    let blocks: Vec<(&[usize], Vec<&QActs>)> = tiled
        .chunks(P::TOKENS)
        .map(|block| (block, block.iter().map(|&t| &xs[t]).collect()))
        .collect();
    P::with(|panel| {
        for k in (0..whole).step_by(P::LANES) {
            // SAFETY: the caller's guarantees; the tile's rows lie below `count`.
            unsafe { panel.unpack(w, first + k) };
            for (block, tokens) in &blocks {
                let mut put = |j: usize, lane: usize, v: f32| out[(k + lane) * n + block[j]] = v;
                // SAFETY: the panel was just filled with `w`'s rows.
                unsafe { panel.tile(w, tokens, &mut put) };
            }
        }
    });
    let mut in_tiles = vec![false; n];
    tiled.iter().for_each(|&t| in_tiles[t] = true);
    each_row(w, first, xs, out, |k, t| k >= whole || !in_tiles[t]);
}

/// Row `first + k` · token `t` through the AVX2 one-row kernel, for each pair `wanted`.
fn each_row(
    w: &QMatrix,
    first: usize,
    xs: &[QActs],
    out: &mut [f32],
    wanted: impl Fn(usize, usize) -> bool,
) {
    let n = xs.len();
    for (k, values) in out.chunks_mut(n).enumerate() {
        for (t, slot) in values.iter_mut().enumerate().filter(|&(t, _)| wanted(k, t)) {
            *slot = (avx2::TABLE.q4k.dot)(w, first + k, &xs[t]);
        }
    }
}

/// Whether a tile computes `x`'s products with `w`: every Q4_K token (its order is the
/// token's own either way), and Q6_K's from its tiled kernel's batch; else the one-row
/// kernel, whose Q6_K order is `ggml_vec_dot_q6_K_q8_K`'s.
fn takes_tiles(w: &QMatrix, x: &QActs) -> bool {
    match w {
        QMatrix::Q4K { .. } => true,
        QMatrix::Q6K { .. } => q6k_tiled(x.place),
        _ => false,
    }
}
