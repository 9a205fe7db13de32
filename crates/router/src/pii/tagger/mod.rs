//! A linear-chain tagger for what has no fixed shape: person names, places, organisations
//! and street addresses written without a cue word ("a card for Johanna Kessler", "she moved
//! to Springfield"). Each word gets hashed features of itself and its neighbours; BIO tags
//! are decoded by Viterbi; the weights are learned by the averaged structured perceptron
//! ([`train`]) and stored as 16-bit integers in a small checked file
//! (`data/pii-tagger.bin`, written by `straddle train-pii`). The file also holds a gazetteer
//! of first names, surnames, cities and countries as one Bloom filter, so knowing tens of
//! thousands of names costs a few bits each.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::cues::MONTHS;
use super::digits::is_year;
use super::kinds::{EntityKind, Span};

mod features;
mod train;

use features::{Word, features, near_title_case, words};
pub use train::{Dropout, Labelled, TrainConfig, train};

/// The tags, in weight order: outside, then begin/inside for each entity class.
const TAGS: [&str; 9] = [
    "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-ADDR", "I-ADDR",
];

const N_TAGS: usize = TAGS.len();

/// The entity class of each tag pair, in tag order.
const KINDS: [EntityKind; 4] = [
    EntityKind::PersonName,
    EntityKind::Location,
    EntityKind::Organization,
    EntityKind::StreetAddress,
];

const MAGIC: &[u8; 8] = b"STRDPII1";

/// The feature set's version: a model trained on other features is refused at load.
const FEATURES_VERSION: u32 = 4;

/// The gazetteer's classes, each a flag letter in the features.
const GAZETTEER_CLASSES: [(&str, char); 5] = [
    ("given", 'g'),
    ("surname", 's'),
    ("city", 'c'),
    ("country", 'n'),
    ("word", 'w'),
];

/// Probes per Bloom filter lookup: about 1% false positives at 10 bits an entry.
const BLOOM_PROBES: u64 = 7;

/// Longest text the tagger reads in one piece; longer prompts are tagged in windows.
const MAX_TOKENS_PER_WINDOW: usize = 4096;

const BUNDLED: &[u8] = include_bytes!("../../../data/pii-tagger.bin");

/// Why a tagger model could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TaggerError {
    #[error("not a straddle PII tagger (bad magic)")]
    BadMagic,
    #[error("PII tagger truncated: {0}")]
    Truncated(&'static str),
    #[error("PII tagger header: {0}")]
    Header(String),
    #[error(
        "PII tagger weights fail their checksum (stored {stored:016x}, computed {computed:016x})"
    )]
    Checksum { stored: u64, computed: u64 },
    #[error("PII tagger built for features v{0}, this build reads v{FEATURES_VERSION}")]
    FeaturesVersion(u32),
    #[error("training needs at least one labelled sentence")]
    NoExamples,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    tags: Vec<String>,
    features_version: u32,
    /// Hash buckets; a power of two.
    buckets: usize,
    /// The weight that 1 in the stored integers stands for.
    scale: f32,
    /// `(1 + N_TAGS) × N_TAGS` transition weights; row 0 is the start of a sentence.
    transitions: Vec<f32>,
    /// Bits in the gazetteer's Bloom filter; a power of two (or 0: none).
    bloom_bits: usize,
    /// FNV-1a 64 of the stored weight and filter bytes.
    checksum: u64,
    /// Where the training data came from.
    provenance: String,
}

/// A trained tagger.
#[derive(Debug, Clone, PartialEq)]
pub struct Tagger {
    header: Header,
    /// Bucket-major: the weights of bucket `b` for every tag sit together.
    weights: Vec<i16>,
    gazetteer: Bloom,
}

/// A Bloom filter over `class\tname` keys (double hashing, Kirsch and Mitzenmacher).
#[derive(Debug, Clone, PartialEq)]
pub struct Bloom {
    words: Vec<u64>,
}

