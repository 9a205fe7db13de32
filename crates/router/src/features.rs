//! Text → sparse feature vector for the router's small linear models: hashed word uni- and
//! bigrams, CJK character uni- and bigrams, and a few dense shape features (length, digits,
//! math and code symbols). Linear in the input, no allocation per token beyond the output.

use std::sync::OnceLock;

/// Hashed buckets, including the dense slots at the front. 2^14 keeps an eleven-class model
/// at 176 KiB with 8-bit weights.
pub const DIM: usize = 1 << 14;

/// Slots 0..DENSE hold the dense features; hashed n-grams land in DENSE..DIM.
const DENSE: usize = 8;

/// Only this many bytes from the start (and `TAIL_BYTES` from the end) are read: the
/// question is at the ends of a long prompt, and the work stays bounded for a 1 MB paste.
/// Hash seed of whole words (the lexicon is keyed by the same hash).
const WORD_SEED: u64 = 0x51;

const HEAD_BYTES: usize = 6 * 1024;
const TAIL_BYTES: usize = 2 * 1024;

/// A sparse vector: distinct indices below [`DIM`] (dense slots first, then hashed ones in
/// the order first seen) and their values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Features {
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
}

/// The features of a prompt.
pub fn extract(text: &str) -> Features {
    let hashed = hashed_ngrams(&bounded_sample(text));
    let mut features = Features::default();
    dense(text, &mut features);
    push_hashed(&mut features, &hashed);
    features
}

/// The hashed n-gram buckets of `sample` in reading order, repeats kept for counting.
fn hashed_ngrams(sample: &str) -> Vec<u32> {
    let mut ngrams = Ngrams::with_capacity(sample.len() / 3);
    for c in sample.chars() {
        if is_cjk(c) {
            ngrams.end_word();
            ngrams.push_cjk(c);
        } else if c.is_alphanumeric() {
            ngrams.prev_cjk = None;
            ngrams.word.extend(c.to_lowercase());
        } else {
            ngrams.prev_cjk = None;
            ngrams.end_word();
            if !c.is_whitespace() {
                ngrams.push_symbol(c);
            }
        }
    }
    ngrams.end_word();
    ngrams.out
}

/// Tokenizer state carried between characters: bigrams need the previous word or CJK
/// character, and a word is hashed only once it is complete.
struct Ngrams {
    out: Vec<u32>,
    word: String,
    prev_word: Option<u64>,
    prev_cjk: Option<char>,
}

impl Ngrams {
    /// Reserves the output once, sized by the caller's estimate, so pushes rarely regrow it.
    fn with_capacity(capacity: usize) -> Self {
        Self {
            out: Vec::with_capacity(capacity),
            word: String::new(),
            prev_word: None,
            prev_cjk: None,
        }
    }

    /// Hashes the word just read, so its bucket precedes those of its trigrams and bigram.
    fn end_word(&mut self) {
        if self.word.is_empty() {
            return;
        }
        let h = fnv(self.word.as_bytes(), WORD_SEED);
        self.out.push(bucket(h));
        if let Some(cue) = lexicon_class(h) {
            self.out.push(bucket(fnv(cue.as_bytes(), 0x1E)));
        }
        push_trigrams(&self.word, &mut self.out);
        if let Some(p) = self.prev_word {
            self.out.push(bucket(p.rotate_left(17) ^ h ^ 0xB16));
        }
        self.prev_word = Some(h);
        self.word.clear();
    }

    /// CJK has no spaces, so each character and each adjacent pair stands in for words.
    fn push_cjk(&mut self, c: char) {
        let mut buf = [0u8; 8];
        let a = c.encode_utf8(&mut buf[..4]).len();
        self.out.push(bucket(fnv(&buf[..a], 0xC1)));
        if let Some(p) = self.prev_cjk {
            let b = p.encode_utf8(&mut buf[a..]).len();
            self.out.push(bucket(fnv(&buf[..a + b], 0xC2)));
        }
        self.prev_cjk = Some(c);
        self.prev_word = None;
    }

    /// Punctuation and symbols count as tokens of their own ("=", "?", "{").
    fn push_symbol(&mut self, c: char) {
        let mut buf = [0u8; 4];
        self.out
            .push(bucket(fnv(c.encode_utf8(&mut buf).as_bytes(), 0x5B)));
    }
}

