//! What a model is before it has weights: the transformer families the engine runs, the
//! hyper-parameters read from a GGUF's metadata, and why a model could not be loaded or run.
//! The CPU model, the device model and the weights' layout all read it.

use crate::gguf::{ByteSource, Gguf, GgufError};
use crate::quant::QuantError;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("architecture `{0}` is not supported (supported: llama, qwen2, qwen3, phi3, gemma3)")]
    UnsupportedArch(String),
    #[error("tensor `{name}` has shape {got:?}, expected {want:?}")]
    Shape {
        name: String,
        got: Vec<u64>,
        want: Vec<u64>,
    },
    #[error("invalid config: {0}")]
    Config(String),
    #[error("context full: {needed} positions needed, cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("token id {0} is outside the vocabulary")]
    BadToken(u32),
    #[error("device error: {0}")]
    Device(String),
}

/// The transformer families the engine runs: each differs from Llama in a few named ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Arch {
    /// Llama, SmolLM, Mistral: SwiGLU, RoPE over adjacent pairs (GGUF permutes Q/K for it).
    Llama,
    /// Qwen 2 and 2.5: Llama with biases on the Q/K/V products and RoPE over head halves.
    Qwen2,
    /// Qwen 3: Llama with RMSNorm on each query and key head and RoPE over head halves.
    Qwen3,
    /// Phi 3: Llama with Q/K/V in one tensor, gate and up in another, and RoPE over head
    /// halves.
    Phi3,
    /// Gemma 3: GELU-gated MLP, RMSNorm on each query and key head and after each block, the
    /// embedding scaled by √d, RoPE over head halves, and five sliding-window layers (with
    /// their own RoPE base) to each global one.
    Gemma3,
}

impl Arch {
    /// Every architecture, for error messages.
    pub const ALL: [Arch; 5] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Phi3,
        Arch::Gemma3,
    ];

    /// The name `general.architecture` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Phi3 => "phi3",
            Arch::Gemma3 => "gemma3",
        }
    }

    fn from_name(name: &str) -> Result<Self, ModelError> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| ModelError::UnsupportedArch(name.into()))
    }

    /// Whether RoPE rotates element `i` with `i + head/2` (GPT-NeoX's layout), not `i + 1`.
    pub(crate) fn rope_halves(self) -> bool {
        self != Arch::Llama
    }

    /// Whether the MLP's gate is GELU (tanh approximation) rather than SiLU.
    pub(crate) fn gelu_gate(self) -> bool {
        self == Arch::Gemma3
    }

    /// Whether each query and key head is RMS-normalised before RoPE.
    pub(crate) fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Gemma3)
    }

    /// Whether each block's output is RMS-normalised before the residual.
    pub(crate) fn post_norms(self) -> bool {
        self == Arch::Gemma3
    }

    /// Whether the Q/K/V products carry biases.
    pub(crate) fn qkv_bias(self) -> bool {
        self == Arch::Qwen2
    }

    /// Whether Q/K/V (`attn_qkv`) and gate/up (`ffn_up`) are each one fused tensor.
    pub(crate) fn fused(self) -> bool {
        self == Arch::Phi3
    }
}

/// Hyper-parameters read from the GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub n_layers: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rope_theta: f32,
    /// RoPE base of the sliding-window layers.
    pub rope_theta_local: f32,
    /// Positions a sliding-window layer attends to; `None` when every layer is global.
    pub sliding_window: Option<usize>,
    pub rms_eps: f32,
    pub context_length: usize,
}

/// Gemma 3's layers repeat five sliding-window layers then a global one (llama.cpp's
/// "SWA pattern" of 6; the GGUF does not record it).
const GEMMA3_GLOBAL_EVERY: usize = 6;
/// Gemma 3's local RoPE base, which its GGUF does not record either.
const GEMMA3_LOCAL_ROPE_THETA: f32 = 10_000.0;

