//! The tokenizer, built from the vocabulary, merges and token types a GGUF embeds.
//!
//! Two kinds, both run by the `tokenizers` crate's BPE: GPT-2's byte-level BPE, whose
//! pre-tokenizer GGUF names (`tokenizer.ggml.pre`, each name mapped to the splitting rules
//! llama.cpp applies for it), and SentencePiece's, whose merges follow from piece scores.

use sha2::{Digest, Sha256};
use tokenizers::SplitDelimiterBehavior;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, Tokenizer as HfTokenizer,
};

use crate::gguf::{ByteSource, Gguf, GgufError, Value};

/// GGUF token type of ordinary vocabulary pieces.
const TOKEN_TYPE_NORMAL: i64 = 1;
/// GGUF token type of control tokens (`<|im_start|>`): matched whole, never split.
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF token type of user-defined tokens: matched whole too.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Why a tokenizer could not be built or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("tokenizer model `{0}` is not supported (supported: gpt2 BPE, llama SentencePiece)")]
    UnsupportedModel(String),
    #[error("pre-tokenizer `{0}` is not supported")]
    UnsupportedPre(String),
    #[error("malformed merge `{0}`")]
    BadMerge(String),
    #[error("tokenizer: {0}")]
    Backend(String),
}

/// A tokenizer plus the ids the engine needs to know.
pub struct Tokenizer {
    inner: HfTokenizer,
    pub bos: Option<u32>,
    pub eos: u32,
    /// Token ids that end generation (eos and any `<|im_end|>`-like end-of-turn ids).
    pub stop_ids: Vec<u32>,
    pub add_bos: bool,
    /// SHA-256 over the vocabulary and merges: equal hashes mean interchangeable token ids.
    pub hash: String,
    vocab_size: usize,
    /// How a piece spells its bytes.
    spelling: Spelling,
    /// Control tokens (`<|im_start|>`, `<eos>`): they stand for no text.
    control: ahash::AHashSet<u32>,
}

/// How the vocabulary writes a piece's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// GPT-2's byte-level BPE: every byte is one printable character.
    ByteLevel,
    /// SentencePiece: `▁` for a space, `<0xXX>` for a byte outside the vocabulary.
    SentencePiece,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.vocab_size)
            .field("eos", &self.eos)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes.
    pub fn from_gguf<S: ByteSource>(g: &Gguf<S>) -> Result<Self, TokenizerError> {
        let tokens = g.get_str_array("tokenizer.ggml.tokens")?;
        let types: Vec<i64> = g
            .get("tokenizer.ggml.token_type")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| v.as_i64().unwrap_or(1)).collect())
            .unwrap_or_default();
        let ((mut inner, hash), spelling) = match g.get_str("tokenizer.ggml.model")? {
            "gpt2" => (byte_level_bpe(g, &tokens)?, Spelling::ByteLevel),
            "llama" => (
                sentencepiece_bpe(g, &tokens, &types)?,
                Spelling::SentencePiece,
            ),
            other => return Err(TokenizerError::UnsupportedModel(other.into())),
        };
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(types.iter().chain(std::iter::repeat(&1)))
            .filter(|(_, ty)| **ty == TOKEN_TYPE_CONTROL || **ty == TOKEN_TYPE_USER_DEFINED)
            .map(|(t, _)| AddedToken::from(t.to_string(), true))
            .collect();
        inner.add_special_tokens(&specials);
        let control = types
            .iter()
            .enumerate()
            .filter(|&(_, &ty)| ty == TOKEN_TYPE_CONTROL)
            .map(|(id, _)| id as u32)
            .collect();

        let id = |key: &str| {
            g.get(key)
                .and_then(Value::as_u64)
                .and_then(|v| u32::try_from(v).ok())
        };
        let eos = id("tokenizer.ggml.eos_token_id").ok_or_else(|| GgufError::Metadata {
            key: "tokenizer.ggml.eos_token_id".into(),
            why: "missing".into(),
        })?;
        let bos = id("tokenizer.ggml.bos_token_id");
        let add_bos = g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut stop_ids = vec![eos];
        for name in ["<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>"] {
            if let Some(i) = tokens.iter().position(|t| *t == name)
                && !stop_ids.contains(&(i as u32))
            {
                stop_ids.push(i as u32);
            }
        }
        if let Some(i) = id("tokenizer.ggml.eot_token_id")
            && !stop_ids.contains(&i)
        {
            stop_ids.push(i);
        }
        Ok(Self {
            inner,
            bos,
            eos,
            stop_ids,
            add_bos,
            hash,
            vocab_size: tokens.len(),
            spelling,
            control,
        })
    }

    /// Token ids of `text`; special-token text (`<|im_start|>`) becomes its single id.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Backend(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Text of `ids`, special tokens included (so a caller sees what the model wrote).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Backend(e.to_string()))
    }

    /// The raw vocabulary piece of one id.
    pub fn piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a vocabulary piece, special tokens included.
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.inner.token_to_id(piece)
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The bytes each token adds to the text (part of a character, for some), by id; `None`
    /// for control tokens, which stand for no text.
    pub fn token_bytes(&self) -> Vec<Option<Vec<u8>>> {
        // User-defined pieces (Gemma's "\n", runs of spaces) are matched whole and spelt
        // as the text itself, not in the vocabulary's alphabet.
        let whole = self.inner.get_added_tokens_decoder();
        let alphabet = byte_level_alphabet();
        (0..self.vocab_size as u32)
            .map(|id| {
                if self.control.contains(&id) {
                    return None;
                }
                if let Some(added) = whole.get(&id) {
                    return Some(added.content.clone().into_bytes());
                }
                let piece = self.inner.id_to_token(id)?;
                Some(match self.spelling {
                    Spelling::ByteLevel => piece
                        .chars()
                        .filter_map(|c| alphabet.get(&c).copied())
                        .collect(),
                    Spelling::SentencePiece => match sentencepiece_byte(&piece) {
                        Some(b) => vec![b],
                        None => piece.replace('▁', " ").into_bytes(),
                    },
                })
            })
            .collect()
    }
}