/// Boundary-padded trigrams ("^su", …, "ze$") let inflections share weights ("summarizing").
fn push_trigrams(word: &str, out: &mut Vec<u32>) {
    let bytes = word.as_bytes();
    if bytes.len() > 3 && bytes.len() <= 30 && word.is_ascii() {
        let mut padded = [0u8; 32];
        padded[0] = b'^';
        padded[1..=bytes.len()].copy_from_slice(bytes);
        padded[bytes.len() + 1] = b'$';
        for tri in padded[..bytes.len() + 2].windows(3) {
            out.push(bucket(fnv(tri, 0x73)));
        }
    }
}

/// Appends each distinct bucket once, in first-seen order, weighted by how often it occurs.
fn push_hashed(features: &mut Features, hashed: &[u32]) {
    // Count in a dense table rather than sorting: linear, and a 2 KB prompt stays in the
    // tens of microseconds.
    let mut counts = vec![0u16; DIM];
    let start = features.indices.len();
    for &h in hashed {
        let n = &mut counts[h as usize];
        if *n == 0 {
            features.indices.push(h);
        }
        *n = n.saturating_add(1);
    }
    // Sublinear term frequency, then unit length, so long prompts do not swamp the weights.
    features.values.extend(
        features.indices[start..]
            .iter()
            .map(|&h| 1.0 + f32::from(counts[h as usize]).ln()),
    );
    normalise(&mut features.values[start..]);
}

/// Scales `values` to unit length; an all-zero slice stays as it is.
fn normalise(values: &mut [f32]) {
    let norm = values.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        for v in values {
            *v /= norm;
        }
    }
}

/// Words whose class is known beyond any corpus: an unseen language name or programming
/// language then carries what the seen ones taught.
fn lexicon_class(word_hash: u64) -> Option<&'static str> {
    // An open-addressed table keyed by the word's hash, which is already computed: one probe
    // per word, where comparing strings cost more than all the rest of the extraction.
    const SLOTS: usize = 512;
    static TABLE: OnceLock<Vec<Option<(u64, &'static str)>>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = vec![None; SLOTS];
        for (w, class) in LEXICON {
            let h = fnv(w.as_bytes(), WORD_SEED);
            let mut i = h as usize % SLOTS;
            while t[i].is_some() {
                i = (i + 1) % SLOTS;
            }
            t[i] = Some((h, *class));
        }
        t
    });
    let mut i = word_hash as usize % SLOTS;
    while let Some((h, class)) = table[i] {
        if h == word_hash {
            return Some(class);
        }
        i = (i + 1) % SLOTS;
    }
    None
}

