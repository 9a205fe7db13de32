//! Person names from compact lists (`data/names/`, see its PROVENANCE): an English given
//! name followed by a capitalised surname needs no cue ("… and Maria Lopez said …"), and a
//! Chinese name after a cue or before an honorific must start with a known surname (so
//! "帮我叫一辆车" holds no name after "我叫").

use std::collections::HashSet;
use std::sync::OnceLock;

use super::kinds::{EntityKind, Span};

const GIVEN_EN: &str = include_str!("../../data/names/given-en.txt");
const SURNAMES_EN: &str = include_str!("../../data/names/surnames-en.txt");
const SURNAMES_ZH: &str = include_str!("../../data/names/surnames-zh.txt");

/// Given names that are also common words, months or places ("Will", "May", "Virginia"):
/// they count only before a listed surname.
const AMBIGUOUS_GIVEN: &[&str] = &[
    "will",
    "may",
    "june",
    "april",
    "august",
    "rose",
    "grace",
    "mark",
    "bill",
    "art",
    "hope",
    "joy",
    "faith",
    "ray",
    "dean",
    "guy",
    "frank",
    "hunter",
    "pat",
    "sue",
    "jean",
    "dawn",
    "holly",
    "ivy",
    "lily",
    "ruby",
    "pearl",
    "amber",
    "crystal",
    "robin",
    "jack",
    "gene",
    "lance",
    "miles",
    "olive",
    "christian",
    "dale",
    "glen",
    "iris",
    "violet",
    "daisy",
    "heather",
    "jasmine",
    "ginger",
    "sandy",
    "earl",
    "virginia",
    "georgia",
    "carolina",
    "paris",
    "sydney",
    "austin",
    "dallas",
    "jordan",
    "florence",
    "victoria",
    "chelsea",
    "don",
    "van",
    "king",
    "major",
    "summer",
    "autumn",
    "angel",
    "destiny",
    "harmony",
    "precious",
    "charity",
];

/// Capitalised words that follow a given name in the names of places and organisations
/// ("Virginia Beach", "Grace Hospital"), never as a surname here.
const NOT_SURNAMES: &[&str] = &[
    "street",
    "avenue",
    "road",
    "city",
    "county",
    "state",
    "university",
    "college",
    "school",
    "hospital",
    "park",
    "river",
    "lake",
    "bay",
    "hill",
    "hills",
    "hall",
    "church",
    "bank",
    "center",
    "centre",
    "valley",
    "beach",
    "island",
    "mountain",
    "airport",
    "station",
    "company",
    "group",
    "day",
    "house",
    "club",
    "garden",
    "gardens",
    "square",
    "bridge",
    "court",
    "library",
    "museum",
    "institute",
    "foundation",
    "press",
    "hotel",
    "tower",
    "north",
    "south",
    "east",
    "west",
    "new",
    "the",
    "and",
    "of",
];

struct Lists {
    given_en: HashSet<&'static str>,
    surnames_en: HashSet<&'static str>,
    surnames_zh: HashSet<&'static str>,
}

fn lists() -> &'static Lists {
    static LISTS: OnceLock<Lists> = OnceLock::new();
    LISTS.get_or_init(|| {
        let set = |text: &'static str| {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect()
        };
        Lists {
            given_en: set(GIVEN_EN),
            surnames_en: set(SURNAMES_EN),
            surnames_zh: set(SURNAMES_ZH),
        }
    })
}

/// The length in bytes of the Chinese surname that starts `text` (compound surnames such as
/// 欧阳 first), or `None` when it starts with no listed surname. 小/老/阿 before a name
/// ("小明", "老王") count as its start too.
pub fn zh_surname_len(text: &str) -> Option<usize> {
    let mut chars = text.char_indices();
    let (_, first) = chars.next()?;
    let two_end = chars.next().map(|(i, c)| i + c.len_utf8());
    if let Some(end) = two_end
        && lists().surnames_zh.contains(&text[..end])
    {
        return Some(end);
    }
    let one = first.len_utf8();
    (lists().surnames_zh.contains(&text[..one]) || matches!(first, '小' | '老' | '阿'))
        .then_some(one)
}