impl Config {
    /// Reads the config of a GGUF of one of the [`Arch`]s.
    pub fn from_gguf<S: ByteSource>(g: &Gguf<S>) -> Result<Self, ModelError> {
        let name = g.get_str("general.architecture")?;
        let arch = Arch::from_name(name)?;
        let key = |k: &str| format!("{name}.{k}");
        let u = |k: &str| -> Result<usize, ModelError> {
            usize::try_from(g.get_u64(&key(k))?).map_err(|_| ModelError::Config(k.into()))
        };
        let n_heads = u("attention.head_count")?;
        let dim = u("embedding_length")?;
        let n_kv_heads = u("attention.head_count_kv").unwrap_or(n_heads);
        let head_dim = match u("attention.key_length") {
            Ok(k) => k,
            Err(_) => dim.checked_div(n_heads).unwrap_or(0),
        };
        if u("rope.dimension_count").is_ok_and(|n| n != head_dim) {
            return Err(ModelError::Config(
                "RoPE over part of each head is not supported".into(),
            ));
        }
        if u("attention.value_length").is_ok_and(|v| v != head_dim) {
            return Err(ModelError::Config(
                "keys and values of different lengths are not supported".into(),
            ));
        }
        let vocab = g
            .tensor("token_embd.weight")
            .and_then(|t| t.shape.get(1))
            .copied()
            .ok_or_else(|| GgufError::MissingTensor("token_embd.weight".into()))?;
        let rope_theta = g.get_f64(&key("rope.freq_base")).unwrap_or(10_000.0) as f32;
        let gemma = arch == Arch::Gemma3;
        let cfg = Config {
            arch,
            n_layers: u("block_count")?,
            dim,
            ffn_dim: u("feed_forward_length")?,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab: vocab as usize,
            rope_theta,
            rope_theta_local: if gemma {
                GEMMA3_LOCAL_ROPE_THETA
            } else {
                rope_theta
            },
            sliding_window: if gemma {
                Some(u("attention.sliding_window")?)
            } else {
                None
            },
            rms_eps: g
                .get_f64(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5) as f32,
            context_length: u("context_length").unwrap_or(2048),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Refuses hyper-parameters no tensor layout could follow, before anything is allocated.
    fn validate(&self) -> Result<(), ModelError> {
        let bad = |why: &str| Err(ModelError::Config(why.into()));
        let (heads, kv_heads) = (self.n_heads, self.n_kv_heads);
        if self.n_layers == 0 || self.n_layers > 1024 {
            return bad("block_count must be 1..=1024");
        }
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 || heads > 1024 {
            return bad("the head count must be 1..=1024 and a multiple of the KV head count");
        }
        if self.head_dim == 0 || self.head_dim > 1024 || !self.head_dim.is_multiple_of(2) {
            return bad("the head size must be even and 2..=1024");
        }
        // These are the input widths of some product, whose blocks hold 32 values.
        let inputs = [self.dim, self.ffn_dim, self.q_dim()];
        if inputs
            .iter()
            .any(|w| *w == 0 || !w.is_multiple_of(32) || *w > 1 << 20)
        {
            return bad("the model, FFN and query widths must be multiples of 32, at most 2^20");
        }
        if self.sliding_window == Some(0) {
            return bad("a sliding window must hold at least one position");
        }
        Ok(())
    }

    /// Width of the query projection (all heads).
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the key/value projections.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// What the queries are multiplied by after RoPE, where the architecture scales them
    /// rather than the scores: Gemma 3 by 1/√head_dim (its `query_pre_attn_scalar`), before
    /// they are rounded to f16 as llama.cpp rounds them.
    pub fn query_scale(&self) -> Option<f32> {
        (self.arch == Arch::Gemma3).then(|| 1.0 / (self.head_dim as f32).sqrt())
    }

    /// What the attention scores are multiplied by before the softmax: 1/√head_dim, or 1
    /// where the queries carry the scale.
    pub fn score_scale(&self) -> f32 {
        match self.query_scale() {
            Some(_) => 1.0,
            None => 1.0 / (self.head_dim as f32).sqrt(),
        }
    }

    /// What each token's embedding is multiplied by, where the architecture scales it
    /// (Gemma: √d).
    pub fn embedding_scale(&self) -> Option<f32> {
        (self.arch == Arch::Gemma3).then(|| (self.dim as f32).sqrt())
    }

    /// The RoPE base of layer `layer`.
    pub fn rope_base(&self, layer: usize) -> f32 {
        match self.window(layer) {
            Some(_) => self.rope_theta_local,
            None => self.rope_theta,
        }
    }

    /// The window layer `layer` attends within, if it is a sliding-window layer.
    pub fn window(&self, layer: usize) -> Option<usize> {
        let global = (layer + 1).is_multiple_of(GEMMA3_GLOBAL_EVERY);
        self.sliding_window.filter(|_| !global)
    }
}