/// GPT-2's byte-level alphabet, character to byte: printable Latin-1 stands for itself, the
/// other bytes for U+0100 onwards, in order.
fn byte_level_alphabet() -> ahash::AHashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (char::from(b), b)
            } else {
                next += 1;
                (
                    char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER),
                    b,
                )
            }
        })
        .collect()
}

/// The byte a SentencePiece byte-fallback piece (`<0x0A>`) stands for.
fn sentencepiece_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

/// GPT-2-style BPE: the file's merges over bytes mapped to printable characters, split first
/// by the pre-tokenizer the file names. Returns the tokenizer and its vocabulary hash.
fn byte_level_bpe<S: ByteSource>(
    g: &Gguf<S>,
    tokens: &[&str],
) -> Result<(HfTokenizer, String), TokenizerError> {
    let merges = g.get_str_array("tokenizer.ggml.merges")?;
    let pre = g
        .get("tokenizer.ggml.pre")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let mut hasher = Sha256::new();
    for t in tokens {
        hasher.update(t.as_bytes());
        hasher.update([0]);
    }
    for m in &merges {
        hasher.update(m.as_bytes());
        hasher.update([1]);
    }
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| TokenizerError::BadMerge(m.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Llama 3's tokenizer takes a piece that is a whole vocabulary entry as is, merges or
    // not (llama.cpp's `ignore_merges` for `llama-bpe`).
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_of(tokens), merges)
        .ignore_merges(pre == "llama-bpe")
        .build()
        .map_err(|e| TokenizerError::Backend(e.to_string()))?;
    let mut inner = HfTokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    Ok((inner, hex::encode(hasher.finalize())))
}

