//! Street addresses in Japanese, Korean and Russian, each in its own order:
//! "〒160-0023 東京都新宿区西新宿2-8-1" (prefecture, city, district, block numbers),
//! "서울특별시 강남구 테헤란로 152" (city, district, road, building number) and
//! "г. Москва, ул. Тверская, д. 7, кв. 12" (street type, name, house, flat). Each scanner
//! starts from an anchor and looks around a bounded window, so the scan stays linear.

use super::kinds::{EntityKind, Span};

/// Adds the Japanese, Korean and Russian street addresses in `text` to `spans`.
pub fn detect(text: &str, spans: &mut Vec<Span>) {
    japanese(text, spans);
    korean(text, spans);
    russian(text, spans);
}

fn push(spans: &mut Vec<Span>, start: usize, end: usize, confidence: f32) {
    spans.push(Span {
        kind: EntityKind::StreetAddress,
        start,
        end,
        confidence,
    });
}

fn is_han(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF)
}

fn is_katakana(c: char) -> bool {
    matches!(c as u32, 0x30A1..=0x30FA | 0x30FC)
}

/// Characters that end a Japanese place unit: prefecture, city, ward, district, town, village.
const PLACE_UNITS_JA: &[char] = &['都', '道', '府', '県', '市', '区', '郡', '町', '村'];

/// Japanese block numbers starting at `at`: "2-8-1", "2丁目8番1号", "2丁目8-1", "8番地".
/// Full-width digits and hyphens count. Returns the end and how many numbers it had.
fn ja_block_numbers(text: &str, at: usize) -> Option<(usize, usize)> {
    let (mut end, mut numbers, mut in_number) = (at, 0, false);
    for (i, c) in text.get(at..)?.char_indices().take(24) {
        let digit = c.is_ascii_digit() || ('０'..='９').contains(&c);
        if digit {
            numbers += usize::from(!in_number);
            in_number = true;
            end = at + i + c.len_utf8();
            continue;
        }
        in_number = false;
        match c {
            '-' | '－' | '‐' | 'ー' | '−' if numbers > 0 => {}
            '丁' | '目' | '番' | '地' | '号' if numbers > 0 => end = at + i + c.len_utf8(),
            _ => break,
        }
    }
    // One number is a lot number only with 番地 or 番 after it.
    let marked = text[at..end].contains('番') || text[at..end].contains('丁');
    (numbers >= 2 || (numbers == 1 && marked)).then_some((end, numbers))
}

/// "東京都新宿区西新宿2-8-1": a run of kanji and katakana holding a place unit (区, 市, …)
/// right before block numbers; a postcode "〒160-0023" before it joins the span.
fn japanese(text: &str, spans: &mut Vec<Span>) {
    let mut i = 0;
    while let Some(offset) =
        text[i..].find(|c: char| c.is_ascii_digit() || ('０'..='９').contains(&c))
    {
        let at = i + offset;
        let head = &text[..at];
        let mut start = at;
        let mut has_unit = false;
        for c in head.chars().rev().take(24) {
            if !(is_han(c) || is_katakana(c)) {
                break;
            }
            has_unit |= PLACE_UNITS_JA.contains(&c);
            start -= c.len_utf8();
        }
        match ja_block_numbers(text, at) {
            Some((end, _)) if has_unit && start < at => {
                // Address words before the place: "住所は東京都…" keeps only the place.
                let start = ["住所", "所在地"]
                    .iter()
                    .filter_map(|cue| text[start..at].find(cue).map(|k| start + k + cue.len()))
                    .max()
                    .unwrap_or(start);
                let start = postcode_before(text, start).unwrap_or(start);
                push(spans, start, end, 0.8);
                i = end;
            }
            _ => {
                // Past this digit run (a digit is one byte, whatever its width class).
                let skip = text[at..]
                    .char_indices()
                    .find(|(_, c)| !(c.is_ascii_digit() || ('０'..='９').contains(c)))
                    .map_or(text.len() - at, |(k, _)| k);
                i = at + skip.max(1);
            }
        }
    }
}

/// The start of a "〒160-0023" postcode right before `at` (a space between allowed).
fn postcode_before(text: &str, at: usize) -> Option<usize> {
    let head = text[..at].trim_end_matches([' ', '　']);
    let code = head.get(head.len().checked_sub(8)?..)?;
    let b = code.as_bytes();
    let well_formed =
        b.len() == 8 && b[3] == b'-' && b[..3].iter().chain(&b[4..]).all(u8::is_ascii_digit);
    let mark = head[..head.len() - 8].trim_end_matches(' ');
    (well_formed && mark.ends_with('〒')).then(|| mark.len() - '〒'.len_utf8())
}

