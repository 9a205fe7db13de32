//! Vectors of f32 lanes for the CPU attention's sums, one type per instruction set: AVX's
//! eight, wasm SIMD's four, or one plain float. A kernel written once over [`Lanes`] keeps
//! its sums in registers on each, where leaving the loops to the auto-vectorizer gave vector
//! code or scalar code depending on what else shared its compilation unit.
//!
//! Every operation is IEEE single precision with a multiply and an add kept apart (never
//! fused), so each type gives the same bits as one float at a time.

/// A vector of `WIDTH` f32 lanes.
pub(crate) trait Lanes: Copy {
    /// Lanes in one vector.
    const WIDTH: usize;

    /// `x` in every lane.
    ///
    /// # Safety
    /// The machine runs this type's instruction set.
    unsafe fn splat(x: f32) -> Self;

    /// The first `WIDTH` floats of `x` (which holds at least that many).
    ///
    /// # Safety
    /// As [`Lanes::splat`].
    unsafe fn load(x: &[f32]) -> Self;

    /// `self + f × x`, lane by lane, rounded after the multiply and after the add.
    ///
    /// # Safety
    /// As [`Lanes::splat`].
    unsafe fn add_product(self, f: Self, x: Self) -> Self;

    /// The lanes into the first `WIDTH` floats of `out`.
    ///
    /// # Safety
    /// As [`Lanes::splat`].
    unsafe fn store(self, out: &mut [f32]);
}

impl Lanes for f32 {
    const WIDTH: usize = 1;

    unsafe fn splat(x: f32) -> Self {
        x
    }

    unsafe fn load(x: &[f32]) -> Self {
        x[0]
    }

    unsafe fn add_product(self, f: Self, x: Self) -> Self {
        self + f * x
    }

    unsafe fn store(self, out: &mut [f32]) {
        out[0] = self;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    impl super::Lanes for __m256 {
        const WIDTH: usize = 8;

        #[inline]
        #[target_feature(enable = "avx")]
        unsafe fn splat(x: f32) -> Self {
            _mm256_set1_ps(x)
        }

        #[inline]
        #[target_feature(enable = "avx")]
        unsafe fn load(x: &[f32]) -> Self {
            // SAFETY: the slice holds the eight floats read.
            unsafe { _mm256_loadu_ps(x[..8].as_ptr()) }
        }

        #[inline]
        #[target_feature(enable = "avx")]
        unsafe fn add_product(self, f: Self, x: Self) -> Self {
            _mm256_add_ps(self, _mm256_mul_ps(f, x))
        }

        #[inline]
        #[target_feature(enable = "avx")]
        unsafe fn store(self, out: &mut [f32]) {
            // SAFETY: the slice holds the eight floats written.
            unsafe { _mm256_storeu_ps(out[..8].as_mut_ptr(), self) }
        }
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128 {
    use core::arch::wasm32::*;

    impl super::Lanes for v128 {
        const WIDTH: usize = 4;

        #[inline]
        unsafe fn splat(x: f32) -> Self {
            f32x4_splat(x)
        }

        #[inline]
        unsafe fn load(x: &[f32]) -> Self {
            // SAFETY: the slice holds the four floats read; wasm loads need no alignment.
            unsafe { v128_load(x[..4].as_ptr().cast()) }
        }

        #[inline]
        unsafe fn add_product(self, f: Self, x: Self) -> Self {
            f32x4_add(self, f32x4_mul(f, x))
        }

        #[inline]
        unsafe fn store(self, out: &mut [f32]) {
            // SAFETY: the slice holds the four floats written.
            unsafe { v128_store(out[..4].as_mut_ptr().cast(), self) }
        }
    }
}
