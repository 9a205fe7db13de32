//! Vectors of f32 lanes for the CPU attention's sums, one type per instruction set: AVX-512's
//! sixteen, AVX's eight, wasm SIMD's four, or one plain float. A kernel written once over [`Lanes`] keeps
//! its sums in registers on each, where leaving the loops to the auto-vectorizer gave vector
//! code or scalar code depending on what else shared its compilation unit.
//!
//! The sums are the ones llama.cpp's x86 build makes (tinyBLAS's f16 products): fused
//! multiply-adds on AVX and on plain floats, which therefore give the same bits. wasm SIMD has
//! no fused multiply-add, so its lanes round the product and the sum apart.

use crate::qmatrix::Kernels;

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

    /// The `WIDTH` floats from `p`.
    ///
    /// # Safety
    /// As [`Lanes::splat`], and `p` points at `WIDTH` readable floats.
    unsafe fn load_ptr(p: *const f32) -> Self;

    /// `self + f × x`, lane by lane, rounded once (rounded twice on wasm SIMD).
    ///
    /// # Safety
    /// As [`Lanes::splat`].
    unsafe fn add_product(self, f: Self, x: Self) -> Self;

    /// `self + x`, lane by lane.
    ///
    /// # Safety
    /// As [`Lanes::splat`].
    unsafe fn add(self, x: Self) -> Self;

    /// `self − x`, lane by lane.
    ///
    /// # Safety
    /// As [`Lanes::splat`].
    unsafe fn sub(self, x: Self) -> Self;

    /// `self ÷ x`, lane by lane.
    ///
    /// # Safety
    /// As [`Lanes::splat`].
    unsafe fn div(self, x: Self) -> Self;

    /// eˣ of each lane as ggml's vectorized `ggml_v_expf` computes it (on wasm SIMD, the
    /// standard library's).
    ///
    /// # Safety
    /// As [`Lanes::splat`].
    unsafe fn exp(self) -> Self;

    /// The larger of `self` and `x`, lane by lane (neither is NaN).
    ///
    /// # Safety
    /// As [`Lanes::splat`].
    unsafe fn max(self, x: Self) -> Self;

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

    unsafe fn load_ptr(p: *const f32) -> Self {
        // SAFETY: the caller's guarantee.
        unsafe { p.read() }
    }

    unsafe fn add_product(self, f: Self, x: Self) -> Self {
        f.mul_add(x, self)
    }

    unsafe fn add(self, x: Self) -> Self {
        self + x
    }

    unsafe fn sub(self, x: Self) -> Self {
        self - x
    }

    unsafe fn div(self, x: Self) -> Self {
        self / x
    }

    unsafe fn exp(self) -> Self {
        ggml_expf(self)
    }

    unsafe fn max(self, x: Self) -> Self {
        self.max(x)
    }

    unsafe fn store(self, out: &mut [f32]) {
        out[0] = self;
    }
}

/// `ggml_v_expf`'s constants, by their bits: x·log₂e's rounding shift (1.5·2²³), log₂e, ln 2
/// in a high and a low part, and the polynomial's coefficients, highest power first.
const EXP_ROUND: u32 = 0x4B40_0000;
const EXP_LOG2E: u32 = 0x3FB8_AA3B;
const EXP_LN2_HI: u32 = 0x3F31_7200;
const EXP_LN2_LO: u32 = 0x35BF_BE8E;
const EXP_POLY: [u32; 5] = [
    0x3C07_2010,
    0x3D2B_9F17,
    0x3E2A_AF33,
    0x3EFF_FEDB,
    0x3F7F_FFF6,
];