fn is_hangul(c: char) -> bool {
    matches!(c as u32, 0xAC00..=0xD7A3)
}

/// Korean administrative units that end a word before the road: 시 (city), 도 (province),
/// 구 (district), 군 (county).
const ADMIN_UNITS_KO: &[char] = &['시', '도', '구', '군'];

/// "서울특별시 강남구 테헤란로 152", "강남구 테헤란로 152길 10": a road word (…로, …길) after an
/// administrative unit, then the building number; one to two more administrative words before
/// it join the span.
fn korean(text: &str, spans: &mut Vec<Span>) {
    for (road_end, road_word) in text.match_indices(['로', '길']) {
        let after = road_end + road_word.len();
        // The building number: "152", "152-3", "152길 10", "12번길 5".
        let rest = &text[after..];
        let Some(number) = rest.strip_prefix(' ') else {
            continue;
        };
        let digits = number.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            continue;
        }
        let mut end = after + 1 + digits;
        if let Some(tail) = text[end..].strip_prefix('-') {
            let more = tail.bytes().take_while(u8::is_ascii_digit).count();
            if more > 0 {
                end += 1 + more;
            }
        }
        // The road's name: Hangul (and digits, "테헤란로", "세종대로", "3가길") back to a space.
        let road_start = text[..road_end]
            .char_indices()
            .rev()
            .take_while(|(_, c)| is_hangul(*c) || c.is_ascii_digit())
            .take(20)
            .last()
            .map_or(road_end, |(k, _)| k);
        if road_start == road_end {
            continue;
        }
        // Administrative words before it; the one right before the road must be there.
        let mut start = road_start;
        for _ in 0..3 {
            let Some(head) = text[..start].strip_suffix(' ') else {
                break;
            };
            let word_start = head
                .char_indices()
                .rev()
                .take_while(|(_, c)| is_hangul(*c))
                .take(20)
                .last()
                .map(|(k, _)| k);
            match word_start {
                Some(k)
                    if head[k..].chars().count() >= 2
                        && head
                            .chars()
                            .next_back()
                            .is_some_and(|c| ADMIN_UNITS_KO.contains(&c)) =>
                {
                    start = k;
                }
                _ => break,
            }
        }
        if start < road_start {
            push(spans, start, end, 0.8);
        }
    }
}

/// Russian street types, in the forms written before the street's name.
const STREET_TYPES_RU: &[&str] = &[
    "ул. ",
    "Ул. ",
    "улица ",
    "Улица ",
    "пр-т ",
    "проспект ",
    "Проспект ",
    "пер. ",
    "переулок ",
    "б-р ",
    "бульвар ",
    "наб. ",
    "набережная ",
    "шоссе ",
    "пл. ",
    "площадь ",
];

/// "ул. Тверская, д. 7, кв. 12", "проспект Мира 10", "ул. 1-я Парковая, 5": a street type,
/// one to three name words, then the house number (after "д."/"дом" or a comma), with its
/// building and flat; a city ("г. Москва, ") right before joins the span.
fn russian(text: &str, spans: &mut Vec<Span>) {
    for street_type in STREET_TYPES_RU {
        for (at, _) in text.match_indices(street_type) {
            // The type must start a word ("ул.", not "гул.").
            if text[..at]
                .chars()
                .next_back()
                .is_some_and(char::is_alphabetic)
            {
                continue;
            }
            let name_start = at + street_type.len();
            let Some(name_end) = russian_name_words(text, name_start) else {
                continue;
            };
            let Some(end) = russian_house(text, name_end) else {
                continue;
            };
            let start = russian_city_before(text, at).unwrap_or(at);
            push(spans, start, end, 0.8);
        }
    }
}

/// One to three words of a street's name: capitalised words, or an ordinal ("1-я").
fn russian_name_words(text: &str, at: usize) -> Option<usize> {
    super::cues::word_run(text, at, 3, |rest| {
        let first = rest.chars().next()?;
        let len = rest
            .char_indices()
            .find(|&(_, c)| !(c.is_alphanumeric() || c == '-'))
            .map_or(rest.len(), |(k, _)| k);
        let word = &rest[..len];
        let ordinal = first.is_ascii_digit() && word.contains('-');
        ((first.is_uppercase() || ordinal) && word.chars().count() >= 2).then_some(len)
    })
}