/// Each word's class, listed by word (a test keeps the list free of duplicates).
const LEXICON: &[(&str, &str)] = &[
    ("algorithm", "<code-term>"),
    ("angular", "<code-term>"),
    ("api", "<code-term>"),
    ("arabic", "<language-name>"),
    ("area", "<math-term>"),
    ("array", "<code-term>"),
    ("bash", "<code-term>"),
    ("bengali", "<language-name>"),
    ("bug", "<code-term>"),
    ("bye", "<greeting>"),
    ("calculate", "<math-term>"),
    ("cantonese", "<language-name>"),
    ("chinese", "<language-name>"),
    ("circle", "<math-term>"),
    ("class", "<code-term>"),
    ("clojure", "<code-term>"),
    ("cobol", "<code-term>"),
    ("compile", "<code-term>"),
    ("compiler", "<code-term>"),
    ("compute", "<math-term>"),
    ("css", "<code-term>"),
    ("czech", "<language-name>"),
    ("danish", "<language-name>"),
    ("debug", "<code-term>"),
    ("derivative", "<math-term>"),
    ("determinant", "<math-term>"),
    ("differentiate", "<math-term>"),
    ("django", "<code-term>"),
    ("docker", "<code-term>"),
    ("dutch", "<language-name>"),
    ("elixir", "<code-term>"),
    ("english", "<language-name>"),
    ("equation", "<math-term>"),
    ("erlang", "<code-term>"),
    ("evaluate", "<math-term>"),
    ("exception", "<code-term>"),
    ("factorial", "<math-term>"),
    ("farsi", "<language-name>"),
    ("finnish", "<language-name>"),
    ("flask", "<code-term>"),
    ("fortran", "<code-term>"),
    ("fraction", "<math-term>"),
    ("french", "<language-name>"),
    ("function", "<code-term>"),
    ("geometry", "<math-term>"),
    ("german", "<language-name>"),
    ("git", "<code-term>"),
    ("golang", "<code-term>"),
    ("goodnight", "<greeting>"),
    ("greek", "<language-name>"),
    ("haha", "<greeting>"),
    ("hahaha", "<greeting>"),
    ("haskell", "<code-term>"),
    ("hebrew", "<language-name>"),
    ("hello", "<greeting>"),
    ("hey", "<greeting>"),
    ("hi", "<greeting>"),
    ("hindi", "<language-name>"),
    ("hiya", "<greeting>"),
    ("howdy", "<greeting>"),
    ("html", "<code-term>"),
    ("hungarian", "<language-name>"),
    ("indonesian", "<language-name>"),
    ("integral", "<math-term>"),
    ("integrate", "<math-term>"),
    ("italian", "<language-name>"),
    ("japanese", "<language-name>"),
    ("java", "<code-term>"),
    ("javascript", "<code-term>"),
    ("json", "<code-term>"),
    ("julia", "<code-term>"),
    ("korean", "<language-name>"),
    ("kotlin", "<code-term>"),
    ("kubernetes", "<code-term>"),
    ("latin", "<language-name>"),
    ("limit", "<math-term>"),
    ("log", "<math-term>"),
    ("logarithm", "<math-term>"),
    ("lol", "<greeting>"),
    ("loop", "<code-term>"),
    ("lua", "<code-term>"),
    ("malay", "<language-name>"),
    ("mandarin", "<language-name>"),
    ("matlab", "<code-term>"),
    ("matrix", "<math-term>"),
    ("mean", "<math-term>"),
    ("median", "<math-term>"),
    ("method", "<code-term>"),
    ("morning", "<greeting>"),
    ("node", "<code-term>"),
    ("nodejs", "<code-term>"),
    ("norwegian", "<language-name>"),
    ("numpy", "<code-term>"),
    ("pandas", "<code-term>"),
    ("percent", "<math-term>"),
    ("percentage", "<math-term>"),
    ("perl", "<code-term>"),
    ("persian", "<language-name>"),
    ("php", "<code-term>"),
    ("polish", "<language-name>"),
    ("polynomial", "<math-term>"),
    ("portuguese", "<language-name>"),
    ("powershell", "<code-term>"),
    ("prime", "<math-term>"),
    ("probability", "<math-term>"),
    ("product", "<math-term>"),
    ("prove", "<math-term>"),
    ("python", "<code-term>"),
    ("radius", "<math-term>"),
    ("react", "<code-term>"),
    ("recursion", "<code-term>"),
    ("refactor", "<code-term>"),
    ("regex", "<code-term>"),
    ("romanian", "<language-name>"),
    ("roots", "<math-term>"),
    ("ruby", "<code-term>"),
    ("russian", "<language-name>"),
    ("rust", "<code-term>"),
    ("scala", "<code-term>"),
    ("script", "<code-term>"),
    ("shell", "<code-term>"),
    ("simplify", "<math-term>"),
    ("snippet", "<code-term>"),
    ("solve", "<math-term>"),
    ("spanish", "<language-name>"),
    ("sql", "<code-term>"),
    ("sqrt", "<math-term>"),
    ("stacktrace", "<code-term>"),
    ("sum", "<math-term>"),
    ("swahili", "<language-name>"),
    ("swedish", "<language-name>"),
    ("swift", "<code-term>"),
    ("tagalog", "<language-name>"),
    ("thai", "<language-name>"),
    ("thank", "<greeting>"),
    ("thanks", "<greeting>"),
    ("theorem", "<math-term>"),
    ("triangle", "<math-term>"),
    ("turkish", "<language-name>"),
    ("typescript", "<code-term>"),
    ("ukrainian", "<language-name>"),
    ("urdu", "<language-name>"),
    ("variable", "<code-term>"),
    ("variance", "<math-term>"),
    ("vietnamese", "<language-name>"),
    ("volume", "<math-term>"),
    ("vue", "<code-term>"),
    ("yaml", "<code-term>"),
    ("yo", "<greeting>"),
];

