//! What the tagger sees of each word: its shape, its gazetteer classes and its neighbours,
//! hashed into feature buckets.

use std::sync::OnceLock;

use super::{Bloom, GAZETTEER_CLASSES, Token};

/// The gazetteer classes `name` belongs to, as flag letters ("gs": a given name and a
/// surname), or "-".
pub(super) fn gazetteer_flags(gazetteer: &Bloom, name: &str) -> &'static str {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..1usize << GAZETTEER_CLASSES.len())
            .map(|mask| {
                let flags: String = GAZETTEER_CLASSES
                    .iter()
                    .enumerate()
                    .filter(|(bit, _)| mask & (1 << bit) != 0)
                    .map(|(_, (_, flag))| *flag)
                    .collect();
                if flags.is_empty() { "-".into() } else { flags }
            })
            .collect()
    });
    let mask = GAZETTEER_CLASSES
        .iter()
        .enumerate()
        .filter(|(_, (class, _))| gazetteer.contains(class, name))
        .fold(0, |m, (bit, _)| m | 1 << bit);
    &names[mask]
}

/// A word's shape: upper case → `X`, lower → `x`, digit → `d`, others kept, repeats
/// collapsed ("Kessler" → "Xx", "O'Neil" → "X'Xx", "62704" → "d").
pub(super) fn shape(word: &str) -> String {
    let mut out = String::new();
    for c in word.chars() {
        let s = if c.is_uppercase() {
            'X'
        } else if c.is_lowercase() || c.is_alphabetic() {
            'x'
        } else if c.is_numeric() {
            'd'
        } else {
            c
        };
        if !out.ends_with(s) {
            out.push(s);
        }
    }
    out
}

/// Where the word's own identity features sit in `features`' output (after the bias).
pub(super) const IDENTITY: std::ops::Range<usize> = 1..5;

/// Where the neighbouring words' features sit.
pub(super) const CONTEXT: std::ops::Range<usize> = 5..12;

/// What the features read of one token, computed once per text.
pub(super) struct Word {
    pub(super) lower: String,
    pub(super) shape: String,
    /// Gazetteer flags as letters, "-" when none, "l" for a lower-case word.
    pub(super) gaz: &'static str,
    pub(super) sentence_start: bool,
    /// This word and the next name a place of two words ("New York", "Cape Town").
    pub(super) place_with_next: bool,
    /// May carry an entity tag at all: Latin script (the tagger was trained on it; other
    /// scripts have their own scanners).
    pub(super) may_tag: bool,
    /// Letters or digits, not punctuation: only a word begins an entity.
    pub(super) is_word: bool,
    /// Title case in Latin script ([`is_title_case`]): what a segment is anchored on.
    pub(super) title_case: bool,
    /// May begin a name, place or organisation: a capitalised word, a number ("3M"), or a
    /// short lower-case particle or title ("van der Berg", "pani Szoka"), never a longer
    /// lower-case word ("beginner, Python", "mother-in-law Dolores").
    pub(super) may_begin_name: bool,
    /// May continue an entity: a word, or punctuation that entities hold ("Smith & Co",
    /// "Apt. 4", "Kessler-Wolf"), never a sentence's end.
    pub(super) may_continue: bool,
}

impl Word {
    /// A token far from any title-case word, which decoding never reads.
    pub(super) fn unread() -> Word {
        Word {
            lower: String::new(),
            shape: String::new(),
            gaz: "-",
            sentence_start: false,
            place_with_next: false,
            may_tag: false,
            is_word: false,
            title_case: false,
            may_begin_name: false,
            may_continue: false,
        }
    }
}

pub(super) fn is_latin(c: char) -> bool {
    !c.is_alphabetic() || (c as u32) < 0x250 || ('\u{1e00}'..='\u{1eff}').contains(&c)
}

/// Whether a word anchors a segment (see [`segments`](super::segments)): title case ("Kessler", "McDonald",
/// shape "Xx…") in Latin script, read off the raw word so that tokens far from any anchor
/// need no other facts.
pub(super) fn is_title_case(raw: &str) -> bool {
    let after_capitals = raw.chars().find(|c| !c.is_uppercase());
    raw.starts_with(|c: char| c.is_uppercase() && c.is_alphanumeric())
        && after_capitals.is_some_and(|c| c.is_lowercase() || c.is_alphabetic())
        && raw.chars().all(is_latin)
}

/// Which tokens [`decode`](super::Tagger::tag) reads: those a segment holds and the neighbours its
/// features look at (two either side, and one more for their own neighbours' facts).
pub(super) fn near_title_case(text: &str, tokens: &[Token]) -> Vec<bool> {
    const RADIUS: usize = 2 + 3;
    let mut near = vec![false; tokens.len()];
    for (i, t) in tokens.iter().enumerate() {
        if is_title_case(&text[t.start..t.end]) {
            let end = (i + RADIUS + 1).min(tokens.len());
            near[i.saturating_sub(RADIUS)..end].fill(true);
        }
    }
    near
}

