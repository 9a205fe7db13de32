//! Personal data that only context reveals: a person's name after a cue ("my name is",
//! "je m'appelle", "Frau", "Dr.", "患者", "先生"), a date of birth after "born on",
//! "geboren am" or "出生日期", and a first-person medical disclosure ("I was diagnosed
//! with", "我患有"). The cues are literals found in one pass (Aho-Corasick) and each
//! look-around is bounded, so the scan stays linear.

use std::sync::OnceLock;

use aho_corasick::AhoCorasick;

use crate::pii::{EntityKind, Span};
use crate::pii_names::zh_surname_len;

/// Cues in Latin-script languages (English, French, Spanish, German, Italian) after which
/// one to three capitalised words are a name.
const NAME_CUES_LATIN: &[&str] = &[
    "my name is ",
    "je m'appelle ",
    "mon nom est ",
    "me llamo ",
    "mi nombre es ",
    "ich heiße ",
    "ich heisse ",
    "mein name ist ",
    "mi chiamo ",
    "herr ",
    "frau ",
    "mme ",
    "sr. ",
    "sra. ",
    "name: ",
    "dr. ",
    "mr. ",
    "mrs. ",
    "ms. ",
    "prof. ",
    "patient ",
    "regards,\n",
    "sincerely,\n",
    "signed,\n",
    "best,\n",
];
/// Chinese cues after which two or three Han characters are a name.
const NAME_CUES_ZH: &[&str] = &["我叫", "我的名字是", "姓名：", "姓名:", "患者"];
/// Chinese honorifics that follow a name.
const HONORIFICS_ZH: &[&str] = &["先生", "女士", "小姐", "医生", "老师"];
/// Cues before a date of birth.
const DOB_CUES: &[&str] = &[
    "date of birth",
    "born on",
    "dob",
    "birthday is",
    "birth date",
    "出生日期",
    "出生于",
    "生日是",
    "生日：",
    "geboren am",
    "geburtsdatum",
    "né le",
    "née le",
    "date de naissance",
    "fecha de nacimiento",
    "nacido el",
    "nacida el",
    "data di nascita",
    "nato il",
    "nata il",
];
/// Cues before a passport number.
const PASSPORT_CUES: &[&str] = &[
    "passport no",
    "passport number",
    "passport #",
    "passport:",
    "passport",
    "护照号码",
    "护照号",
    "护照",
];

/// First-person or patient phrases that make the health details after them personal.
const MEDICAL_CUES: &[&str] = &[
    "i was diagnosed",
    "i've been diagnosed",
    "i have been diagnosed",
    "i am diagnosed",
    "my diagnosis",
    "my medication",
    "my prescription",
    "my doctor prescribed",
    "my blood test",
    "my hiv",
    "i am hiv",
    "i'm hiv",
    "my therapist",
    "我被诊断",
    "我患有",
    "我的病历",
    "我确诊",
    "我在服用",
    "我得了",
];

/// What a cue announces.
#[derive(Clone, Copy)]
enum Cue {
    Name,
    NameZh,
    Honorific,
    DateOfBirth,
    Passport,
    Medical,
}

/// Every cue in one automaton, so the text is read once however many cues there are.
fn cues() -> &'static (AhoCorasick, Vec<Cue>) {
    static CUES: OnceLock<(AhoCorasick, Vec<Cue>)> = OnceLock::new();
    CUES.get_or_init(|| {
        let groups: [(&[&str], Cue); 6] = [
            (NAME_CUES_LATIN, Cue::Name),
            (NAME_CUES_ZH, Cue::NameZh),
            (HONORIFICS_ZH, Cue::Honorific),
            (DOB_CUES, Cue::DateOfBirth),
            (PASSPORT_CUES, Cue::Passport),
            (MEDICAL_CUES, Cue::Medical),
        ];
        let patterns: Vec<&str> = groups.iter().flat_map(|(p, _)| p.iter().copied()).collect();
        let kinds = groups
            .iter()
            .flat_map(|(p, k)| std::iter::repeat_n(*k, p.len()))
            .collect();
        let automaton = AhoCorasick::new(patterns).expect("the cue literals build an automaton");
        (automaton, kinds)
    })
}

/// Adds the context-cued entities of `text` to `spans`.
pub fn detect(text: &str, spans: &mut Vec<Span>) {
    // ASCII lower-casing keeps every byte offset, so positions found in `lower` are
    // positions in `text`; the cues are lower case (Han has no case).
    let lower = text.to_ascii_lowercase();
    let (automaton, kinds) = cues();
    // Overlapping: "passport" and "passport number" both start where one cue does.
    for m in automaton.find_overlapping_iter(&lower) {
        let (i, after) = (m.start(), m.end());
        match kinds[m.pattern().as_usize()] {
            Cue::Name => {
                if let Some(end) = capitalised_words(text, after) {
                    push(spans, EntityKind::PersonName, after, end, 0.75);
                }
            }
            Cue::NameZh => {
                if let Some(end) = zh_name_after(text, after) {
                    push(spans, EntityKind::PersonName, after, end, 0.7);
                }
            }
            Cue::Honorific => {
                if let Some(start) = zh_name_before(text, i) {
                    push(spans, EntityKind::PersonName, start, i, 0.6);
                }
            }
            Cue::DateOfBirth => {
                if let Some((start, end)) = date_after(text, after) {
                    push(spans, EntityKind::DateOfBirth, start, end, 0.85);
                }
            }
            Cue::Passport => {
                if let Some((start, end)) = passport_after(text, after) {
                    push(spans, EntityKind::Passport, start, end, 0.8);
                }
            }
            Cue::Medical => {
                // The disclosure: the cue and the rest of its clause.
                push(
                    spans,
                    EntityKind::MedicalContext,
                    i,
                    clause_end(text, after),
                    0.7,
                );
            }
        }
    }
}