impl Bloom {
    /// An empty filter sized for `entries` names (rounded up to a power of two bits).
    pub fn with_capacity(entries: usize) -> Bloom {
        let bits = (entries * 10).next_power_of_two().max(64);
        Bloom {
            words: vec![0; bits / 64],
        }
    }

    fn probes(&self, class: &str, name: &str) -> impl Iterator<Item = usize> + use<> {
        let h1 = fnv64_pair(class, name);
        let h2 = crate::rng::mix(h1) | 1;
        let mask = (self.words.len() * 64 - 1) as u64;
        (0..BLOOM_PROBES).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) & mask) as usize)
    }

    /// Adds `name` (lower case) to `class`.
    pub fn insert(&mut self, class: &str, name: &str) {
        for bit in self.probes(class, name).collect::<Vec<_>>() {
            self.words[bit / 64] |= 1 << (bit % 64);
        }
    }

    /// Whether `name` (lower case) is probably in `class`.
    pub fn contains(&self, class: &str, name: &str) -> bool {
        !self.words.is_empty()
            && self
                .probes(class, name)
                .all(|bit| self.words[bit / 64] & (1 << (bit % 64)) != 0)
    }

    fn to_bytes(&self) -> impl Iterator<Item = u8> + '_ {
        self.words.iter().flat_map(|w| w.to_le_bytes())
    }
}

/// One word or punctuation mark: its byte range and whether a line break precedes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Token {
    pub start: usize,
    pub end: usize,
    pub line_start: bool,
}

/// The bundled tagger, or why it could not be read.
pub fn bundled() -> Result<&'static Tagger, &'static TaggerError> {
    static TAGGER: OnceLock<Result<Tagger, TaggerError>> = OnceLock::new();
    TAGGER.get_or_init(|| Tagger::from_bytes(BUNDLED)).as_ref()
}

/// Splits `text` into words (letters and digits, with inner apostrophes and hyphens) and
/// single punctuation marks.
pub fn tokenize(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = text.char_indices().peekable();
    let mut line_start = true;
    while let Some((i, c)) = chars.next() {
        if c.is_whitespace() {
            line_start |= c == '\n';
            continue;
        }
        let mut end = i + c.len_utf8();
        if c.is_alphanumeric() {
            while let Some(&(j, d)) = chars.peek() {
                let after = &text[j + d.len_utf8()..];
                // "O'Neil" and "Jean-Luc" are one word; "Jade's" is "Jade" and "'s".
                let possessive = d != '-'
                    && (after.starts_with('s') || after.starts_with('S'))
                    && !after[1..].chars().next().is_some_and(char::is_alphanumeric);
                let joins = matches!(d, '\'' | '’' | '-')
                    && !possessive
                    && after.chars().next().is_some_and(char::is_alphanumeric);
                if !(d.is_alphanumeric() || joins) {
                    break;
                }
                end = j + d.len_utf8();
                chars.next();
            }
        }
        tokens.push(Token {
            start: i,
            end,
            line_start,
        });
        line_start = false;
    }
    tokens
}

impl Tagger {
    /// Reads a model written by [`Tagger::to_bytes`], checking its magic, header, feature
    /// version and checksum before any weight is used.
    pub fn from_bytes(bytes: &[u8]) -> Result<Tagger, TaggerError> {
        let rest = bytes.strip_prefix(MAGIC).ok_or(TaggerError::BadMagic)?;
        let len_bytes = rest
            .get(..4)
            .ok_or(TaggerError::Truncated("header length"))?;
        let len = u32::from_le_bytes(
            len_bytes
                .try_into()
                .map_err(|_| TaggerError::Truncated("header length"))?,
        ) as usize;
        let json = rest
            .get(4..4 + len)
            .ok_or(TaggerError::Truncated("header"))?;
        let header: Header =
            serde_json::from_slice(json).map_err(|e| TaggerError::Header(e.to_string()))?;
        if header.features_version != FEATURES_VERSION {
            return Err(TaggerError::FeaturesVersion(header.features_version));
        }
        if header.tags != TAGS
            || !header.buckets.is_power_of_two()
            || header.transitions.len() != (1 + N_TAGS) * N_TAGS
        {
            return Err(TaggerError::Header(
                "tags, buckets or transitions do not match this build".into(),
            ));
        }
        let body = &rest[4 + len..];
        let weight_bytes = header.buckets * N_TAGS * 2;
        if (header.bloom_bits != 0 && !header.bloom_bits.is_power_of_two())
            || !header.bloom_bits.is_multiple_of(64)
        {
            return Err(TaggerError::Header(
                "the gazetteer's size is not a power of two".into(),
            ));
        }
        if body.len() != weight_bytes + header.bloom_bits / 8 {
            return Err(TaggerError::Truncated("weights"));
        }
        let computed = fnv64(body);
        if computed != header.checksum {
            return Err(TaggerError::Checksum {
                stored: header.checksum,
                computed,
            });
        }
        let (weights, filter) = body.split_at(weight_bytes);
        let weights = weights
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        let words = filter
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        Ok(Tagger {
            header,
            weights,
            gazetteer: Bloom { words },
        })
    }