/// Adds English "Given Surname" pairs (with an optional middle initial) to `spans`.
pub fn detect(text: &str, spans: &mut Vec<Span>) {
    // ASCII lower-casing keeps byte offsets.
    let lower = text.to_ascii_lowercase();
    let b = text.as_bytes();
    let lists = lists();
    let mut words = Words { b, i: 0 };
    let mut prev: Option<(usize, usize)> = None;
    while let Some((start, end)) = words.next() {
        let Some((g_start, g_end)) = prev.take() else {
            prev = Some((start, end));
            continue;
        };
        prev = Some((start, end));
        let given = &lower[g_start..g_end];
        if !capitalised(&b[g_start..g_end]) || !lists.given_en.contains(given) {
            continue;
        }
        // Only a single space, or a middle initial ("John F. Kennedy"), between the two.
        if &b[g_end..start] != b" " {
            continue;
        }
        let (s_start, s_end) = match middle_initial(b, start, end, &mut words) {
            Some(next) => {
                prev = Some(next);
                next
            }
            None => (start, end),
        };
        let surname = &lower[s_start..s_end];
        if !capitalised(&b[s_start..s_end]) || NOT_SURNAMES.contains(&surname) {
            continue;
        }
        let listed = lists.surnames_en.contains(surname);
        if !listed && AMBIGUOUS_GIVEN.contains(&given) {
            continue;
        }
        spans.push(Span {
            kind: EntityKind::PersonName,
            start: g_start,
            end: s_end,
            confidence: if listed { 0.8 } else { 0.6 },
        });
    }
}

/// When the word at `start..end` is a single capital followed by ". " and a word, that word.
fn middle_initial(b: &[u8], start: usize, end: usize, words: &mut Words) -> Option<(usize, usize)> {
    if end - start != 1 || b.get(end) != Some(&b'.') || b.get(end + 1) != Some(&b' ') {
        return None;
    }
    let next = words.next()?;
    (next.0 == end + 2).then_some(next)
}

/// A word starting with a capital and going on in lower case ("Maria", "O'Brien", "Smith-Jones").
fn capitalised(word: &[u8]) -> bool {
    word.len() >= 2
        && word[0].is_ascii_uppercase()
        && word[1..]
            .iter()
            .all(|c| c.is_ascii_lowercase() || matches!(c, b'\'' | b'-') || c.is_ascii_uppercase())
        && word[1..].iter().any(u8::is_ascii_lowercase)
}

/// The ASCII words of a text (letters, inner apostrophes and hyphens), as byte ranges.
struct Words<'a> {
    b: &'a [u8],
    i: usize,
}

impl Iterator for Words<'_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        let b = self.b;
        loop {
            while self.i < b.len() && !b[self.i].is_ascii_alphabetic() {
                self.i += 1;
            }
            if self.i >= b.len() {
                return None;
            }
            let start = self.i;
            while self.i < b.len()
                && (b[self.i].is_ascii_alphabetic()
                    || (matches!(b[self.i], b'\'' | b'-')
                        && b.get(self.i + 1).is_some_and(u8::is_ascii_alphabetic)))
            {
                self.i += 1;
            }
            // A word glued to non-ASCII letters ("Müller") is not an ASCII word; skipped in
            // a loop, not by recursion, so a hostile megabyte of them cannot exhaust the stack.
            let glued =
                b.get(self.i).is_some_and(|c| *c >= 0x80) || (start > 0 && b[start - 1] >= 0x80);
            if !glued {
                return Some((start, self.i));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::pii::{self, EntityKind};

    fn names(text: &str) -> Vec<String> {
        pii::texts_of(text, EntityKind::PersonName)
    }

    #[test]
    fn english_given_name_and_surname_without_a_cue() {
        assert_eq!(
            names("Yesterday Maria Lopez and John F. Kennedy met Priya."),
            ["Maria Lopez", "John F. Kennedy"]
        );
        // An unlisted surname after an unambiguous given name still counts.
        assert_eq!(
            names("Please ask Jennifer Okonkwo-Adeyemi."),
            ["Jennifer Okonkwo-Adeyemi"]
        );
        // Word-like given names count only before a listed surname.
        assert_eq!(names("Grace Lee starred in it."), ["Grace Lee"]);
        assert!(names("Grace Period applies.").is_empty());
        assert!(names("Mark Twain is read in school.").is_empty());
    }

    #[test]
    fn places_organisations_and_lower_case_are_not_names() {
        assert!(names("We drove to Virginia Beach and Grace Hospital.").is_empty());
        assert!(names("In May Microsoft shipped it.").is_empty());
        assert!(names("mary smith wrote in lower case").is_empty());
        // Words glued to non-ASCII letters are skipped without recursion: a megabyte of them
        // would otherwise overflow the stack.
        assert!(names(&"aé".repeat(500_000)).is_empty());
        assert!(names("The Paris Agreement and New York.").is_empty());
    }

    #[test]
    fn chinese_cues_need_a_surname() {
        assert!(names("帮我叫一辆去机场的出租车。").is_empty());
        assert!(names("患者继续服用阿莫西林。").is_empty());
        assert!(names("给我的老师写一封感谢信。").is_empty());
        assert_eq!(names("认识你很高兴，我叫小明。"), ["小明"]);
        assert_eq!(names("我叫王小明。"), ["王小明"]);
        assert_eq!(names("患者张伟今天复诊。"), ["张伟"]);
        assert_eq!(names("欢迎欧阳娜娜女士。"), ["欧阳娜娜"]);
        assert_eq!(names("感谢李先生的帮助。"), ["李"]);
        assert_eq!(names("请联系张伟先生。"), ["张伟"]);
    }
}
