//! Street addresses: a house number next to a street name in the orders that English,
//! German, French, Spanish/Italian and Chinese write them ("221B Baker Street",
//! "Hauptstraße 5", "12 rue de Rivoli", "Calle Mayor 7", "建国路88号"). One pass finds the
//! anchors (a street word, "号") and each look-around is bounded, so the scan stays linear.

use super::kinds::{EntityKind, Span};

/// English street types, lower-case; matched as a capitalised whole word ("Street", "St.").
const STREET_TYPES_EN: &[&str] = &[
    "street",
    "st",
    "avenue",
    "ave",
    "road",
    "rd",
    "boulevard",
    "blvd",
    "lane",
    "ln",
    "drive",
    "dr",
    "court",
    "ct",
    "way",
    "place",
    "pl",
    "terrace",
    "parkway",
    "pkwy",
    "highway",
    "hwy",
    "square",
    "sq",
    "circle",
    "crescent",
    "close",
    "trail",
];
/// German street-name endings ("Hauptstraße", "Lindenweg"), followed by the house number.
/// ("-ring", "-damm" and "-ufer" are left out: "During 5", "Spring 2024".)
const STREET_ENDINGS_DE: &[&str] = &[
    "straße", "strasse", "str.", "weg", "gasse", "allee", "platz",
];
/// French street types, written after the number ("12 rue de Rivoli").
const STREET_TYPES_FR: &[&str] = &["rue", "avenue", "boulevard", "chemin", "allée", "impasse"];
/// Spanish and Italian street types, written before the name and the number.
const STREET_TYPES_ES_IT: &[&str] = &[
    "calle", "avenida", "paseo", "plaza", "carrera", "via", "viale", "piazza", "corso",
];
/// Chinese street words that end the name before the number and 号.
const STREET_WORDS_ZH: &[char] = &['路', '街', '道', '巷', '弄', '里', '胡', '同'];
/// Words before a Chinese address that are not part of it ("我住在北京市…").
const ADDRESS_CUES_ZH: &[&str] = &["住在", "住址", "地址", "位于", "寄到", "送到", "搬到", "在"];

/// Adds the street addresses in `text` to `spans`.
pub fn detect(text: &str, spans: &mut Vec<Span>) {
    latin(text.as_bytes(), spans);
    chinese(text, spans);
}