    /// The model's bytes: magic, header length, JSON header, little-endian weights.
    pub fn to_bytes(&self) -> Vec<u8> {
        let weights = self.body();
        let header = Header {
            checksum: fnv64(&weights),
            bloom_bits: self.gazetteer.words.len() * 64,
            ..self.header.clone()
        };
        let json = serde_json::to_vec(&header).unwrap_or_default();
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
        out.extend_from_slice(&weights);
        out
    }

    /// The stored weights and filter, as the checksum covers them.
    fn body(&self) -> Vec<u8> {
        let weights = self.weights.iter().flat_map(|w| w.to_le_bytes());
        weights.chain(self.gazetteer.to_bytes()).collect()
    }

    /// A short name for this model that changes whenever its weights do.
    pub fn version(&self) -> String {
        format!("pii-tagger/{:08x}", self.header.checksum >> 32)
    }

    /// Where the model's training data came from.
    pub fn provenance(&self) -> &str {
        &self.header.provenance
    }

    /// The entities the tagger finds in `text`, as spans.
    pub fn tag(&self, text: &str) -> Vec<Span> {
        let tokens = tokenize(text);
        let mut spans = Vec::new();
        for window in tokens.chunks(MAX_TOKENS_PER_WINDOW) {
            let tags = self.decode(text, window);
            spans.extend(spans_of(text, &tags, window));
        }
        // A street address identifies a home by its number; a capitalised pair without one
        // ("Volvo Cars"), or whose numbers are a date's ("6 May 1943"), is something else.
        spans.retain(|s| {
            s.kind != EntityKind::StreetAddress || has_house_number(&text[s.start..s.end])
        });
        spans
    }

    fn decode(&self, text: &str, tokens: &[Token]) -> Vec<usize> {
        let near = near_title_case(text, tokens);
        let words = words(text, tokens, &self.gazetteer, Some(&near));
        let mut tags = vec![0; tokens.len()];
        let mut feats = Vec::with_capacity(32);
        for segment in segments(&words) {
            let emissions: Vec<[f32; N_TAGS]> = segment
                .clone()
                .map(|i| {
                    features(&words, i, self.header.buckets, &mut feats);
                    self.emission(&feats)
                })
                .collect();
            let best = viterbi(
                &emissions,
                &self.header.transitions,
                &words[segment.clone()],
            );
            tags[segment].copy_from_slice(&best);
        }
        tags
    }

    fn emission(&self, feats: &[u32]) -> [f32; N_TAGS] {
        let mut e = [0i32; N_TAGS];
        for &f in feats {
            let row = &self.weights[f as usize * N_TAGS..(f as usize + 1) * N_TAGS];
            for (x, w) in e.iter_mut().zip(row) {
                *x += i32::from(*w);
            }
        }
        e.map(|x| x as f32 * self.header.scale)
    }
}