/// The per-token facts of `tokens` that the features combine. Decoding reads only the
/// tokens `near` marks (the rest stand in as punctuation that no feature reads); training
/// reads every token.
pub(super) fn words(
    text: &str,
    tokens: &[Token],
    gazetteer: &Bloom,
    near: Option<&[bool]>,
) -> Vec<Word> {
    let mut out: Vec<Word> = Vec::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if near.is_some_and(|n| !n[i]) {
            out.push(Word::unread());
            continue;
        }
        let raw = &text[t.start..t.end];
        let lower = raw.to_lowercase();
        let is_word = raw.chars().next().is_some_and(char::is_alphanumeric);
        let after_short_word =
            i > 0 && out[i - 1].lower.chars().count() <= 4 && out[i - 1].shape != "d";
        let prev = out.last();
        let sentence_start = prev.is_none()
            || t.line_start
            || prev.is_some_and(|p| matches!(p.lower.as_str(), "." | "!" | "?" | ":" | "\"" | "("));
        out.push(Word {
            shape: shape(raw),
            // Names, places and organisations are capitalised: a lower-case word is not looked
            // up, which keeps the filter's probes to the few words that matter.
            gaz: if raw.starts_with(char::is_uppercase) {
                gazetteer_flags(gazetteer, &lower)
            } else {
                "l"
            },
            sentence_start,
            place_with_next: false,
            may_tag: raw.chars().all(is_latin),
            is_word,
            title_case: is_title_case(raw),
            may_begin_name: is_word
                && (raw.starts_with(|c: char| c.is_uppercase() || c.is_numeric())
                    || raw.chars().count() <= 4),
            may_continue: is_word
                || matches!(raw, "," | "&" | "'" | "’" | "-" | "/" | "#" | "(" | ")")
                || (raw == "." && after_short_word),
            lower,
        });
    }
    for i in 1..out.len() {
        let capitalised = |w: &Word| w.shape.starts_with('X');
        if capitalised(&out[i - 1]) && capitalised(&out[i]) {
            let pair = format!("{} {}", out[i - 1].lower, out[i].lower);
            out[i - 1].place_with_next =
                gazetteer.contains("city", &pair) || gazetteer.contains("country", &pair);
        }
    }
    out
}

/// FNV-1a of a feature's template name and its parts joined by `|`, in `buckets`.
pub(super) fn hash_parts(template: &str, parts: &[&str], buckets: usize) -> u32 {
    let step = |h: u64, b: u8| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    let mut h = template.bytes().fold(0xcbf2_9ce4_8422_2325, step);
    for part in parts {
        h = part.bytes().fold(step(h, b'|'), step);
    }
    (h as usize & (buckets - 1)) as u32
}

/// The hashed features of token `i`, written to `out`.
pub(super) fn features(words: &[Word], i: usize, buckets: usize, out: &mut Vec<u32>) {
    out.clear();
    let at = |k: isize| {
        usize::try_from(i as isize + k)
            .ok()
            .and_then(|k| words.get(k))
    };
    let lower = |k: isize| at(k).map_or(if k < 0 { "<s>" } else { "</s>" }, |w| w.lower.as_str());
    let shape_at =
        |k: isize| at(k).map_or(if k < 0 { "<s>" } else { "</s>" }, |w| w.shape.as_str());
    let gaz_at = |k: isize| at(k).map_or("<>", |w| w.gaz);
    let w = &words[i];
    let lw = w.lower.as_str();
    let n_chars = lw.chars().count();
    let from_end = |n: usize| {
        lw.char_indices()
            .nth(n_chars.saturating_sub(n))
            .map_or(0, |c| c.0)
    };
    let head_end = lw.char_indices().nth(3).map_or(lw.len(), |c| c.0);
    let sh = w.shape.as_str();
    let (p1, n1) = (lower(-1), lower(1));
    let start = if w.sentence_start { "1" } else { "0" };
    let place = |b: bool| if b { "1" } else { "0" };
    let in_place2 = [
        place(at(-1).is_some_and(|p| p.place_with_next)),
        place(w.place_with_next),
    ];
    const LENGTHS: [&str; 13] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12",
    ];
    let len = LENGTHS[n_chars.min(12)];
    // Order matters to training's dropout: identity features first, then context.
    let parts: [(&str, &[&str]); 20] = [
        ("bias", &[]),
        ("w", &[lw]),
        ("suf3", &[&lw[from_end(3)..]]),
        ("suf2", &[&lw[from_end(2)..]]),
        ("pre3", &[&lw[..head_end]]),
        ("p1", &[p1]),
        ("n1", &[n1]),
        ("p2", &[lower(-2)]),
        ("n2", &[lower(2)]),
        ("p1sh", &[p1, sh]),
        ("n1sh", &[sh, n1]),
        ("gazn", &[gaz_at(-1), gaz_at(1)]),
        ("sh", &[sh]),
        ("shp", &[shape_at(-1)]),
        ("shn", &[shape_at(1)]),
        ("sh3", &[shape_at(-1), sh, shape_at(1)]),
        ("start", &[start, sh]),
        ("len", &[len]),
        ("gaz", &[w.gaz, sh]),
        ("place2", &in_place2),
    ];
    out.extend(parts.iter().map(|(t, p)| hash_parts(t, p, buckets)));
}
