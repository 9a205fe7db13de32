//! Personal data that only context reveals: a person's name after a cue ("my name is",
//! "je m'appelle", "Frau", "Dr.", "患者", "先生", "меня зовут", "私の名前は", "제 이름은") or
//! before an honorific ("さん", "씨"), a date of birth after "born on", "geboren am",
//! "出生日期", "生年月日", "생년월일" or "дата рождения", passports, Japan's My Number after
//! its name, and a first-person medical disclosure ("I was diagnosed with", "我患有",
//! "мне поставили диагноз", "と診断されました"). The cues are literals found in one pass
//! (Aho-Corasick) and each look-around is bounded, so the scan stays linear.

use std::sync::OnceLock;

use aho_corasick::AhoCorasick;

use super::kinds::{EntityKind, Span};
use super::names::zh_surname_len;

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
/// Russian cues after which one to three capitalised words are a name. Both cases: the
/// text is lower-cased for ASCII only.
const NAME_CUES_RU: &[&str] = &[
    "меня зовут ",
    "Меня зовут ",
    "моё имя ",
    "Моё имя ",
    "мое имя ",
    "Мое имя ",
    "г-н ",
    "Г-н ",
    "г-жа ",
    "Г-жа ",
    "господин ",
    "Господин ",
    "госпожа ",
    "Госпожа ",
    "пациент ",
    "Пациент ",
    "пациентка ",
    "Пациентка ",
    "доктор ",
    "Доктор ",
    "фио: ",
    "ФИО: ",
    "С уважением,\n",
    "с уважением,\n",
];
/// Japanese cues after which a run of kanji or katakana is a name ("私の名前は田中太郎です").
const NAME_CUES_JA: &[&str] = &[
    "私の名前は",
    "名前は",
    "氏名：",
    "氏名:",
    "名前：",
    "名前:",
    "患者の",
];
/// Japanese words that follow a name: "田中さん", "佐藤様", "田中と申します".
const HONORIFICS_JA: &[&str] = &["さん", "様", "と申します", "くん", "ちゃん"];
/// Korean cues after which a listed surname and one or two syllables are a name.
const NAME_CUES_KO: &[&str] = &[
    "제 이름은 ",
    "제 이름은",
    "이름은 ",
    "이름: ",
    "성명: ",
    "성명:",
    "환자 ",
];
/// "저는 김민수입니다": the name only counts when the copula follows it.
const SELF_INTRO_KO: &[&str] = &["저는 ", "나는 "];
/// Korean honorifics after a name ("김민수 씨", "김민수님").
const HONORIFICS_KO: &[&str] = &["씨", "님"];
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
    "生年月日",
    "誕生日は",
    "생년월일",
    "생일은",
    "дата рождения",
    "Дата рождения",
    "родился ",
    "Родился ",
    "родилась ",
    "Родилась ",
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
    "パスポート番号",
    "旅券番号",
    "여권번호",
    "여권 번호",
    "паспорт",
    "Паспорт",
];
/// Cues before a driver's licence number.
const LICENCE_CUES: &[&str] = &[
    "driver's license",
    "driver's licence",
    "drivers license",
    "drivers licence",
    "driver license",
    "driver licence",
    "driving license",
    "driving licence",
    "license number",
    "licence number",
    "license no",
    "licence no",
    "dl#",
    "dl number",
    "dl no",
    "führerschein",
    "permis de conduire",
    "carnet de conducir",
    "patente di guida",
];
/// Japan's My Number by its names.
const MY_NUMBER_CUES: &[&str] = &["マイナンバー", "個人番号"];

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
    "мне поставили диагноз",
    "Мне поставили диагноз",
    "у меня диагноз",
    "У меня диагноз",
    "мой диагноз",
    "Мой диагноз",
    "я принимаю препарат",
    "Я принимаю препарат",
];
/// Cues that close a medical disclosure whose subject comes before them, as Japanese and
/// Korean word order has it ("糖尿病と診断されました", "당뇨병 진단을 받았어요"): the whole
/// clause is the disclosure.
const MEDICAL_CUES_AFTER: &[&str] = &[
    "と診断され",
    "を患って",
    "を服用して",
    "진단을 받았",
    "진단받았",
    "을 앓고",
    "를 앓고",
    "을 복용",
    "를 복용",
];