/// `ggml_v_expf` one lane at a time: eˣ = 2ⁿ·(1 + p(b)) with n = round(x·log₂e) and
/// b = x − n·ln 2 in two parts, the scale 2ⁿ split in two where it leaves f32's exponent range.
pub(crate) fn ggml_expf(x: f32) -> f32 {
    let c = f32::from_bits;
    let round = c(EXP_ROUND);
    let z = x.mul_add(c(EXP_LOG2E), round);
    let n = z - round;
    let b = (-n).mul_add(c(EXP_LN2_LO), (-n).mul_add(c(EXP_LN2_HI), x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let [p0, p1, p2, p3, p4] = EXP_POLY.map(c);
    let j = p0
        .mul_add(b, p1)
        .mul_add(u, p2.mul_add(b, p3))
        .mul_add(u, p4 * b);
    if n.abs() <= 126.0 || n.is_nan() {
        return j.mul_add(k, k);
    }
    let g = if n <= 0.0 { 0x8200_0000u32 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7F00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// A loop written once over [`Lanes`], which [`on_widest`] runs on the widest lanes the
/// chosen kernel family has.
pub(crate) trait LaneKernel {
    /// What the loop returns.
    type Output;

    /// The widest lanes the loop takes (the loops that keep ggml's eight-at-a-time order
    /// take eight).
    // Only x86 has lanes wider than eight to refuse.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const WIDEST: usize;

    /// The loop on lanes `V`.
    ///
    /// # Safety
    /// The machine runs `V`'s instruction set.
    unsafe fn run<V: Lanes>(self) -> Self::Output;
}

/// Runs `kernel` on the widest [`Lanes`] (up to its `WIDEST`) of the kernel family the
/// products use ([`Kernels::detected`]), so that a family chosen to compare them
/// (`STRADDLE_CPU_KERNELS`) is the whole of what runs.
#[inline(always)]
pub(crate) fn on_widest<K: LaneKernel>(kernel: K) -> K::Output {
    match Kernels::detected() {
        // SAFETY: the family runs here (`detected` picks only one that does), and AVX-512
        // VNNI's includes AVX-512 F, AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx512Vnni if K::WIDEST >= 16 => unsafe { on_avx512(kernel) },
        // SAFETY: as above; AVX2's includes FMA.
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx512Vnni | Kernels::Avx2 => unsafe { on_avx2(kernel) },
        // SAFETY: the module is built with wasm SIMD, which every engine it runs on has.
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Kernels::Simd128 => unsafe { kernel.run::<core::arch::wasm32::v128>() },
        // SAFETY: plain floats run anywhere.
        _ => unsafe { kernel.run::<f32>() },
    }
}

/// [`LaneKernel::run`] on AVX-512's sixteen lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn on_avx512<K: LaneKernel>(kernel: K) -> K::Output {
    // SAFETY: the caller's guarantee.
    unsafe { kernel.run::<std::arch::x86_64::__m512>() }
}

/// [`LaneKernel::run`] on AVX's eight lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn on_avx2<K: LaneKernel>(kernel: K) -> K::Output {
    // SAFETY: the caller's guarantee.
    unsafe { kernel.run::<std::arch::x86_64::__m256>() }
}

/// SiLU, x·σ(x) = x / (1 + e⁻ˣ), of every value in place, as ggml's `ggml_vec_swiglu_f32`
/// takes it on AVX2: eight at a time through `ggml_v_silu`, the rest through the C library's
/// `expf`. Every x86 family gives those bits.
pub(crate) fn silu_in_place(x: &mut [f32]) {
    on_widest(Silu(x));
}

/// [`silu_in_place`]'s loop.
struct Silu<'a>(&'a mut [f32]);

impl LaneKernel for Silu<'_> {
    type Output = ();
    const WIDEST: usize = 8;

    #[inline(always)]
    unsafe fn run<V: Lanes>(self) {
        // ggml's wasm build has no vector SiLU: there every value goes through `expf`, as
        // llama.cpp in a page (wllama) takes it.
        let eights = if cfg!(target_arch = "wasm32") {
            0
        } else {
            self.0.len() / 8 * 8
        };
        let (lanes, rest) = self.0.split_at_mut(eights);
        for part in lanes.chunks_exact_mut(V::WIDTH) {
            // SAFETY: the caller's guarantee; each part holds `WIDTH` floats.
            unsafe {
                let v = V::load(part);
                let e = V::splat(0.0).sub(v).exp();
                v.div(V::splat(1.0).add(e)).store(part);
            }
        }
        for v in rest {
            *v /= 1.0 + (-*v).exp();
        }
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
        unsafe fn load_ptr(p: *const f32) -> Self {
            // SAFETY: the caller's guarantee.
            unsafe { _mm256_loadu_ps(p) }
        }

        #[inline]
        #[target_feature(enable = "avx,fma")]
        unsafe fn add_product(self, f: Self, x: Self) -> Self {
            _mm256_fmadd_ps(f, x, self)
        }

        #[inline]
        #[target_feature(enable = "avx")]
        unsafe fn add(self, x: Self) -> Self {
            _mm256_add_ps(self, x)
        }

        #[inline]
        #[target_feature(enable = "avx")]
        unsafe fn sub(self, x: Self) -> Self {
            _mm256_sub_ps(self, x)
        }

        #[inline]
        #[target_feature(enable = "avx")]
        unsafe fn div(self, x: Self) -> Self {
            _mm256_div_ps(self, x)
        }

        /// `ggml_v_expf` itself, lane for lane what [`super::ggml_expf`] gives.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn exp(self) -> Self {
            use super::*;
            let c = |bits: u32| _mm256_castsi256_ps(_mm256_set1_epi32(bits as i32));
            let round = c(EXP_ROUND);
            let z = _mm256_fmadd_ps(self, c(EXP_LOG2E), round);
            let n = _mm256_sub_ps(z, round);
            let b = _mm256_fnmadd_ps(n, c(EXP_LN2_LO), _mm256_fnmadd_ps(n, c(EXP_LN2_HI), self));
            let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
            let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(c(0x3F80_0000))));
            let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
            let far = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
            let u = _mm256_mul_ps(b, b);
            let [p0, p1, p2, p3, p4] = EXP_POLY.map(c);
            let j = _mm256_fmadd_ps(
                _mm256_fmadd_ps(_mm256_fmadd_ps(p0, b, p1), u, _mm256_fmadd_ps(p2, b, p3)),
                u,
                _mm256_mul_ps(p4, b),
            );
            let near = _mm256_fmadd_ps(j, k, k);
            if _mm256_movemask_ps(far) == 0 {
                return near;
            }
            let g = _mm256_and_si256(
                _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
                _mm256_set1_epi32(0x8200_0000u32 as i32),
            );
            let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7F00_0000)));
            let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
            let beyond = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
            let scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
            let inside = _mm256_or_ps(_mm256_and_ps(far, scaled), _mm256_andnot_ps(far, near));
            _mm256_or_ps(
                _mm256_and_ps(beyond, _mm256_mul_ps(s1, s1)),
                _mm256_andnot_ps(beyond, inside),
            )
        }

        #[inline]
        #[target_feature(enable = "avx")]
        unsafe fn max(self, x: Self) -> Self {
            _mm256_max_ps(self, x)
        }

        #[inline]
        #[target_feature(enable = "avx")]
        unsafe fn store(self, out: &mut [f32]) {
            // SAFETY: the slice holds the eight floats written.
            unsafe { _mm256_storeu_ps(out[..8].as_mut_ptr(), self) }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Sixteen lanes: the attention's sums lane by lane as on AVX's eight (each lane sums its
    /// own terms in the same order), at twice the width.
    impl super::Lanes for __m512 {
        const WIDTH: usize = 16;

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn splat(x: f32) -> Self {
            _mm512_set1_ps(x)
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn load(x: &[f32]) -> Self {
            // SAFETY: the slice holds the sixteen floats read.
            unsafe { _mm512_loadu_ps(x[..16].as_ptr()) }
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn load_ptr(p: *const f32) -> Self {
            // SAFETY: the caller's guarantee.
            unsafe { _mm512_loadu_ps(p) }
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn add_product(self, f: Self, x: Self) -> Self {
            _mm512_fmadd_ps(f, x, self)
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn add(self, x: Self) -> Self {
            _mm512_add_ps(self, x)
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn sub(self, x: Self) -> Self {
            _mm512_sub_ps(self, x)
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn div(self, x: Self) -> Self {
            _mm512_div_ps(self, x)
        }

        /// Each half through AVX's `ggml_v_expf`.
        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn exp(self) -> Self {
            let mut lanes = [0f32; 16];
            // SAFETY: AVX-512 F, AVX2 and FMA run here; the array holds both halves.
            unsafe {
                self.store(&mut lanes);
                for half in lanes.chunks_exact_mut(8) {
                    __m256::load(half).exp().store(half);
                }
                Self::load(&lanes)
            }
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn max(self, x: Self) -> Self {
            _mm512_max_ps(self, x)
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn store(self, out: &mut [f32]) {
            // SAFETY: the slice holds the sixteen floats written.
            unsafe { _mm512_storeu_ps(out[..16].as_mut_ptr(), self) }
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
        unsafe fn load_ptr(p: *const f32) -> Self {
            // SAFETY: the caller's guarantee; wasm loads need no alignment.
            unsafe { v128_load(p.cast()) }
        }

        #[inline]
        unsafe fn add_product(self, f: Self, x: Self) -> Self {
            f32x4_add(self, f32x4_mul(f, x))
        }

        #[inline]
        unsafe fn add(self, x: Self) -> Self {
            f32x4_add(self, x)
        }

        #[inline]
        unsafe fn sub(self, x: Self) -> Self {
            f32x4_sub(self, x)
        }

        #[inline]
        unsafe fn div(self, x: Self) -> Self {
            f32x4_div(self, x)
        }

        /// `ggml_v_expf`'s steps with each fused multiply-add taken as a product and a sum
        /// (wasm has fused ones only in software): ln 2 in two parts keeps the reduction exact.
        #[inline]
        unsafe fn exp(self) -> Self {
            use super::*;
            let c = |bits: u32| f32x4_splat(f32::from_bits(bits));
            let mad = |a: v128, b: v128, c: v128| f32x4_add(f32x4_mul(a, b), c);
            let round = c(EXP_ROUND);
            let z = mad(self, c(EXP_LOG2E), round);
            let n = f32x4_sub(z, round);
            let b = f32x4_sub(
                f32x4_sub(self, f32x4_mul(n, c(EXP_LN2_HI))),
                f32x4_mul(n, c(EXP_LN2_LO)),
            );
            let e = i32x4_shl(z, 23);
            let k = i32x4_add(e, i32x4_splat(0x3F80_0000));
            let abs_n = f32x4_abs(n);
            let far = f32x4_gt(abs_n, f32x4_splat(126.0));
            let u = f32x4_mul(b, b);
            let [p0, p1, p2, p3, p4] = EXP_POLY.map(c);
            let j = mad(mad(mad(p0, b, p1), u, mad(p2, b, p3)), u, f32x4_mul(p4, b));
            let near = mad(j, k, k);
            if !v128_any_true(far) {
                return near;
            }
            let g = v128_and(f32x4_le(n, f32x4_splat(0.0)), u32x4_splat(0x8200_0000));
            let s1 = i32x4_add(g, i32x4_splat(0x7F00_0000));
            let s2 = i32x4_sub(e, g);
            let beyond = f32x4_gt(abs_n, f32x4_splat(192.0));
            let inside = v128_bitselect(f32x4_mul(mad(s2, j, s2), s1), near, far);
            v128_bitselect(f32x4_mul(s1, s1), inside, beyond)
        }

        #[inline]
        unsafe fn max(self, x: Self) -> Self {
            f32x4_pmax(self, x)
        }

        #[inline]
        unsafe fn store(self, out: &mut [f32]) {
            // SAFETY: the slice holds the four floats written.
            unsafe { v128_store(out[..4].as_mut_ptr().cast(), self) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AVX's `ggml_v_expf` and the one-lane port agree to the bit, on the fast path and on
    /// both ends of the exponent range (where the scale is split, and where it underflows).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exp_equals_the_one_lane_port() {
        if !(std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma"))
        {
            return;
        }
        let mut xs: Vec<f32> = (-2000..2000).map(|i| i as f32 * 0.0625 + 0.013).collect();
        xs.extend([
            0.0,
            -0.0,
            88.5,
            -87.0,
            -100.0,
            -104.0,
            -150.0,
            f32::NEG_INFINITY,
        ]);
        for chunk in xs.chunks_exact(8) {
            // SAFETY: the features were detected above.
            let got = unsafe { avx_exp(chunk) };
            for (g, &x) in got.iter().zip(chunk) {
                assert_eq!(g.to_bits(), ggml_expf(x).to_bits(), "e^{x}");
            }
        }
        let near = |x: f32| (ggml_expf(x) / x.exp() - 1.0).abs();
        assert!(
            xs[..4000]
                .iter()
                .all(|&x| near(x) < 1e-6 || x.exp() == 0.0 || x.exp().is_infinite())
        );
        assert_eq!(ggml_expf(f32::NEG_INFINITY), 0.0);
    }

    /// SiLU gives ggml's AVX2 bits on every x86 family (so `STRADDLE_CPU_KERNELS=portable`
    /// keeps llama.cpp's logits): the plain floats' loop equals AVX's value for value, a
    /// remainder past the last eight included, and both are x / (1 + e⁻ˣ).
    #[test]
    fn silu_on_plain_floats_equals_avx_and_the_definition() {
        let xs: Vec<f32> = (-300..303).map(|i| i as f32 * 0.37 + 0.011).collect();
        let mut plain = xs.clone();
        // SAFETY: plain floats run anywhere.
        unsafe { Silu(&mut plain).run::<f32>() };
        for (&x, &y) in xs.iter().zip(&plain) {
            let want = f64::from(x) / (1.0 + (-f64::from(x)).exp());
            let tolerance = 1e-5 * want.abs() + 1e-30;
            assert!(
                (f64::from(y) - want).abs() <= tolerance,
                "silu({x}) = {y}, not {want}"
            );
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            let mut avx = xs.clone();
            // SAFETY: the features were detected just now.
            unsafe { on_avx2(Silu(&mut avx)) };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&avx), bits(&plain));
        }
    }

    /// Eight lanes of `x` through AVX's `exp`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx_exp(x: &[f32]) -> [f32; 8] {
        let mut out = [0f32; 8];
        // SAFETY: the caller's guarantee; the slices hold eight floats.
        unsafe { std::arch::x86_64::__m256::load(x).exp().store(&mut out) };
        out
    }
}