/// The runs of tokens worth decoding: every entity holds a capitalised word (an address's
/// number sits beside its street's name), so only tokens within two of one are read; the
/// rest of the text, digit runs included, is outside any entity.
fn segments(words: &[Word]) -> Vec<std::ops::Range<usize>> {
    const REACH: usize = 2;
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, w) in words.iter().enumerate() {
        // Title case anchors ("Kessler", "McDonald"): a run of upper-case words ("BEGIN",
        // "NASA") is more often a heading or an acronym than a name.
        if !w.title_case {
            continue;
        }
        let range = i.saturating_sub(REACH)..(i + REACH + 1).min(words.len());
        match out.last_mut() {
            Some(last) if last.end >= range.start => last.end = range.end,
            _ => out.push(range),
        }
    }
    out
}

/// Whether tag `to` may follow tag `from` (`None`: the sentence start): an inside tag only
/// continues its own class.
fn allowed(from: Option<usize>, to: usize) -> bool {
    if to == 0 || to % 2 == 1 {
        return true;
    }
    from.is_some_and(|f| f != 0 && f.div_ceil(2) == to / 2)
}

/// The tag that begins a street address, whose first word may be a house number or a
/// lower-case street type ("rue de Rivoli").
const B_ADDRESS: usize = 7;

/// Whether `word` may carry tag `t` at all.
fn fits(word: &Word, t: usize) -> bool {
    let begins = !t.is_multiple_of(2);
    match t {
        0 => true,
        _ if !word.may_tag => false,
        B_ADDRESS => word.is_word,
        _ if begins => word.may_begin_name,
        _ => word.may_continue,
    }
}

fn viterbi(emissions: &[[f32; N_TAGS]], transitions: &[f32], words: &[Word]) -> Vec<usize> {
    if emissions.is_empty() {
        return Vec::new();
    }
    let mut score = [f32::NEG_INFINITY; N_TAGS];
    for t in 0..N_TAGS {
        if allowed(None, t) && fits(&words[0], t) {
            score[t] = transitions[t] + emissions[0][t];
        }
    }
    let mut back = vec![[0u8; N_TAGS]; emissions.len()];
    for (i, e) in emissions.iter().enumerate().skip(1) {
        let mut next = [f32::NEG_INFINITY; N_TAGS];
        for to in 0..N_TAGS {
            if !fits(&words[i], to) {
                continue;
            }
            for from in 0..N_TAGS {
                if !allowed(Some(from), to) {
                    continue;
                }
                let s = score[from] + transitions[(1 + from) * N_TAGS + to];
                if s > next[to] {
                    next[to] = s;
                    back[i][to] = from as u8;
                }
            }
            next[to] += e[to];
        }
        score = next;
    }
    let mut best = (0..N_TAGS).fold(0, |b, t| if score[t] > score[b] { t } else { b });
    let mut tags = vec![0; emissions.len()];
    for i in (0..emissions.len()).rev() {
        tags[i] = best;
        best = usize::from(back[i][best]);
    }
    tags
}

/// The entity spans that a tag sequence marks; an entity ends on a word, not on the
/// punctuation after it.
fn spans_of(text: &str, tags: &[usize], tokens: &[Token]) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::new();
    for (t, tok) in tags.iter().zip(tokens) {
        let is_word = text[tok.start..]
            .chars()
            .next()
            .is_some_and(char::is_alphanumeric);
        match *t {
            0 => {}
            t if t % 2 == 1 => spans.push(Span {
                kind: KINDS[t / 2],
                start: tok.start,
                end: tok.end,
                confidence: 0.7,
            }),
            _ if is_word
                || text[tok.start..tok.end] == *"."
                || text[tok.start..tok.end] == *")" =>
            {
                if let Some(last) = spans.last_mut() {
                    last.end = tok.end;
                }
            }
            _ => {}
        }
    }
    spans
}

fn fnv64_pair(a: &str, b: &str) -> u64 {
    let h = a.bytes().fold(0xcbf2_9ce4_8422_2325, |h, c| {
        (h ^ u64::from(c)).wrapping_mul(0x0100_0000_01b3)
    });
    b.bytes()
        .fold((h ^ 0xff).wrapping_mul(0x0100_0000_01b3), |h, c| {
            (h ^ u64::from(c)).wrapping_mul(0x0100_0000_01b3)
        })
}

fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// English months' whole names (`MONTHS` holds their first letters).
const ENGLISH_MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// Whether `span` holds a number that can be a house's: not a day beside a month's name, not
/// a year in a span that names a month ("6 May 1943", "December 15, 1890", "1 June 1945 --
/// 21 November"), and not a year that opens a clause ("In 2003, when …").
fn has_house_number(span: &str) -> bool {
    let words: Vec<&str> = span
        .split(|c: char| c.is_whitespace() || matches!(c, ';' | '(' | ')'))
        .filter(|w| !w.is_empty())
        .collect();
    // A month's whole English name or its abbreviation, not a street that starts like one
    // ("Marine"); Russian names, declined, by their first letters.
    let is_month = |w: &str| {
        let lower = w.trim_end_matches([',', '.']).to_lowercase();
        ENGLISH_MONTHS.contains(&lower.as_str())
            || lower == "sept"
            || MONTHS.iter().any(|m| match m.is_ascii() {
                true => lower == *m,
                false => lower.starts_with(m),
            })
    };
    // Without a month a four-digit number is as often a house's ("1248 Oak St") as a year's.
    let dated = words.iter().any(|w| is_month(w));
    words.iter().enumerate().any(|(i, w)| {
        let digits: String = w.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() {
            return false;
        }
        let year = digits.len() == 4 && digits.parse().is_ok_and(is_year);
        // "In 2003, when Ramos…": a year that opens a clause. A house number is not set off
        // from its street by a comma, except in short numbers ("12, rue de Rivoli").
        let opens_clause = year && w[digits.len()..].starts_with(',');
        let beside_month = [i.wrapping_sub(1), i + 1]
            .iter()
            .any(|&j| words.get(j).is_some_and(|n| is_month(n)));
        !(beside_month || dated && year || opens_clause)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(text: &str) -> Vec<(EntityKind, &str)> {
        let tagger = bundled().expect("the bundled tagger loads");
        tagger
            .tag(text)
            .into_iter()
            .map(|s| (s.kind, &text[s.start..s.end]))
            .collect()
    }

    #[test]
    fn a_date_holds_no_house_number() {
        for span in [
            "6 May 1943",
            "December 15, 1890",
            "1 June 1945 -- 21 November 1945",
            "Dec. 2008",
            "In 2003, when Ramos",
            "1964, its Holloway",
        ] {
            assert!(!has_house_number(span), "{span}");
        }
        for span in [
            "340 Hay Street",
            "169 Hay Street, East Perth",
            "Flat 2, 14 Park Road",
            "221B Baker Street",
            "12 Marine Drive",
            "7 Juniper Way",
            "1248 Oak St",
            "Franz-Peter-Stadelmann-Platz 1248",
            "12, rue de Rivoli",
            "1248 Oak St, Dayton",
        ] {
            assert!(has_house_number(span), "{span}");
        }
    }

    #[test]
    fn tokens_keep_inner_apostrophes_and_hyphens() {
        let text = "O'Neil met Jean-Luc.\nOK";
        let words: Vec<&str> = tokenize(text)
            .iter()
            .map(|t| &text[t.start..t.end])
            .collect();
        assert_eq!(words, ["O'Neil", "met", "Jean-Luc", ".", "OK"]);
        assert!(tokenize(text)[4].line_start);
    }

    #[test]
    fn bundled_tagger_loads_with_a_version() {
        let tagger = bundled().expect("the bundled tagger loads");
        assert!(tagger.version().starts_with("pii-tagger/"));
        assert!(!tagger.provenance().is_empty());
    }

    #[test]
    fn names_and_places_without_cue_words() {
        let text =
            "Please write a two-line greeting card for Johanna Kessler. She lives in Springfield.";
        let found = tagged(text);
        assert!(
            found.contains(&(EntityKind::PersonName, "Johanna Kessler")),
            "{found:?}"
        );
        assert!(
            found.contains(&(EntityKind::Location, "Springfield")),
            "{found:?}"
        );
        assert!(tagged("Explain how photosynthesis works on Monday.").is_empty());
    }

    /// Names from locales that neither the training sentences nor the gazetteer drew from
    /// (Finnish, Yoruba, Croatian) are people, not places or companies.
    #[test]
    fn unlisted_names_are_people() {
        for (text, name) in [
            (
                "I had lunch with Kerttu Ahonen; she sends her regards.",
                "Kerttu Ahonen",
            ),
            (
                "Please ask Oluwaseun Adebayo to sign the form.",
                "Oluwaseun Adebayo",
            ),
            ("Who is Mislav Nižetić? He wrote to me.", "Mislav Nižetić"),
        ] {
            let found = tagged(text);
            assert!(
                found.contains(&(EntityKind::PersonName, name)),
                "{text}: {found:?}"
            );
        }
    }

    #[test]
    fn a_lower_case_word_never_begins_a_name() {
        let text = "My mother-in-law Dolores asked which is better, Python or Rust.";
        for (_, value) in tagged(text) {
            assert!(value.starts_with(char::is_uppercase), "{value}");
        }
    }

    #[test]
    fn a_corrupt_or_foreign_model_is_a_clear_error() {
        let good = bundled().expect("the bundled tagger loads").to_bytes();
        assert_eq!(Tagger::from_bytes(b"nonsense"), Err(TaggerError::BadMagic));
        assert!(matches!(
            Tagger::from_bytes(&good[..good.len() - 1]),
            Err(TaggerError::Truncated(_))
        ));
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(
            Tagger::from_bytes(&flipped),
            Err(TaggerError::Checksum { .. })
        ));
        assert_eq!(
            Tagger::from_bytes(&good).as_ref().map(Tagger::version),
            Ok(bundled().expect("loads").version())
        );
    }

    #[test]
    fn training_learns_a_toy_corpus() {
        let ex = |text: &str, name: &str| {
            let start = text.find(name).expect("name in text");
            Labelled {
                text: text.into(),
                spans: vec![(EntityKind::PersonName, start, start + name.len())],
            }
        };
        let corpus: Vec<Labelled> = ["Ada", "Bob", "Cyd", "Dot"]
            .iter()
            .flat_map(|n| {
                [
                    ex(&format!("call {n} now"), n),
                    ex(&format!("tell {n} soon"), n),
                ]
            })
            .collect();
        let config = TrainConfig {
            epochs: 5,
            buckets: 1 << 10,
            ..TrainConfig::default()
        };
        let mut gazetteer = Bloom::with_capacity(8);
        gazetteer.insert("given", "eve");
        let tagger = train(&corpus, gazetteer.clone(), config, "toy", || {}).expect("trains");
        let spans = tagger.tag("call Eve now");
        assert_eq!(spans.len(), 1, "{spans:?}");
        assert_eq!((spans[0].start, spans[0].end), (5, 8));
        assert_eq!(
            train(&[], gazetteer, config, "none", || {}),
            Err(TaggerError::NoExamples)
        );
    }

    #[test]
    fn bloom_filter_has_no_false_negatives_and_few_false_positives() {
        let mut bloom = Bloom::with_capacity(1000);
        for i in 0..1000 {
            bloom.insert("given", &format!("name{i}"));
        }
        assert!((0..1000).all(|i| bloom.contains("given", &format!("name{i}"))));
        assert!(!bloom.contains("city", "name1"), "classes are kept apart");
        let false_positives = (0..10_000)
            .filter(|i| bloom.contains("given", &format!("other{i}")))
            .count();
        assert!(false_positives < 300, "{false_positives} of 10000");
    }

    #[test]
    fn a_megabyte_of_capitalised_words_is_tagged_in_linear_time() {
        let text = "Johanna Kessler of Springfield, ".repeat((1 << 20) / 32);
        let started = std::time::Instant::now();
        let spans = bundled().expect("loads").tag(&text);
        assert!(!spans.is_empty());
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn other_scripts_are_left_to_their_own_scanners() {
        assert!(tagged("저는 이서연입니다. Москва — столица.").is_empty());
    }
}