fn push(spans: &mut Vec<Span>, kind: EntityKind, start: usize, end: usize, confidence: f32) {
    spans.push(Span {
        kind,
        start,
        end,
        confidence,
    });
}

/// The end of one to three consecutive capitalised words starting at `at`.
fn capitalised_words(text: &str, at: usize) -> Option<usize> {
    let b = text.as_bytes();
    let mut end = None;
    let mut i = at;
    for _ in 0..3 {
        if !b.get(i).is_some_and(u8::is_ascii_uppercase) {
            break;
        }
        let mut j = i + 1;
        // Bytes of non-ASCII letters continue a word ("José", "Müller").
        while b
            .get(j)
            .is_some_and(|c| c.is_ascii_lowercase() || *c == b'\'' || *c == b'-' || *c >= 0x80)
        {
            j += 1;
        }
        if j - i < 2 {
            break;
        }
        end = Some(j);
        if b.get(j) == Some(&b' ') {
            i = j + 1;
        } else {
            break;
        }
    }
    end
}

/// The end of a Chinese name starting at `at`: a listed surname (or 小/老/阿), then one given
/// character, or two when the name is followed by something other than Han characters
/// ("我叫王小明。"); a third character taken wrongly would swallow the next word ("张伟今天").
fn zh_name_after(text: &str, at: usize) -> Option<usize> {
    let rest = text.get(at..)?;
    let surname = zh_surname_len(rest)?;
    let mut given = rest[surname..].chars();
    let first = given.next().filter(|c| is_han(*c))?;
    let mut end = at + surname + first.len_utf8();
    if let Some(second) = given.next().filter(|c| is_han(*c))
        && !given.next().is_some_and(is_han)
    {
        end += second.len_utf8();
    }
    Some(end)
}

/// The start of a Chinese name ending at `at` (before an honorific): the shortest run of one
/// to three Han characters that starts with a listed surname, widened to a compound surname
/// ("欧阳娜娜女士") when the character before completes one.
fn zh_name_before(text: &str, at: usize) -> Option<usize> {
    let head = text.get(..at)?;
    let mut start = at;
    for c in head.chars().rev().take(3) {
        if !is_han(c) {
            break;
        }
        start -= c.len_utf8();
        if zh_surname_len(&text[start..]).is_some() {
            if let Some(before) = text[..start].chars().next_back()
                && zh_surname_len(&text[start - before.len_utf8()..])
                    .is_some_and(|n| n > before.len_utf8())
            {
                start -= before.len_utf8();
            }
            return Some(start);
        }
    }
    None
}

fn is_han(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF)
}

const MONTHS: &[&str] = &[
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];

/// A date starting within a few separator bytes of `at`: digits with `-./` or spaces, month
/// names, 年月日; at least four digits, at most 24 bytes.
fn date_after(text: &str, at: usize) -> Option<(usize, usize)> {
    let rest = text.get(at..)?;
    let skip = rest
        .char_indices()
        .take(8)
        .find(|(_, c)| c.is_ascii_alphanumeric())
        .map(|(i, _)| i)?;
    let start = at + skip;
    let tail = text.get(start..)?;
    let lower_tail: String = tail
        .chars()
        .take(24)
        .collect::<String>()
        .to_ascii_lowercase();
    let (mut end, mut digits) = (start, 0);
    let mut chars = tail.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if i >= 24 {
            break;
        }
        if c.is_ascii_digit() {
            digits += 1;
            end = start + i + 1;
        } else if matches!(c, '-' | '/' | '.' | ',' | ' ') {
            continue;
        } else if matches!(c, '年' | '月' | '日') {
            end = start + i + c.len_utf8();
        } else if c.is_ascii_alphabetic() {
            let word_start = i;
            let mut word_end = i + 1;
            while let Some(&(j, d)) = chars.peek() {
                if !d.is_ascii_alphabetic() {
                    break;
                }
                word_end = j + 1;
                chars.next();
            }
            let word = lower_tail.get(word_start..word_end.min(lower_tail.len()));
            if word.is_some_and(|w| MONTHS.iter().any(|m| w.starts_with(m))) {
                end = start + word_end;
            } else {
                break;
            }
        } else {
            break;
        }
    }
    (digits >= 4).then_some((start, end))
}