/// One pass over the words: a street word is looked up only where it could start an
/// address (capitalised, or right after a number), so most words cost a byte test.
fn latin(b: &[u8], spans: &mut Vec<Span>) {
    let mut i = 0;
    while i < b.len() {
        if !is_letter_byte(b[i]) || (i > 0 && is_letter_byte(b[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && is_letter_byte(b[i]) {
            i += 1;
        }
        let word = &b[start..i];
        let is = |list: &[&str]| list.iter().any(|t| t.as_bytes().eq_ignore_ascii_case(word));
        if word[0].is_ascii_uppercase() {
            if is(STREET_TYPES_EN) {
                english(b, start, i, spans);
            }
            if is(STREET_TYPES_ES_IT) {
                spanish_italian(b, start, i, spans);
            }
            german(b, start, i, spans);
        }
        let after_number = start >= 2 && matches!(b[start - 1], b' ' | b',');
        if after_number && is(STREET_TYPES_FR) {
            french(b, start, i, spans);
        }
    }
}

fn push(spans: &mut Vec<Span>, start: usize, end: usize, confidence: f32) {
    spans.push(Span {
        kind: EntityKind::StreetAddress,
        start,
        end,
        confidence,
    });
}

/// A house number ending at `end`: 1–5 digits, an optional letter ("221B") or a range
/// ("12-14"). Returns its start.
fn house_number_before(b: &[u8], end: usize) -> Option<usize> {
    let mut i = end;
    if i > 0 && b[i - 1].is_ascii_alphabetic() {
        i -= 1;
    }
    let digits_end = i;
    while i > 0 && digits_end - i < 11 && (b[i - 1].is_ascii_digit() || b[i - 1] == b'-') {
        i -= 1;
    }
    let number = &b[i..digits_end];
    let ok = number.first().is_some_and(u8::is_ascii_digit)
        && number.iter().filter(|c| c.is_ascii_digit()).count() <= 5;
    let starts_word = i == 0 || !b[i - 1].is_ascii_alphanumeric();
    (ok && starts_word).then_some(i)
}

/// A house number starting at `at` (after optional spaces): digits with an optional letter.
/// Returns its end.
fn house_number_after(b: &[u8], at: usize) -> Option<usize> {
    let mut i = at;
    while b.get(i) == Some(&b' ') && i < at + 2 {
        i += 1;
    }
    let start = i;
    while i < b.len() && i - start < 5 && b[i].is_ascii_digit() {
        i += 1;
    }
    if i == start {
        return None;
    }
    if b.get(i).is_some_and(u8::is_ascii_alphabetic)
        && !b.get(i + 1).is_some_and(u8::is_ascii_alphanumeric)
    {
        i += 1;
    }
    (!b.get(i).is_some_and(u8::is_ascii_alphanumeric)).then_some(i)
}

/// "221B Baker Street", "1600 Pennsylvania Avenue NW", "10 Downing St., London SW1A 2AA":
/// a number, one to four capitalised words (or ordinals: "5th"), then a street type.
fn english(b: &[u8], at: usize, type_end: usize, spans: &mut Vec<Span>) {
    // The name words before the type, right to left.
    let mut start = at;
    let mut names = 0;
    let mut number = None;
    while names < 5 && start >= 2 && b[start - 1] == b' ' {
        let word_end = start - 1;
        let mut word_start = word_end;
        while word_start > 0 && word_end - word_start < 24 && is_word_byte(b[word_start - 1]) {
            word_start -= 1;
        }
        let word = &b[word_start..word_end];
        if word.is_empty() {
            break;
        }
        if names > 0
            && let Some(n) = house_number_before(b, word_end)
            && n == word_start
        {
            number = Some(n);
            break;
        }
        let capitalised = word[0].is_ascii_uppercase();
        let ordinal = word[0].is_ascii_digit()
            && [b"st", b"nd", b"rd", b"th"]
                .iter()
                .any(|s| word.ends_with(*s));
        if !(capitalised || ordinal) {
            break;
        }
        names += 1;
        start = word_start;
    }
    let Some(start) = number else {
        return;
    };
    let mut end = type_end;
    if b.get(end) == Some(&b'.') {
        end += 1;
    }
    push(spans, start, english_tail(b, end), 0.8);
}

/// What may follow an English street: a compass suffix, a unit ("Apt 4B", "Suite 200",
/// "#12"), then ", City", ", ST 12345" or a postcode — each optional, all within 64 bytes.
fn english_tail(b: &[u8], mut end: usize) -> usize {
    let limit = (end + 64).min(b.len());
    let word_at = |i: usize| -> usize {
        let mut j = i;
        while j < limit && (b[j].is_ascii_alphanumeric() || b[j] == b'#' || b[j] == b'-') {
            j += 1;
        }
        j
    };
    // Compass suffix: "NW", "SE".
    if b.get(end) == Some(&b' ') {
        let w = word_at(end + 1);
        if matches!(
            &b[end + 1..w],
            b"N" | b"S" | b"E" | b"W" | b"NE" | b"NW" | b"SE" | b"SW"
        ) {
            end = w;
        }
    }
    // Unit.
    let mut i = end;
    while i < limit && matches!(b[i], b' ' | b',') {
        i += 1;
    }
    let unit_word = word_at(i);
    let unit = &b[i..unit_word];
    let is_unit = [
        b"apt".as_slice(),
        b"apartment",
        b"suite",
        b"unit",
        b"flat",
        b"floor",
    ]
    .iter()
    .any(|u| unit.eq_ignore_ascii_case(u));
    if is_unit || unit.first() == Some(&b'#') {
        let mut j = unit_word;
        if is_unit {
            while j < limit && matches!(b[j], b' ' | b'.') {
                j += 1;
            }
            j = word_at(j);
        }
        if j > unit_word || unit.len() > 1 {
            end = j;
        }
    }
    // ", City" then an optional ", ST" and a postcode with digits.
    let mut i = end;
    if b.get(i) == Some(&b',') {
        i += 1;
        while b.get(i) == Some(&b' ') {
            i += 1;
        }
        let mut city_end = None;
        let mut j = i;
        for _ in 0..3 {
            let w = word_at(j);
            let word = &b[j..w];
            let postcode = word.iter().any(u8::is_ascii_digit) && word.len() >= 3;
            if word.is_empty() || !(word[0].is_ascii_uppercase() || postcode) {
                break;
            }
            city_end = Some(w);
            j = w;
            while j < limit && matches!(b[j], b' ' | b',') {
                j += 1;
            }
        }
        if let Some(e) = city_end {
            end = e;
        }
    }
    end
}

fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'\'' || c == b'-' || c == b'.' || c >= 0x80
}

/// "Hauptstraße 5", "Am Lindenweg 12a, 10115 Berlin": a capitalised word with a street
/// ending, then the number, then an optional five-digit postcode and town.
fn german(b: &[u8], start: usize, word_end: usize, spans: &mut Vec<Span>) {
    let word = &b[start..word_end];
    // "Hauptstr. 5"
    let abbreviated = word.len() > 3
        && word[word.len() - 3..].eq_ignore_ascii_case(b"str")
        && b.get(word_end) == Some(&b'.');
    let ends = abbreviated
        || STREET_ENDINGS_DE.iter().any(|e| {
            let e = e.as_bytes();
            // The ending alone is a street only when it is a whole word ("Straße 5").
            word.len() >= e.len()
                && (word.len() > e.len() || e.len() >= 6)
                && word[word.len() - e.len()..].eq_ignore_ascii_case(e)
        });
    if !ends {
        return;
    }
    let end = word_end + usize::from(abbreviated);
    let Some(mut stop) = house_number_after(b, end) else {
        return;
    };
    if stop == end {
        return;
    }
    // ", 10115 Berlin"
    let mut j = stop;
    if b.get(j) == Some(&b',') {
        j += 1;
    }
    while b.get(j) == Some(&b' ') && j < stop + 3 {
        j += 1;
    }
    let digits = b[j.min(b.len())..]
        .iter()
        .take(6)
        .take_while(|c| c.is_ascii_digit())
        .count();
    if digits == 5 && b.get(j + 5) == Some(&b' ') {
        let town = j + 6;
        let mut k = town;
        while k < b.len() && k - town < 30 && is_letter_byte(b[k]) {
            k += 1;
        }
        if k > town && b[town].is_ascii_uppercase() {
            stop = k;
        }
    }
    push(spans, start, stop, 0.75);
}

fn is_letter_byte(c: u8) -> bool {
    c.is_ascii_alphabetic() || c >= 0x80
}

/// "12 rue de Rivoli", "3 bis avenue Foch": a number, the street type, then its name up to
/// the next comma, full stop or newline (at most five words).
fn french(b: &[u8], at: usize, type_end: usize, spans: &mut Vec<Span>) {
    // "12 rue", "12, rue", "3 bis rue"
    let mut i = at;
    while i > 0 && matches!(b[i - 1], b' ' | b',') && at - i < 2 {
        i -= 1;
    }
    if i >= 4 && b[i - 3..i].eq_ignore_ascii_case(b"bis") {
        i -= 3;
        while i > 0 && b[i - 1] == b' ' && at - i < 6 {
            i -= 1;
        }
    }
    let Some(start) = house_number_before(b, i) else {
        return;
    };
    let end = name_words(b, type_end, 5);
    if end > type_end {
        push(spans, start, end, 0.75);
    }
}

/// "Calle Mayor 7", "Via Roma 10", "Avenida de la Constitución 12": the capitalised street
/// type, up to five name words, then the number.
fn spanish_italian(b: &[u8], at: usize, type_end: usize, spans: &mut Vec<Span>) {
    let mut i = type_end;
    let mut names = 0;
    while names <= 5 && b.get(i) == Some(&b' ') {
        if let Some(end) = house_number_after(b, i + 1)
            && names > 0
        {
            push(spans, at, end, 0.75);
            return;
        }
        let w = i + 1;
        let mut e = w;
        while e < b.len() && e - w < 24 && is_letter_byte(b[e]) {
            e += 1;
        }
        if e == w {
            return;
        }
        names += 1;
        i = e;
        if b.get(i) == Some(&b',') {
            i += 1;
        }
    }
}

/// The end of up to `max` words after `at` (letters, digits, apostrophes, hyphens), stopping
/// at a comma, full stop or newline.
fn name_words(b: &[u8], at: usize, max: usize) -> usize {
    let mut end = at;
    let mut i = at;
    for _ in 0..max {
        if b.get(i) != Some(&b' ') {
            break;
        }
        let w = i + 1;
        let mut e = w;
        while e < b.len() && e - w < 24 && (is_letter_byte(b[e]) || b[e] == b'\'' || b[e] == b'-') {
            e += 1;
        }
        if e == w {
            break;
        }
        end = e;
        i = e;
    }
    end
}

fn is_han(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF)
}

/// "北京市朝阳区建国路88号", "上海市黄浦区南京东路100号5楼": Han characters ending in a street
/// word, a number, 号; the name taken back at most 16 characters and cut after a cue
/// ("我住在…").
fn chinese(text: &str, spans: &mut Vec<Span>) {
    for (hao, _) in text.match_indices('号') {
        let head = &text[..hao];
        let digits = head
            .bytes()
            .rev()
            .take(6)
            .take_while(u8::is_ascii_digit)
            .count();
        if digits == 0 || digits > 5 {
            continue;
        }
        let number_start = hao - digits;
        let name = &text[..number_start];
        if !name
            .chars()
            .next_back()
            .is_some_and(|c| STREET_WORDS_ZH.contains(&c))
        {
            continue;
        }
        let mut start = number_start;
        for c in name.chars().rev().take(16) {
            if !is_han(c) {
                break;
            }
            start -= c.len_utf8();
        }
        // The street word alone is no address ("路88号" after a non-Han byte).
        if number_start - start < 2 * '路'.len_utf8() {
            continue;
        }
        if let Some(cut) = ADDRESS_CUES_ZH
            .iter()
            .filter_map(|cue| text[start..number_start].rfind(cue).map(|i| i + cue.len()))
            .max()
        {
            start += cut;
        }
        if number_start - start < 2 * '路'.len_utf8() {
            continue;
        }
        let mut end = hao + '号'.len_utf8();
        // "5楼", "3单元", "1201室"
        let rest = &text[end..];
        let more = rest.bytes().take(6).take_while(u8::is_ascii_digit).count();
        if more > 0 {
            let after = &rest[more..];
            if let Some(unit) = ["楼", "层", "单元", "室"]
                .iter()
                .find(|u| after.starts_with(**u))
            {
                end += more + unit.len();
            }
        }
        push(spans, start, end, 0.8);
    }
}

#[cfg(test)]
mod tests {
    use crate::pii::{self, EntityKind};

    fn addresses(text: &str) -> Vec<String> {
        pii::texts_of(text, EntityKind::StreetAddress)
    }

    #[test]
    fn english_addresses_with_units_cities_and_postcodes() {
        assert_eq!(
            addresses("Send it to 221B Baker Street, London NW1 6XE please."),
            ["221B Baker Street, London NW1 6XE"]
        );
        assert_eq!(
            addresses("I live at 1600 Pennsylvania Avenue NW, Washington, DC 20500."),
            ["1600 Pennsylvania Avenue NW, Washington, DC 20500"]
        );
        assert_eq!(
            addresses("ship to 42 W 5th St. Apt 4B, New York"),
            ["42 W 5th St. Apt 4B, New York"]
        );
        assert_eq!(
            addresses("Our office: 350 Fifth Ave #12"),
            ["350 Fifth Ave #12"]
        );
    }

    #[test]
    fn street_words_without_a_house_number_are_not_addresses() {
        assert!(addresses("Fifth Avenue is busy at Christmas.").is_empty());
        assert!(addresses("We met on Main Street yesterday.").is_empty());
        assert!(addresses("Dr. Smith will see you at 5 pm.").is_empty());
        assert!(addresses("There are 3 ways to do it.").is_empty());
        assert!(
            addresses("Read chapter 12 of the book, then take the road less travelled.").is_empty()
        );
    }

    #[test]
    fn european_orders() {
        assert_eq!(
            addresses("Meine Adresse: Hauptstraße 5, 10115 Berlin."),
            ["Hauptstraße 5, 10115 Berlin"]
        );
        assert_eq!(addresses("Wir wohnen im Lindenweg 12a."), ["Lindenweg 12a"]);
        assert_eq!(
            addresses("J'habite au 12 rue de Rivoli, Paris."),
            ["12 rue de Rivoli"]
        );
        assert_eq!(
            addresses("Vivo en Calle Mayor 7, Madrid."),
            ["Calle Mayor 7"]
        );
        assert_eq!(addresses("Abito in Via Roma 10."), ["Via Roma 10"]);
        assert!(addresses("Die Straße ist lang.").is_empty());
        assert!(addresses("la rue est calme").is_empty());
    }

    #[test]
    fn chinese_addresses_without_the_words_before_them() {
        assert_eq!(
            addresses("我住在北京市朝阳区建国路88号，欢迎来玩。"),
            ["北京市朝阳区建国路88号"]
        );
        assert_eq!(
            addresses("地址：上海市黄浦区南京东路100号5楼"),
            ["上海市黄浦区南京东路100号5楼"]
        );
        assert!(addresses("今天是3号。").is_empty());
        assert!(addresses("他穿88号球衣。").is_empty());
    }

    #[test]
    fn address_scanning_stays_linear_on_a_hostile_megabyte() {
        let hostile = "1 A ".repeat(60_000) + &"Street ".repeat(60_000) + &"路1号".repeat(40_000);
        let started = pii::detect(&hostile);
        // Bounded look-around: each anchor costs a few dozen bytes, so this returns; most
        // anchors here have no house number in reach.
        assert!(started.len() < 200_000);
    }
}