/// The dense slots: a bias and the prompt's shape, each scaled to about 0–1.
fn dense(text: &str, out: &mut Features) {
    let (mut chars, mut digits, mut math, mut code, mut lines, mut cjk) =
        (0f32, 0f32, 0f32, 0f32, 1f32, 0f32);
    for c in text.chars() {
        chars += 1.0;
        match c {
            '0'..='9' => digits += 1.0,
            '+' | '-' | '*' | '/' | '=' | '^' | '%' | '<' | '>' | '√' | '∑' | '∫' | '×' | '÷' => {
                math += 1.0
            }
            '{' | '}' | ';' | '(' | ')' | '[' | ']' | '_' | '`' => code += 1.0,
            '\n' => lines += 1.0,
            c if is_cjk(c) => cjk += 1.0,
            _ => {}
        }
    }
    let per = |n: f32| if chars > 0.0 { n / chars } else { 0.0 };
    let values = [
        1.0,
        (1.0 + chars).log2() / 16.0,
        (per(digits) * 5.0).min(1.0),
        (per(math) * 10.0).min(1.0),
        (per(code) * 10.0).min(1.0),
        lines.log2() / 8.0,
        per(cjk),
        f32::from(text.contains('?') || text.contains('？')),
    ];
    debug_assert_eq!(values.len(), DENSE);
    for (i, v) in values.into_iter().enumerate() {
        out.indices.push(i as u32);
        out.values.push(v.min(2.0));
    }
}

/// The head and tail of a long text, each cut on a character boundary.
fn bounded_sample(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= HEAD_BYTES + TAIL_BYTES {
        return text.into();
    }
    let mut head = HEAD_BYTES;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - TAIL_BYTES;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}\n{}", &text[..head], &text[tail..]).into()
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0xF900..=0xFAFF | 0x3040..=0x30FF)
}

fn bucket(h: u64) -> u32 {
    // Multiply-shift instead of a modulo: the division was most of the cost per token.
    (DENSE as u64 + (((h >> 32) * (DIM - DENSE) as u64) >> 32)) as u32
}

fn fnv(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // FNV's low bits mix poorly; a final avalanche spreads them over the buckets.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_distinct_and_in_range() {
        for text in [
            "",
            "Hello, world! hello",
            "请详细介绍长城 and the wall 长城",
            "x = 3 + 4; y = x * x",
        ] {
            let f = extract(text);
            let mut sorted = f.indices.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), f.indices.len(), "{text}");
            assert!(f.indices.iter().all(|&i| (i as usize) < DIM));
            assert_eq!(f.indices.len(), f.values.len());
            assert!(f.values.iter().all(|v| v.is_finite()));
        }
    }

    #[test]
    fn the_lexicon_is_sorted_and_found_by_hash() {
        assert!(LEXICON.windows(2).all(|w| w[0].0 < w[1].0));
        let class = |w: &str| lexicon_class(fnv(w.as_bytes(), WORD_SEED));
        assert_eq!(class("kotlin"), Some("<code-term>"));
        assert_eq!(class("swahili"), Some("<language-name>"));
        assert_eq!(class("kettle"), None);
    }

    #[test]
    fn case_and_repetition_move_the_vector_little() {
        let a = extract("What is the capital of France?");
        let b = extract("what is the CAPITAL of france?");
        assert_eq!(a, b);
        let words = extract("solve the equation");
        let other = extract("write a poem");
        let shared = words
            .indices
            .iter()
            .filter(|i| other.indices.contains(i))
            .count();
        // Only the dense slots (and at most a rare hash collision) are shared.
        assert!(shared <= DENSE + 1, "{shared}");
    }

    #[test]
    fn a_megabyte_prompt_costs_no_more_than_its_bounded_sample() {
        let big = "ab1+ 长城 ".repeat(120_000);
        assert!(big.len() > 1_000_000);
        let f = extract(&big);
        assert!(f.indices.len() < 64, "{}", f.indices.len());
        // Cutting inside a multi-byte character must not panic.
        let odd = format!("a{}", "长".repeat(400_000));
        extract(&odd);
    }
}