/// A passport-like id among the first words after a cue: 6 to 9 letters and digits, at
/// least five of them digits (most national formats: `X1234567`, `E12345678`, `123456789`).
fn passport_after(text: &str, at: usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    // The cue must end a word ("passport", not "passports").
    if b.get(at).is_some_and(u8::is_ascii_alphanumeric) {
        return None;
    }
    // The first three words within 32 bytes ("number is E12345678").
    let limit = (at + 32).min(b.len());
    let mut i = at;
    for _ in 0..3 {
        while i < limit && !b[i].is_ascii_alphanumeric() {
            i += 1;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_alphanumeric() {
            i += 1;
        }
        if start >= limit {
            return None;
        }
        let digits = b[start..i].iter().filter(|c| c.is_ascii_digit()).count();
        if (6..=9).contains(&(i - start)) && digits >= 5 {
            return Some((start, i));
        }
    }
    None
}

/// The end of the clause that starts at `at`: the next sentence mark, newline or 80 bytes.
fn clause_end(text: &str, at: usize) -> usize {
    let Some(rest) = text.get(at..) else {
        return at;
    };
    rest.char_indices()
        .find(|&(i, c)| i >= 80 || matches!(c, '.' | '!' | '?' | '\n' | '。' | '！' | '？' | ';'))
        .map_or(text.len(), |(i, _)| at + i)
}

#[cfg(test)]
mod tests {
    use crate::pii::{self, EntityKind};

    fn found(text: &str) -> Vec<(EntityKind, String)> {
        pii::detect(text)
            .into_iter()
            .map(|s| (s.kind, text[s.start..s.end].to_owned()))
            .collect()
    }

    #[test]
    fn names_after_cues_in_english_and_chinese() {
        assert_eq!(
            found("Hello, my name is Maria Lopez and I need help."),
            vec![(EntityKind::PersonName, "Maria Lopez".into())]
        );
        assert_eq!(
            found("Please forward this to Dr. Okafor today."),
            vec![(EntityKind::PersonName, "Okafor".into())]
        );
        assert_eq!(
            found("Thanks for the update.\nBest regards,\nJonas Weber"),
            vec![(EntityKind::PersonName, "Jonas Weber".into())]
        );
        assert_eq!(
            found("患者张伟今天复诊。"),
            vec![(EntityKind::PersonName, "张伟".into())]
        );
        assert_eq!(
            found("请转告王先生。"),
            vec![(EntityKind::PersonName, "王".into())]
        );
        assert_eq!(
            found("Bonjour, je m'appelle José Müller."),
            vec![(EntityKind::PersonName, "José Müller".into())]
        );
        assert_eq!(
            found("Sehr geehrte Frau Schneider,"),
            vec![(EntityKind::PersonName, "Schneider".into())]
        );
        assert_eq!(
            found("Hola, me llamo Lucía y necesito ayuda."),
            vec![(EntityKind::PersonName, "Lucía".into())]
        );
        // A cue with nothing name-like after it is nothing.
        assert!(found("my name is not important").is_empty());
    }

    #[test]
    fn dates_of_birth_need_their_context() {
        assert_eq!(
            found("My date of birth: 12/05/1990, please update it."),
            vec![(EntityKind::DateOfBirth, "12/05/1990".into())]
        );
        assert_eq!(
            found("I was born on May 12, 1990 in Lyon."),
            vec![(EntityKind::DateOfBirth, "May 12, 1990".into())]
        );
        assert_eq!(
            found("出生日期：1990年5月12日"),
            vec![(EntityKind::DateOfBirth, "1990年5月12日".into())]
        );
        assert_eq!(
            found("Ich bin geboren am 12.05.1990 in Köln."),
            vec![(EntityKind::DateOfBirth, "12.05.1990".into())]
        );
        assert_eq!(
            found("Fecha de nacimiento: 3/7/1985"),
            vec![(EntityKind::DateOfBirth, "3/7/1985".into())]
        );
        // A date without a birth cue is just a date.
        assert!(found("The meeting is on 12/05/2025.").is_empty());
    }

    #[test]
    fn first_person_medical_disclosures_but_not_general_questions() {
        let f = found("Last year I was diagnosed with type 2 diabetes. What should I eat?");
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].0, EntityKind::MedicalContext);
        assert!(f[0].1.contains("diabetes"));
        assert_eq!(
            found("我患有高血压，能喝咖啡吗？")[0].0,
            EntityKind::MedicalContext
        );
        assert!(found("What is type 2 diabetes?").is_empty());
    }

    #[test]
    fn passports_after_their_cue() {
        assert_eq!(
            found("My passport number is E12345678, expiring 2030."),
            vec![(EntityKind::Passport, "E12345678".into())]
        );
        assert_eq!(found("护照号码：G12345678")[0].0, EntityKind::Passport);
        assert!(found("Do I need a passport for Canada?").is_empty());
        assert!(found("passport photo size 35x45").is_empty());
    }

    #[test]
    fn cue_scanning_stays_linear_on_a_hostile_megabyte() {
        // Every cue occurrence costs a bounded look-ahead, so this finishes like any
        // megabyte (the suite would time out on backtracking).
        let hostile = "my name is ".repeat(100_000) + &"出生日期".repeat(50_000);
        assert!(pii::detect(&hostile).is_empty());
    }
}