/// The house part after a street's name: ", д. 7", " дом 7", ", 7", " 10", with "к. 2",
/// "корп. 2", "стр. 1" and ", кв. 12" after it. Returns its end.
fn russian_house(text: &str, at: usize) -> Option<usize> {
    let rest = text.get(at..)?;
    let rest_trim = rest.trim_start_matches([',', ' ']);
    let mut i = at + (rest.len() - rest_trim.len());
    for marker in ["д. ", "д.", "дом "] {
        if text[i..].starts_with(marker) {
            i += marker.len();
            break;
        }
    }
    let digits = text[i..].bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 4 || i == at {
        return None;
    }
    let mut end = i + digits;
    // A letter or a slash right after the number: "7а", "12/2".
    if let Some(c) = text[end..].chars().next()
        && (c.is_alphabetic()
            && !text[end + c.len_utf8()..].starts_with(|d: char| d.is_alphabetic()))
    {
        end += c.len_utf8();
    }
    // Building and flat, each at most once, in the usual order.
    for marker in ["к. ", "корп. ", "стр. ", "кв. ", "офис "] {
        let tail = &text[end..];
        let tail_trim = tail.trim_start_matches([',', ' ']);
        if let Some(number) = tail_trim.strip_prefix(marker) {
            let n = number.bytes().take_while(u8::is_ascii_digit).count();
            if n > 0 && n <= 4 {
                end += (tail.len() - tail_trim.len()) + marker.len() + n;
            }
        }
    }
    Some(end)
}

/// The start of "г. Москва, " right before `at`.
fn russian_city_before(text: &str, at: usize) -> Option<usize> {
    let head = text[..at].trim_end_matches([',', ' ']);
    let city_start = head
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_alphabetic() || *c == '-' || *c == ' ')
        .take(30)
        .last()
        .map(|(k, _)| k)?;
    let mark = text[..city_start].trim_end_matches(' ');
    mark.ends_with("г.").then(|| mark.len() - "г.".len())
}

#[cfg(test)]
mod tests {
    use crate::pii::{self, EntityKind};

    fn addresses(text: &str) -> Vec<String> {
        pii::texts_of(text, EntityKind::StreetAddress)
    }

    #[test]
    fn japanese_addresses() {
        assert_eq!(
            addresses("住所は〒160-0023 東京都新宿区西新宿2-8-1です。"),
            ["〒160-0023 東京都新宿区西新宿2-8-1"]
        );
        assert_eq!(
            addresses("大阪府大阪市北区梅田3丁目1番3号に送ってください"),
            ["大阪府大阪市北区梅田3丁目1番3号"]
        );
        assert_eq!(
            addresses("新宿区西新宿２－８－１"),
            ["新宿区西新宿２－８－１"]
        );
        for text in [
            "2024年5月12日に会議があります。",
            "東京都の人口は1400万人です。",
            "第3章の2-3節を読んでください。",
        ] {
            assert!(addresses(text).is_empty(), "{text}: {:?}", addresses(text));
        }
    }

    #[test]
    fn korean_addresses() {
        assert_eq!(
            addresses("주소는 서울특별시 강남구 테헤란로 152 입니다."),
            ["서울특별시 강남구 테헤란로 152"]
        );
        assert_eq!(
            addresses("부산광역시 해운대구 해운대로 570-1로 보내주세요"),
            ["부산광역시 해운대구 해운대로 570-1"]
        );
        for text in ["서울로 3명이 갔어요.", "이 길 10분 걸려요", "앞으로 5년"] {
            assert!(addresses(text).is_empty(), "{text}: {:?}", addresses(text));
        }
    }

    #[test]
    fn russian_addresses() {
        assert_eq!(
            addresses("Адрес: г. Москва, ул. Тверская, д. 7, кв. 12. Жду."),
            ["г. Москва, ул. Тверская, д. 7, кв. 12"]
        );
        assert_eq!(
            addresses("живу на проспекте, проспект Мира 10"),
            ["проспект Мира 10"]
        );
        assert_eq!(addresses("ул. 1-я Парковая, 5к"), ["ул. 1-я Парковая, 5к"]);
        for text in [
            "улица была пустой",
            "На ул. Тверская много магазинов",
            "Я прочитал 5 книг.",
        ] {
            assert!(addresses(text).is_empty(), "{text}: {:?}", addresses(text));
        }
    }

    #[test]
    fn hostile_megabytes_stay_linear() {
        let hostile = "東京都新宿区".repeat(40_000)
            + &"1-".repeat(100_000)
            + &"강남구 로 ".repeat(40_000)
            + &"ул. ".repeat(100_000);
        let _ = pii::detect(&hostile);
    }
}