/// What a cue announces.
#[derive(Clone, Copy)]
enum Cue {
    Name,
    NameZh,
    Honorific,
    NameJa,
    HonorificJa,
    NameKo,
    SelfIntroKo,
    HonorificKo,
    DateOfBirth,
    Passport,
    DriverLicense,
    MyNumber,
    Medical,
    MedicalAfter,
}

/// Every cue in one automaton, so the text is read once however many cues there are.
fn cues() -> &'static (AhoCorasick, Vec<Cue>) {
    static CUES: OnceLock<(AhoCorasick, Vec<Cue>)> = OnceLock::new();
    CUES.get_or_init(|| {
        let groups: [(&[&str], Cue); 15] = [
            (NAME_CUES_LATIN, Cue::Name),
            (NAME_CUES_RU, Cue::Name),
            (NAME_CUES_ZH, Cue::NameZh),
            (HONORIFICS_ZH, Cue::Honorific),
            (NAME_CUES_JA, Cue::NameJa),
            (HONORIFICS_JA, Cue::HonorificJa),
            (NAME_CUES_KO, Cue::NameKo),
            (SELF_INTRO_KO, Cue::SelfIntroKo),
            (HONORIFICS_KO, Cue::HonorificKo),
            (DOB_CUES, Cue::DateOfBirth),
            (PASSPORT_CUES, Cue::Passport),
            (LICENCE_CUES, Cue::DriverLicense),
            (MY_NUMBER_CUES, Cue::MyNumber),
            (MEDICAL_CUES, Cue::Medical),
            (MEDICAL_CUES_AFTER, Cue::MedicalAfter),
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
        let cue = kinds[m.pattern().as_usize()];
        if let Some(span) = cued_span(cue, text, m.start(), m.end()) {
            spans.push(span);
        }
    }
}

/// The entity a cue at `i..after` points to; each kind has its side to look and its confidence.
fn cued_span(cue: Cue, text: &str, i: usize, after: usize) -> Option<Span> {
    let name = |start, end, confidence| span(EntityKind::PersonName, start, end, confidence);
    match cue {
        Cue::Name => capitalised_words(text, after).map(|end| name(after, end, 0.75)),
        Cue::NameZh => zh_name_after(text, after).map(|end| name(after, end, 0.7)),
        Cue::Honorific => zh_name_before(text, i).map(|start| name(start, i, 0.6)),
        Cue::NameJa => ja_name_after(text, after).map(|end| name(after, end, 0.7)),
        Cue::HonorificJa => {
            ja_name_before_honorific(text, i, after).map(|start| name(start, i, 0.6))
        }
        Cue::NameKo => ko_name_after(text, after).map(|end| name(after, end, 0.7)),
        Cue::SelfIntroKo => ko_self_introduced_name(text, after).map(|end| name(after, end, 0.65)),
        Cue::HonorificKo => {
            ko_name_before_honorific(text, i, after).map(|(start, end)| name(start, end, 0.6))
        }
        Cue::MyNumber => my_number_after(text, after)
            .map(|(start, end)| span(EntityKind::NationalId, start, end, 0.9)),
        Cue::DateOfBirth => date_after(text, after)
            .map(|(start, end)| span(EntityKind::DateOfBirth, start, end, 0.85)),
        Cue::Passport => id_after(text, after, PASSPORT_ID)
            .map(|(start, end)| span(EntityKind::Passport, start, end, 0.85)),
        Cue::DriverLicense => id_after(text, after, LICENCE_ID)
            .map(|(start, end)| span(EntityKind::DriverLicense, start, end, 0.85)),
        // The disclosure: the cue and the rest of its clause.
        Cue::Medical => Some(span(
            EntityKind::MedicalContext,
            i,
            clause_end(text, after),
            0.7,
        )),
        // The cue closes the disclosure, so the clause before it counts too.
        Cue::MedicalAfter => Some(span(
            EntityKind::MedicalContext,
            clause_start(text, i),
            clause_end(text, after),
            0.7,
        )),
    }
}

/// The name before a Japanese honorific, unless "様" is part of a word ("様子", "同様").
fn ja_name_before_honorific(text: &str, i: usize, after: usize) -> Option<usize> {
    ja_name_before(text, i).filter(|_| !(text[i..after] == *"様" && sama_is_a_word(text, i, after)))
}

/// "저는" alone is too common to cue a name, so a copula ("입니다", "라고") must follow.
fn ko_self_introduced_name(text: &str, after: usize) -> Option<usize> {
    ko_name_after(text, after).filter(|&end| {
        ["입니다", "이에요", "예요", "이라고", "라고"]
            .iter()
            .any(|copula| text[end..].starts_with(copula))
    })
}

/// The name before a Korean honorific, unless "씨" is part of a word ("날씨", "글씨").
fn ko_name_before_honorific(text: &str, i: usize, after: usize) -> Option<(usize, usize)> {
    ko_name_before(text, i).filter(|_| !(text[i..after] == *"씨" && ssi_is_a_word(text, i)))
}

/// A span built positionally, so each cue's arm in [`cued_span`] stays one expression.
fn span(kind: EntityKind, start: usize, end: usize, confidence: f32) -> Span {
    Span {
        kind,
        start,
        end,
        confidence,
    }
}

/// The end of up to `max` words starting at `at`, one space apart, each measured by `word`
/// (its length in bytes, or `None` where the run stops).
pub(super) fn word_run(
    text: &str,
    at: usize,
    max: usize,
    word: impl Fn(&str) -> Option<usize>,
) -> Option<usize> {
    let mut end = None;
    let mut i = at;
    for _ in 0..max {
        let Some(len) = text.get(i..).and_then(&word) else {
            break;
        };
        end = Some(i + len);
        if text.as_bytes().get(i + len) == Some(&b' ') {
            i += len + 1;
        } else {
            break;
        }
    }
    end
}

/// The end of one to three consecutive capitalised words starting at `at`, in any cased
/// script ("Maria Lopez", "José Müller", "Иван Петров").
fn capitalised_words(text: &str, at: usize) -> Option<usize> {
    word_run(text, at, 3, |rest| {
        let mut chars = rest.char_indices();
        let (_, first) = chars.next().filter(|(_, c)| c.is_uppercase())?;
        let len = chars
            .find(|&(_, c)| !(c.is_lowercase() || c == '\'' || c == '-'))
            .map_or(rest.len(), |(j, _)| j);
        (len > first.len_utf8()).then_some(len)
    })
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

/// Kanji, katakana and the katakana middle dot: what Japanese names are written in.
fn is_ja_name_char(c: char) -> bool {
    is_han(c) || matches!(c as u32, 0x30A1..=0x30FC)
}

/// A Japanese name of two to eight kanji or katakana starting at `at`.
fn ja_name_after(text: &str, at: usize) -> Option<usize> {
    let rest = text.get(at..)?;
    let (count, len) = rest
        .chars()
        .take_while(|c| is_ja_name_char(*c))
        .take(8)
        .fold((0, 0), |(n, l), c| (n + 1, l + c.len_utf8()));
    (count >= 2).then_some(at + len)
}

/// Nouns that take さん or 様 without being names ("お客様", "運転手さん").
const NOT_NAMES_JA: &[&str] = &[
    "皆",
    "客",
    "神",
    "王",
    "運転手",
    "店員",
    "看護師",
    "医者",
    "店長",
    "社長",
    "部長",
    "課長",
    "大家",
    "隣",
    "奥",
    "旦那",
    "母",
    "父",
    "兄",
    "姉",
    "先生",
    "患者",
    "家族",
    "屋",
];

/// A Japanese name ending at `at` (before an honorific): two to eight kanji or katakana,
/// not after お/ご (an honorific prefix makes it a noun) and not a listed common noun.
fn ja_name_before(text: &str, at: usize) -> Option<usize> {
    let head = text.get(..at)?;
    let mut start = at;
    let mut count = 0;
    for c in head.chars().rev().take(8) {
        if !is_ja_name_char(c) {
            break;
        }
        start -= c.len_utf8();
        count += 1;
    }
    let name = &text[start..at];
    let prefixed = text[..start].ends_with('お') || text[..start].ends_with('ご');
    (count >= 2 && !prefixed && !NOT_NAMES_JA.iter().any(|n| name.ends_with(n))).then_some(start)
}

/// Whether the 様 at `at..after` belongs to a word ("同様", "仕様", "様々", "様子") rather than
/// following a name.
fn sama_is_a_word(text: &str, at: usize, after: usize) -> bool {
    const BEFORE: &[char] = &[
        '同', '模', '仕', '多', '異', '今', '殿', '貴', '文', '紋', '有', '左', '然', '斯', '一',
        '両',
    ];
    const AFTER: &[char] = &['子', '々', '式', '相', '態'];
    text[..at]
        .chars()
        .next_back()
        .is_some_and(|c| BEFORE.contains(&c))
        || text[after..]
            .chars()
            .next()
            .is_some_and(|c| AFTER.contains(&c))
}

/// Whether the 씨 at `at` ends a word ("날씨" weather, "글씨" handwriting, "아저씨" uncle).
fn ssi_is_a_word(text: &str, at: usize) -> bool {
    const BEFORE: &[char] = &[
        '날', '글', '말', '솜', '맵', '저', '가', '음', '불', '꽃', '볍', '홀',
    ];
    text[..at]
        .chars()
        .next_back()
        .is_some_and(|c| BEFORE.contains(&c))
}

/// The most common Korean surnames (about nine in ten Koreans carry one of these), the
/// two-syllable ones first.
const SURNAMES_KO: &[&str] = &[
    "남궁", "황보", "제갈", "선우", "독고", "김", "이", "박", "최", "정", "강", "조", "윤", "장",
    "임", "한", "오", "서", "신", "권", "황", "안", "송", "류", "유", "전", "홍", "고", "문", "양",
    "손", "배", "백", "허", "남", "심", "노", "하", "곽", "성", "차", "주", "우", "구", "민", "진",
    "나", "지", "엄", "채", "원", "천", "방", "공", "현", "함", "변", "염", "여", "추", "도", "소",
    "석", "선", "설", "마", "길", "연", "위", "표", "명", "기", "반", "왕", "금", "옥", "육", "인",
    "맹", "제", "모", "탁", "국", "어", "은", "편", "용", "예", "경",
];

fn is_hangul(c: char) -> bool {
    matches!(c as u32, 0xAC00..=0xD7A3)
}

/// A Korean name starting at `at`: a listed surname and two given syllables (one when only
/// one Hangul syllable follows).
fn ko_name_after(text: &str, at: usize) -> Option<usize> {
    let rest = text.get(at..)?;
    let surname = SURNAMES_KO.iter().find(|s| rest.starts_with(**s))?;
    let given: Vec<char> = rest[surname.len()..]
        .chars()
        .take_while(|c| is_hangul(*c))
        .take(2)
        .collect();
    if given.is_empty() {
        return None;
    }
    Some(at + surname.len() + given.iter().map(|c| c.len_utf8()).sum::<usize>())
}

/// A Korean name ending at `at` (before 씨 or 님, perhaps after one space): a listed surname
/// and two given syllables. Two-syllable words before 님 are titles ("선생님", "고객님").
fn ko_name_before(text: &str, at: usize) -> Option<(usize, usize)> {
    let head = text.get(..at)?;
    let head = head.strip_suffix(' ').unwrap_or(head);
    let syllables: Vec<char> = head
        .chars()
        .rev()
        .take_while(|c| is_hangul(*c))
        .take(4)
        .collect();
    // Surname and two given syllables; a longer run is a word, not a name.
    for n in [3, 4] {
        if syllables.len() < n {
            break;
        }
        let start = head.len() - syllables[..n].iter().map(|c| c.len_utf8()).sum::<usize>();
        let candidate = &head[start..];
        let surname_len = SURNAMES_KO
            .iter()
            .find(|s| candidate.starts_with(**s))
            .map(|s| s.chars().count());
        let whole_word = syllables.len() == n;
        if whole_word && surname_len == Some(n - 2) {
            return Some((start, head.len()));
        }
    }
    None
}

/// A My Number after its cue: twelve digits, together or as 4-4-4, with a valid check digit.
fn my_number_after(text: &str, at: usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    let limit = (at + 24).min(b.len());
    let start = (at..limit).find(|&i| b[i].is_ascii_digit())?;
    let (mut end, mut digits) = (start, Vec::with_capacity(12));
    while end < b.len() && digits.len() < 12 {
        if b[end].is_ascii_digit() {
            digits.push(b[end]);
        } else if !(matches!(b[end], b' ' | b'-') && digits.len() % 4 == 0) {
            break;
        }
        end += 1;
    }
    let followed_by_digit = b.get(end).is_some_and(u8::is_ascii_digit);
    (!followed_by_digit && super::checks::my_number_valid(&digits)).then_some((start, end))
}

/// The first letters of months' names, lower case (English, Russian).
pub(super) const MONTHS: &[&str] = &[
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec", "янв",
    "фев", "мар", "апр", "мая", "май", "июн", "июл", "авг", "сен", "окт", "ноя", "дек",
];

/// A date starting within a few separator bytes of `at`: digits with `-./` or spaces, month
/// names (English, Russian), 年月日 or 년월일; at least four digits, at most 32 bytes.
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
        .take(32)
        .collect::<String>()
        .to_ascii_lowercase();
    let (mut end, mut digits) = (start, 0);
    let mut chars = tail.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if i >= 32 {
            break;
        }
        if c.is_ascii_digit() {
            digits += 1;
            end = start + i + 1;
        } else if matches!(c, '-' | '/' | '.' | ',' | ' ') {
            continue;
        } else if matches!(c, '年' | '月' | '日' | '년' | '월' | '일') {
            end = start + i + c.len_utf8();
        } else if c.is_alphabetic() {
            let word_start = i;
            let mut word_end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if !d.is_alphabetic() {
                    break;
                }
                word_end = j + d.len_utf8();
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

/// What an identity document's number looks like.
#[derive(Clone, Copy)]
struct IdShape {
    len: (usize, usize),
    min_digits: usize,
    /// Whether hyphens may join its parts ("A12-345-678-901").
    hyphens: bool,
}

/// Most national passport formats: `X1234567`, `E12345678`, `123456789`.
const PASSPORT_ID: IdShape = IdShape {
    len: (6, 9),
    min_digits: 5,
    hyphens: false,
};
/// US states' and other countries' licence numbers: `D1234567`, `123-456-789`,
/// `A12-345-678-901`, `MORGA753116SM9IJ`.
const LICENCE_ID: IdShape = IdShape {
    len: (5, 20),
    min_digits: 4,
    hyphens: true,
};

/// An id of `shape` among the first words after a cue ("number is E12345678").
fn id_after(text: &str, at: usize, shape: IdShape) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    // The cue must end a word ("passport", not "passports").
    if b.get(at).is_some_and(u8::is_ascii_alphanumeric) {
        return None;
    }
    let in_id = |i: usize| {
        b[i].is_ascii_alphanumeric()
            || (shape.hyphens
                && b[i] == b'-'
                && b.get(i + 1).is_some_and(u8::is_ascii_alphanumeric))
    };
    // The first three words within 32 bytes.
    let limit = (at + 32).min(b.len());
    let mut i = at;
    for _ in 0..3 {
        while i < limit && !b[i].is_ascii_alphanumeric() {
            i += 1;
        }
        let start = i;
        while i < b.len() && in_id(i) {
            i += 1;
        }
        if start >= limit {
            return None;
        }
        let digits = b[start..i].iter().filter(|c| c.is_ascii_digit()).count();
        if (shape.len.0..=shape.len.1).contains(&(i - start)) && digits >= shape.min_digits {
            return Some((start, i));
        }
    }
    None
}

/// The start of the clause that ends at `at`: after the previous sentence mark or newline,
/// at most 80 bytes back.
fn clause_start(text: &str, at: usize) -> usize {
    let Some(head) = text.get(..at) else {
        return at;
    };
    head.char_indices()
        .rev()
        .find(|&(i, c)| {
            at - i > 80
                || matches!(
                    c,
                    '.' | '!' | '?' | '\n' | '。' | '！' | '？' | ';' | '、' | '，'
                )
        })
        .map_or(0, |(i, c)| i + c.len_utf8())
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
        pii::detect_with(text, None)
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
    fn names_in_russian_japanese_and_korean() {
        let name = |text: &str| pii::texts_of(text, EntityKind::PersonName);
        assert_eq!(
            name("Здравствуйте, меня зовут Иван Петров."),
            ["Иван Петров"]
        );
        assert_eq!(
            name("Запишите к доктору: Г-жа Смирнова придёт в 5."),
            ["Смирнова"]
        );
        assert_eq!(name("私の名前は田中太郎です。"), ["田中太郎"]);
        assert_eq!(name("明日、佐藤さんに会います。"), ["佐藤"]);
        assert_eq!(name("マイク・スミス様へ"), ["マイク・スミス"]);
        assert_eq!(name("山本と申します。"), ["山本"]);
        assert_eq!(name("제 이름은 김민수입니다."), ["김민수"]);
        assert_eq!(name("저는 박지영이에요."), ["박지영"]);
        assert_eq!(name("내일 이서연 씨를 만나요."), ["이서연"]);
        assert_eq!(name("최윤아님, 주문이 완료되었습니다."), ["최윤아"]);
        // Words that take the same endings without being names.
        for text in [
            "меня зовут на работу",
            "皆さん、こんにちは。お客様へのお知らせ。",
            "たくさんの人が来ました。",
            "前回同様、システム仕様を確認してください。様々な意見があります。",
            "パン屋さんでパンを買った。",
            "선생님, 고객님께 연락했어요.",
            "오늘날씨가 좋네요. 아저씨가 왔어요.",
            "저는 이번에 서울에 가요.",
        ] {
            assert!(name(text).is_empty(), "{text}: {:?}", name(text));
        }
    }

    #[test]
    fn dates_of_birth_passports_ids_and_disclosures_beyond_latin_and_han() {
        assert_eq!(
            found("生年月日：1990年5月12日"),
            vec![(EntityKind::DateOfBirth, "1990年5月12日".into())]
        );
        assert_eq!(
            found("생년월일: 1990년 5월 12일"),
            vec![(EntityKind::DateOfBirth, "1990년 5월 12일".into())]
        );
        assert_eq!(
            found("Дата рождения: 12 мая 1990 г."),
            vec![(EntityKind::DateOfBirth, "12 мая 1990".into())]
        );
        assert_eq!(
            found("パスポート番号はTK1234567です")[0].0,
            EntityKind::Passport
        );
        assert_eq!(found("여권번호 M12345678")[0].0, EntityKind::Passport);
        for (text, id) in [
            ("My driver's license number is D1234567.", "D1234567"),
            ("driver license: A12-345-678-901", "A12-345-678-901"),
            (
                "Driving licence MORGA753116SM9IJ please",
                "MORGA753116SM9IJ",
            ),
        ] {
            assert_eq!(
                found(text),
                vec![(EntityKind::DriverLicense, id.into())],
                "{text}"
            );
        }
        assert!(found("my driver's license expired").is_empty());
        // A cued licence number is a licence, not the phone its digits could also be.
        assert_eq!(
            found("My driver's license number is 493909266."),
            vec![(EntityKind::DriverLicense, "493909266".into())]
        );
        assert_eq!(
            found("Паспорт: серия 4509 номер 123456"),
            vec![(EntityKind::Passport, "123456".into())]
        );
        assert_eq!(
            found("マイナンバーは1234 5678 9018です"),
            vec![(EntityKind::NationalId, "1234 5678 9018".into())]
        );
        assert!(
            found("マイナンバーは1234 5678 9017です").is_empty(),
            "check digit"
        );
        let ja = found("先月、糖尿病と診断されました。食事は？");
        assert_eq!(ja.len(), 1);
        assert_eq!(ja[0].0, EntityKind::MedicalContext);
        assert!(ja[0].1.contains("糖尿病"), "{ja:?}");
        let ko = found("작년에 당뇨병 진단을 받았어요.");
        assert!(ko[0].1.contains("당뇨병"), "{ko:?}");
        assert_eq!(
            found("Мне поставили диагноз диабет. Что можно есть?")[0].0,
            EntityKind::MedicalContext
        );
        assert!(found("Что такое диабет?").is_empty());
    }

    #[test]
    fn cue_scanning_stays_linear_on_a_hostile_megabyte() {
        // Every cue occurrence costs a bounded look-ahead, so this finishes like any
        // megabyte (the suite would time out on backtracking).
        let hostile = "my name is ".repeat(100_000)
            + &"出生日期".repeat(50_000)
            + &"田中さん".repeat(50_000)
            + &"김민수씨".repeat(50_000)
            + &"と診断され".repeat(50_000);
        let spans = pii::detect(&hostile);
        assert!(spans.iter().all(|s| s.kind != EntityKind::DateOfBirth));
    }
}
