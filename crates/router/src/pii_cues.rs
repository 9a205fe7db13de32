//! Personal data that only context reveals: a person's name after a cue ("my name is",
//! "Dr.", "患者", "先生"), a date of birth after "born on" or "出生日期", and a first-person
//! medical disclosure ("I was diagnosed with", "我患有"). Every cue is a literal searched
//! once over the text, so the scan stays linear.

use crate::pii::{EntityKind, Span};

/// English cues after which one to three capitalised words are a name.
const NAME_CUES_EN: &[&str] = &[
    "my name is ",
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

/// Adds the context-cued entities of `text` to `spans`.
pub fn detect(text: &str, spans: &mut Vec<Span>) {
    // ASCII lower-casing keeps every byte offset, so positions found in `lower` are
    // positions in `text`.
    let lower = text.to_ascii_lowercase();
    for cue in NAME_CUES_EN {
        for (i, _) in lower.match_indices(cue) {
            if let Some(end) = capitalised_words(text, i + cue.len()) {
                push(spans, EntityKind::PersonName, i + cue.len(), end, 0.75);
            }
        }
    }
    for cue in NAME_CUES_ZH {
        for (i, _) in text.match_indices(cue) {
            let start = i + cue.len();
            // Two characters: most Chinese names are two or three, and a third taken wrongly
            // would swallow the next word ("张伟今天").
            let end = han_run(text, start, 2, 2);
            if end > start {
                push(spans, EntityKind::PersonName, start, end, 0.7);
            }
        }
    }
    for honorific in HONORIFICS_ZH {
        for (i, _) in text.match_indices(honorific) {
            // The surname right before the honorific ("王先生"); more would take in the
            // words before it.
            let start = han_run_back(text, i, 1);
            if start < i {
                push(spans, EntityKind::PersonName, start, i, 0.6);
            }
        }
    }
    for cue in DOB_CUES {
        for (i, _) in lower.match_indices(cue) {
            if let Some((start, end)) = date_after(text, i + cue.len()) {
                push(spans, EntityKind::DateOfBirth, start, end, 0.85);
            }
        }
    }
    for cue in PASSPORT_CUES {
        for (i, _) in lower.match_indices(cue) {
            if let Some((start, end)) = passport_after(text, i + cue.len()) {
                push(spans, EntityKind::Passport, start, end, 0.8);
            }
        }
    }
    for cue in MEDICAL_CUES {
        for (i, _) in lower.match_indices(cue) {
            // The disclosure: the cue and the rest of its clause.
            let end = clause_end(text, i + cue.len());
            push(spans, EntityKind::MedicalContext, i, end, 0.7);
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

/// The end of one to three consecutive capitalised ASCII words starting at `at`.
fn capitalised_words(text: &str, at: usize) -> Option<usize> {
    let b = text.as_bytes();
    let mut end = None;
    let mut i = at;
    for _ in 0..3 {
        if !b.get(i).is_some_and(u8::is_ascii_uppercase) {
            break;
        }
        let mut j = i + 1;
        while b
            .get(j)
            .is_some_and(|c| c.is_ascii_lowercase() || *c == b'\'' || *c == b'-')
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

fn is_han(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF)
}

/// The end of `min..=max` Han characters from `at` (or `at` when fewer than `min`).
fn han_run(text: &str, at: usize, min: usize, max: usize) -> usize {
    let Some(rest) = text.get(at..) else {
        return at;
    };
    let (mut n, mut end) = (0, at);
    for c in rest.chars().take(max) {
        if !is_han(c) {
            break;
        }
        n += 1;
        end += c.len_utf8();
    }
    if n >= min { end } else { at }
}

/// The start of up to `max` Han characters ending at `at`.
fn han_run_back(text: &str, at: usize, max: usize) -> usize {
    let Some(head) = text.get(..at) else {
        return at;
    };
    let mut start = at;
    for c in head.chars().rev().take(max) {
        if !is_han(c) {
            break;
        }
        start -= c.len_utf8();
    }
    start
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