/// SentencePiece's BPE (`tokenizer.ggml.model = llama`: Llama 2, Mistral, Gemma): spaces
/// become `▁`, pieces merge by score, and characters outside the vocabulary fall back to
/// `<0xXX>` byte tokens. The merges are derived from the scores the way Hugging Face's
/// converter does it, so the `tokenizers` crate's BPE runs it. Returns the tokenizer and
/// its vocabulary hash.
fn sentencepiece_bpe<S: ByteSource>(
    g: &Gguf<S>,
    tokens: &[&str],
    types: &[i64],
) -> Result<(HfTokenizer, String), TokenizerError> {
    let scores: Vec<f32> = g
        .get("tokenizer.ggml.scores")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect())
        .ok_or_else(|| GgufError::Metadata {
            key: "tokenizer.ggml.scores".into(),
            why: "missing (SentencePiece merges by score)".into(),
        })?;
    if scores.len() != tokens.len() {
        return Err(TokenizerError::Backend(format!(
            "{} scores for {} tokens",
            scores.len(),
            tokens.len()
        )));
    }
    let mut hasher = Sha256::new();
    for (t, score) in tokens.iter().zip(&scores) {
        hasher.update(t.as_bytes());
        hasher.update(score.to_le_bytes());
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_of(tokens), merges_by_score(tokens, &scores, types))
        .byte_fallback(true)
        .build()
        .map_err(|e| TokenizerError::Backend(e.to_string()))?;
    let mut inner = HfTokenizer::new(bpe);
    let space_prefix = g
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let backend = |e: tokenizers::Error| TokenizerError::Backend(e.to_string());
    let to_piece = Replace::new(" ", "▁").map_err(backend)?;
    let mut normalizers = vec![NormalizerWrapper::Replace(to_piece)];
    let mut decoders = vec![
        DecoderWrapper::Replace(Replace::new("▁", " ").map_err(backend)?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if space_prefix {
        normalizers.insert(0, NormalizerWrapper::Prepend(Prepend::new("▁".into())));
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    inner.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok((inner, hex::encode(hasher.finalize())))
}

/// Every split of a normal piece into two normal pieces, best-scored merged piece first
/// (ties by the halves' ids): SentencePiece merges the adjacent pair whose union scores
/// highest, which is what BPE does with merges in this order.
fn merges_by_score(tokens: &[&str], scores: &[f32], types: &[i64]) -> Vec<(String, String)> {
    let normal = |i: usize| types.get(i).is_none_or(|&t| t == TOKEN_TYPE_NORMAL);
    let ids: ahash::AHashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|&(i, _)| normal(i))
        .map(|(i, t)| (*t, i))
        .collect();
    let mut merges: Vec<(f32, usize, usize)> = Vec::new();
    let mut splits: Vec<(usize, usize)> = Vec::new();
    for (i, piece) in tokens.iter().enumerate().filter(|&(i, _)| normal(i)) {
        splits.clear();
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (ids.get(l), ids.get(r)) {
                splits.push((l, r));
            }
        }
        splits.sort_unstable();
        merges.extend(splits.iter().map(|&(l, r)| (scores[i], l, r)));
    }
    // Stable: equal scores keep the order of their merged pieces' ids.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    merges
        .into_iter()
        .map(|(_, l, r)| (tokens[l].to_string(), tokens[r].to_string()))
        .collect()
}

fn vocab_of(tokens: &[&str]) -> ahash::AHashMap<String, u32> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect()
}

/// llama.cpp's split for the `qwen2` and `llama-bpe` pre-tokenizers (`llama-vocab.cpp`),
/// which differ only in how many digits a piece takes (`{DIGITS}`).
const REGEX_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{DIGITS}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A split by `regex`, then bytes mapped to characters without GPT-2's own split.
fn regex_then_bytes(regex: &str) -> Result<PreTokenizerWrapper, TokenizerError> {
    let split = Split::new(
        SplitPattern::Regex(regex.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| TokenizerError::Backend(e.to_string()))?;
    Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
    ])))
}

/// The splitting rules llama.cpp uses for a `tokenizer.ggml.pre` name.
fn pre_tokenizer(name: &str) -> Result<PreTokenizerWrapper, TokenizerError> {
    let byte_level = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
    Ok(match name {
        // GPT-2's regex over bytes; SmolLM and StarCoder first split digits one by one.
        "gpt2" | "default" => byte_level(),
        "smollm" | "starcoder" | "refact" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            byte_level(),
        ])),
        // Qwen 2 and 3: GPT-2's rules with digits one by one and letters grouped across
        // case (llama.cpp's regex for `qwen2`); Llama 3 the same with digits in threes.
        "qwen2" => regex_then_bytes(&REGEX_SPLIT.replace("{DIGITS}", ""))?,
        "llama-bpe" => regex_then_bytes(&REGEX_SPLIT.replace("{DIGITS}", "{1,3}"))?,
        other => return Err(TokenizerError::UnsupportedPre(other.into())),
    })
}
