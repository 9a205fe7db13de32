//! Numbers that identify someone: payment cards, phone numbers, US social security numbers,
//! Chinese, Korean and Russian national numbers. One pass reads each run of digit groups
//! (with their separators, a leading `+` or bracket and a trailing extension), then one
//! function decides what the run's shape and check digits say it is.

use super::checks::{cn_id_valid, is_word, luhn_valid};
use super::kinds::{EntityKind, Span};

/// Words within this many bytes before a bare run of digits that make it a phone number.
const PHONE_CUE_WINDOW: usize = 64;
/// Words that introduce a phone number.
const PHONE_CUES: &[&str] = &[
    "phone", "call", "tel", "mobile", "cell", "number", "fax", "text", "sms", "reach", "contact",
    "whatsapp", "dial", "ring",
];

/// Words that leave no doubt the number after them is a phone's, so shapes that are
/// otherwise amounts ("12 345 678") or account numbers ("12 345678") count as phones.
const STRONG_PHONE_CUES: &[&str] = &[
    "phone", "call", "tel", "mobile", "cell", "fax", "whatsapp", "dial", "reach",
];
/// Words before a number that make it a card whatever its issuer range.
const CARD_CUES: &[&str] = &[
    "card",
    "visa",
    "mastercard",
    "amex",
    "maestro",
    "discover",
    "credit",
    "debit",
];

/// One run of digit groups as written: "+1-541-754-3010 x123", "(0161) 4960066".
#[derive(Debug, Default)]
struct Run {
    start: usize,
    /// End of the run, its extension included.
    end: usize,
    /// The digits without separators (the extension's excluded).
    digits: Vec<u8>,
    /// The length of each group of digits.
    groups: Vec<usize>,
    /// Every separator byte between groups, in order.
    seps: Vec<u8>,
    /// Each gap between groups as one mark: its first byte other than a space, or a space.
    gaps: Vec<u8>,
    /// Starts with `+` (an international number).
    plus: bool,
    /// Holds a bracket: "(415) 555-2671", "+44(0)115".
    bracket: bool,
    /// Ends with an extension: "x4587", "ext. 12".
    extension: bool,
    /// Ends with an `X` check character (Chinese resident ID).
    x_tail: bool,
}

/// Adds the identifying numbers of `b` to `spans`.
pub fn detect(b: &[u8], spans: &mut Vec<Span>) {
    let mut i = 0;
    while i < b.len() {
        if !starts_run(b, i) {
            i += 1;
            continue;
        }
        let run = read_run(b, i);
        if run.end < b.len() && is_word(b[run.end]) {
            i = run.end.max(i + 1);
            continue;
        }
        if let Some((kind, confidence)) = classify(&run, b) {
            spans.push(Span {
                kind,
                start: run.start,
                end: run.end,
                confidence,
            });
        }
        i = run.end.max(i + 1);
    }
}

fn is_sep(c: u8) -> bool {
    matches!(c, b' ' | b'-' | b'.' | b'/' | b'(' | b')')
}

fn starts_run(b: &[u8], i: usize) -> bool {
    if i > 0 && (is_word(b[i - 1]) || matches!(b[i - 1], b'.' | b'+' | b'-' | b'(')) {
        return false;
    }
    let digit_at = |k: usize| b.get(k).is_some_and(u8::is_ascii_digit);
    match b[i] {
        b'0'..=b'9' => true,
        b'+' => digit_at(i + 1) || (b.get(i + 1) == Some(&b'(') && digit_at(i + 2)),
        b'(' => digit_at(i + 1) || (b.get(i + 1) == Some(&b'+') && digit_at(i + 2)),
        _ => false,
    }
}

fn read_run(b: &[u8], start: usize) -> Run {
    let mut run = Run {
        start,
        plus: b[start] == b'+' || b.get(start + 1) == Some(&b'+'),
        ..Run::default()
    };
    let mut j = start;
    while j < b.len() && !b[j].is_ascii_digit() {
        run.bracket |= b[j] == b'(';
        j += 1;
    }
    loop {
        let group_start = j;
        while j < b.len() && b[j].is_ascii_digit() {
            run.digits.push(b[j] - b'0');
            j += 1;
        }
        run.groups.push(j - group_start);
        // Up to three separator bytes ("-", ") ", " (", ")-") lead to the next group; two
        // spaces or a newline end the run.
        let sep_len = b[j..].iter().take(4).take_while(|c| is_sep(**c)).count();
        let seps = &b[j..j + sep_len];
        let next_is_digit = b.get(j + sep_len).is_some_and(u8::is_ascii_digit);
        if sep_len == 0 || sep_len > 3 || !next_is_digit || seps.starts_with(b"  ") {
            break;
        }
        run.bracket |= seps.contains(&b'(');
        run.seps.extend_from_slice(seps);
        run.gaps
            .push(seps.iter().copied().find(|&c| c != b' ').unwrap_or(b' '));
        j += sep_len;
    }
    // A closing bracket right after the digits belongs to the run: "(+44) 20".
    run.x_tail = run.digits.len() == 17
        && run.seps.is_empty()
        && b.get(j).is_some_and(|c| c.eq_ignore_ascii_case(&b'X'));
    run.end = if run.x_tail { j + 1 } else { j };
    if let Some(end) = extension_end(b, run.end)
        && run.digits.len() >= 7
    {
        run.extension = true;
        run.end = end;
    }
    run
}

/// Where an extension written after a phone number ends: "x4587", " ext. 12",
/// ", extension 301", " #22".
fn extension_end(b: &[u8], at: usize) -> Option<usize> {
    let mut j = at;
    if b.get(j) == Some(&b',') {
        j += 1;
    }
    while b.get(j) == Some(&b' ') && j - at < 2 {
        j += 1;
    }
    let rest = &b[j.min(b.len())..];
    let marker = [&b"extension"[..], b"ext.", b"ext", b"x", b"#"]
        .into_iter()
        .find(|m| rest.len() >= m.len() && rest[..m.len()].eq_ignore_ascii_case(m))?;
    j += marker.len();
    if b.get(j) == Some(&b' ') {
        j += 1;
    }
    let digits = b[j.min(b.len())..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    let end = j + digits;
    ((1..=6).contains(&digits) && !b.get(end).is_some_and(|c| is_word(*c))).then_some(end)
}

/// What a run of digits is, by its shape and check digits, with a confidence.
fn classify(run: &Run, text: &[u8]) -> Option<(EntityKind, f32)> {
    let d = &run.digits;
    let n = d.len();
    let plain = run.seps.is_empty() && !run.plus && !run.bracket && !run.extension;
    if plain && (n == 18 || run.x_tail) {
        let mut id: Vec<u8> = d.iter().map(|x| x + b'0').collect();
        if run.x_tail {
            id.push(b'X');
        }
        if cn_id_valid(&id) {
            return Some((EntityKind::CnResidentId, 0.95));
        }
    }
    if national_id(run) {
        return Some((EntityKind::NationalId, 0.9));
    }
    let card_named = || cue_before(text, run.start, CARD_CUES);
    if card_shaped(run) && luhn_valid(d) && (card_iin(d) || card_named()) {
        return Some((EntityKind::PaymentCard, 0.9));
    }
    // A number its writer calls a card right before it is kept private even when its check
    // digit fails: a mistyped or made-up card number is still meant as one.
    if card_shaped(run) && named_just_before(text, run.start, CARD_CUES) {
        return Some((EntityKind::PaymentCard, 0.75));
    }
    if ssn_shaped(run) && ssn_valid(d) {
        return Some((EntityKind::UsSsn, 0.9));
    }
    phone(run, text).map(|c| (EntityKind::Phone, c))
}

/// Korea's resident registration number ("900101-1234567") and Russia's SNILS
/// ("112-233-445 95").
fn national_id(run: &Run) -> bool {
    let d = &run.digits;
    (run.groups == [6, 7] && run.seps == [b'-'] && kr_rrn_valid(d))
        || (run.groups == [3, 3, 3, 2] && run.seps == [b'-', b'-', b' '] && snils_valid(d))
}

/// Cards are written whole or in groups of four (Amex and Diners: 4-6-5, 4-6-4).
fn card_shaped(run: &Run) -> bool {
    if run.plus || run.bracket || run.extension || !(12..=19).contains(&run.digits.len()) {
        return false;
    }
    let g = &run.groups;
    let one_sep = run.seps.windows(2).all(|w| w[0] == w[1]) && !run.seps.contains(&b'.');
    let fours = g[..g.len() - 1].iter().all(|&x| x == 4) && (1..=4).contains(&g[g.len() - 1]);
    one_sep && (g.len() == 1 || fours || g[..] == [4, 6, 5] || g[..] == [4, 6, 4])
}

/// Whether the leading digits fall in an issuer range: 1 (UATP), 2 (Mastercard 2-series,
/// JCB's 2131), 3 (Amex, Diners, JCB), 4 (Visa), 5 and 6 (Mastercard, Maestro, Discover,
/// UnionPay, RuPay), 8 and 9 (national schemes). 12-digit numbers are only Maestro's (5, 6).
fn card_iin(d: &[u8]) -> bool {
    match d.len() {
        12 => matches!(d[0], 5 | 6),
        _ => matches!(d[0], 1..=6 | 8 | 9),
    }
}

fn ssn_shaped(run: &Run) -> bool {
    run.groups == [3, 2, 4] && (run.seps == [b'-', b'-'] || run.seps == [b' ', b' '])
}

/// A phone number's confidence, or `None` where the run's shape says it is something else
/// (a date, an amount, a version, an IP address, a year range).
fn phone(run: &Run, text: &[u8]) -> Option<f32> {
    let n = run.digits.len();
    let d = &run.digits;
    let g = &run.groups;
    if run.plus {
        return (7..=15).contains(&n).then_some(0.9);
    }
    if !(7..=15).contains(&n) {
        return None;
    }
    let international = d.starts_with(&[0, 0]) || d.starts_with(&[0, 1, 1]);
    if run.extension || (international && g.len() > 1 && n >= 10) {
        return Some(0.85);
    }
    if run.seps.is_empty() {
        return bare_phone(run, text);
    }
    if n > 12 {
        return None;
    }
    if not_a_phone(run) || in_url_path(text, run.start) {
        return national_grouping_after_cue(run, text).then_some(0.8);
    }
    if run.bracket {
        return Some(0.85);
    }
    let later_groups_ok = g[1..].iter().all(|&x| (2..=8).contains(&x)) && g[0] <= 5;
    if !later_groups_ok {
        return None;
    }
    // Two groups: "555-0147", "0837 783533", and the 4-4 of Hungary, Brazil or Singapore.
    let local = g.len() >= 3 || d[0] == 0 || g[..] == [3, 4] || g[..] == [4, 4];
    if local {
        return Some(if phone_cue_before(text, run.start) {
            0.85
        } else {
            0.7
        });
    }
    national_grouping_after_cue(run, text).then_some(0.8)
}

/// Eight to eleven digits in two or three groups without a trunk 0 ("12 345 678",
/// "12 345678", "401 234 567") are how many countries write national numbers, and also how
/// amounts and account numbers look; only a word that names a phone decides. Dates
/// (a group of two after the first), a currency sign or a decimal part still say it is not
/// one.
fn national_grouping_after_cue(run: &Run, text: &[u8]) -> bool {
    let n = run.digits.len();
    let g = &run.groups;
    let grouped = (2..=3).contains(&g.len())
        && (2..=3).contains(&g[0])
        && g[1..].iter().all(|&x| (3..=6).contains(&x));
    let spaced = run.seps.iter().all(|&c| matches!(c, b' ' | b'-'));
    // `$`, and the last bytes of `£` and `€` in UTF-8.
    let after_currency = run.start > 0 && matches!(text[run.start - 1], b'$' | 0xa3 | 0xac);
    let decimal =
        text.get(run.end) == Some(&b',') && text.get(run.end + 1).is_some_and(u8::is_ascii_digit);
    (8..=11).contains(&n)
        && grouped
        && spaced
        && !after_currency
        && !decimal
        && cue_before(text, run.start, STRONG_PHONE_CUES)
}

/// A bare run of digits is a phone when it is a Chinese mobile, 7 to 12 digits after a word
/// that introduces a phone, or a national number behind its trunk 0.
fn bare_phone(run: &Run, text: &[u8]) -> Option<f32> {
    let d = &run.digits;
    let n = d.len();
    if n == 11 && d[0] == 1 && (3..=9).contains(&d[1]) {
        return Some(0.85);
    }
    if phone_cue_before(text, run.start) {
        return (7..=12).contains(&n).then_some(0.8);
    }
    ((10..=11).contains(&n) && d[0] == 0 && d[1] != 0).then_some(0.6)
}

/// Shapes of digit groups that are dates, amounts, versions, ZIP+4 codes, year ranges,
/// IPv4 addresses or identity numbers, never phones.
fn not_a_phone(run: &Run) -> bool {
    let g = &run.groups;
    let dotted_quad =
        run.seps.iter().all(|&c| c == b'.') && g.len() == 4 && g.iter().all(|&x| x <= 3);
    // "1 500 000", "12.345.678": thousands.
    let thousands = g[0] <= 2
        && g[1..].iter().all(|&x| x == 3)
        && run.seps.iter().all(|&c| c == b' ' || c == b'.');
    // "1990-2000", "(1819 - 1890)": a span of years, the later after the earlier.
    let years = g[..] == [4, 4]
        && matches!(group_values(run)[..], [a, b] if is_year(a) && (a..=a + 150).contains(&b));
    let zip4 = g[..] == [5, 4] && run.seps == [b'-'];
    // Identity numbers whose check failed are still not phones.
    let id_shaped = ssn_shaped(run) || (g[..] == [3, 3, 3, 2] && run.seps == [b'-', b'-', b' ']);
    let slashed = run.seps.contains(&b'/') && g.len() <= 3;
    // Groups of four are how cards and account numbers are written.
    let fours = g.len() >= 3 && g.iter().all(|&x| x == 4);
    dotted_quad || dated(run) || thousands || years || zip4 || id_shaped || slashed || fours
}

/// A date, year first or last, with one mark between its parts (spaces around it allowed)
/// and perhaps the hour after it: "2023-04-05", "05.04.2023", "2017 - 01 - 25 01:00",
/// "17 / 03 / 2017 22:45", "8 - 11 - 2016".
fn dated(run: &Run) -> bool {
    let g = &run.groups;
    let one_mark = run.gaps.len() >= 2
        && run.gaps[0] == run.gaps[1]
        && matches!(run.gaps[0], b'-' | b'.' | b'/');
    let hour_after = match g.len() {
        3 => true,
        4 => g[3] <= 2 && run.gaps[2] == b' ',
        _ => false,
    };
    if !one_mark || !hour_after {
        return false;
    }
    let values = group_values(run);
    let (year, a, b) = match (g[0], g[1], g[2]) {
        (4, 1..=2, 1..=2) => (values[0], values[1], values[2]),
        (1..=2, 1..=2, 4) => (values[2], values[0], values[1]),
        _ => return false,
    };
    let day_or_month = |v: u32| (1..=31).contains(&v);
    is_year(year) && day_or_month(a) && day_or_month(b) && a.min(b) <= 12
}

/// A year a text may name: a date's or a life's, from 1000 to 2099.
pub(super) fn is_year(v: u32) -> bool {
    (1000..=2099).contains(&v)
}

/// Each group of the run's digits as a number.
fn group_values(run: &Run) -> Vec<u32> {
    let mut at = 0;
    run.groups
        .iter()
        .map(|&len| {
            let v = run.digits[at..at + len]
                .iter()
                .fold(0u32, |v, &d| v * 10 + u32::from(d));
            at += len;
            v
        })
        .collect()
}

/// Whether the run at `at` is a segment of a URL's path ("arxiv.org/abs/0704.3116"): an
/// identifier there, not a phone. A query's value ("?phone=…") still counts.
fn in_url_path(text: &[u8], at: usize) -> bool {
    if at == 0 || text[at - 1] != b'/' {
        return false;
    }
    let token_start = text[..at]
        .iter()
        .rposition(u8::is_ascii_whitespace)
        .map_or(0, |i| i + 1);
    let token = &text[token_start..at];
    token.windows(3).any(|w| w == b"://") || token.starts_with(b"www.")
}

fn phone_cue_before(text: &[u8], at: usize) -> bool {
    let from = at.saturating_sub(PHONE_CUE_WINDOW);
    let window = &text[from..at];
    PHONE_CUES.iter().any(|cue| {
        window
            .windows(cue.len())
            .any(|w| w.eq_ignore_ascii_case(cue.as_bytes()))
    })
}

/// Whether a word that begins with one of `cues` ("call", "called", "Phone:") is written, in
/// any case, within the window before `at`. Unlike `phone_cue_before`, the cue must start a
/// word, since these cues alone turn an amount-shaped number into personal data.
fn cue_before(text: &[u8], at: usize, cues: &[&str]) -> bool {
    let from = at.saturating_sub(PHONE_CUE_WINDOW);
    (from..at).any(|i| {
        let starts_word = i == 0 || !text[i - 1].is_ascii_alphabetic();
        starts_word
            && cues.iter().any(|cue| {
                text[i..at]
                    .get(..cue.len())
                    .is_some_and(|w| w.eq_ignore_ascii_case(cue.as_bytes()))
            })
    })
}

/// Whether the words right before `at` are one of `cues`, then at most filler ("number",
/// "no.", "is", ":", "#"): "credit card 4123…", "Visa number: 4123…", not "card 4111…,
/// not 4123…".
fn named_just_before(text: &[u8], at: usize, cues: &[&str]) -> bool {
    const FILLER: &[&str] = &["number", "num", "no", "nr", "is", "was"];
    let mut words = text[..at]
        .split(|c| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .rev()
        .skip_while(|w| FILLER.iter().any(|f| w.eq_ignore_ascii_case(f.as_bytes())));
    let gap_is_plain = text[..at]
        .iter()
        .rev()
        .take_while(|c| !c.is_ascii_alphanumeric())
        .all(|c| b" :#\t".contains(c));
    gap_is_plain
        && words
            .next()
            .is_some_and(|w| cues.iter().any(|c| w.eq_ignore_ascii_case(c.as_bytes())))
}

/// South Korea's resident registration number: a birth date (YYMMDD), a sex and century
/// digit 1–8, six more. Numbers issued since October 2020 carry no check digit, so the date
/// and the format (a hyphen after the date) are what is validated.
fn kr_rrn_valid(d: &[u8]) -> bool {
    let month = d[2] * 10 + d[3];
    let day = d[4] * 10 + d[5];
    (1..=12).contains(&month) && (1..=31).contains(&day) && (1..=8).contains(&d[6])
}

/// Russia's SNILS (`123-456-789 01`): the last two digits are Σ dᵢ·(9 − i) mod 101, with 100
/// written as 00.
fn snils_valid(d: &[u8]) -> bool {
    let sum: u32 = d[..9]
        .iter()
        .enumerate()
        .map(|(i, &x)| u32::from(x) * (9 - i as u32))
        .sum();
    let check = sum % 101 % 100;
    check == u32::from(d[9]) * 10 + u32::from(d[10])
}

fn ssn_valid(d: &[u8]) -> bool {
    let area = u32::from(d[0]) * 100 + u32::from(d[1]) * 10 + u32::from(d[2]);
    let group = u32::from(d[3]) * 10 + u32::from(d[4]);
    let serial: u32 = d[5..].iter().fold(0, |a, &x| a * 10 + u32::from(x));
    area != 0 && area != 666 && area < 900 && group != 0 && serial != 0
}

#[cfg(test)]
mod tests {
    use crate::pii::{EntityKind, texts_of};

    fn phones(text: &str) -> Vec<String> {
        texts_of(text, EntityKind::Phone)
    }

    #[test]
    fn phones_with_extensions_prefixes_and_groupings() {
        for phone in [
            "212-555-0147x3321",
            "206.269.0743x9150",
            "+1-780-563-6083x7783",
            "001-541-754-3010",
            "001-541-754-3010x123",
            "(591)341-7776",
            "(783) 703-8836 ext. 12",
            "+44(0)115 4960914",
            "(0161) 4960066",
            "+49 (0) 9141 777631",
            "03662 585178",
            "+33 (0)1 41 63 60 83",
            "04 15 39 15 00",
            "+61.437.406.812",
            "(08)-8690-7366",
            "08-170 669 07",
            "609 141 777",
            "12 3915-0008",
            "555-0147",
            "881.428.6570",
            "106-690-7439 x150",
            "1 (786) 834-4978",
        ] {
            let text = format!("You can reach her on {phone}, thanks.");
            assert_eq!(phones(&text), vec![phone.to_string()], "{phone}");
        }
    }

    #[test]
    fn bare_digits_are_phones_only_after_a_phone_word() {
        assert_eq!(phones("call me at 5917776341 today"), vec!["5917776341"]);
        assert!(phones("order 5917776341 shipped").is_empty());
        assert_eq!(phones("Tel. 0961073668"), vec!["0961073668"]);
    }

    #[test]
    fn national_groupings_without_a_trunk_zero_after_a_phone_word() {
        for (text, phone) in [
            ("Phone: 47 512 903", "47 512 903"),
            ("you can call me on 47 512903 tonight", "47 512903"),
            ("mobile 612-345-678", "612-345-678"),
            ("reach the desk at 33 918 2204.", "33 918 2204"),
        ] {
            assert_eq!(phones(text), vec![phone.to_string()], "{text}");
        }
        for text in [
            "the grant was 47 512 903 crowns",
            "account 47 512903 is closed",
            "call me about the $12 345 678 deal",
            "call me on 2023-04-05",
            "phone bill of 12 345 678,50",
        ] {
            assert!(phones(text).is_empty(), "{text}: {:?}", phones(text));
        }
    }

    #[test]
    fn a_phone_in_a_urls_query_is_still_a_phone() {
        let text = "see https://example.com/contact?phone=212-555-0147 for more";
        assert_eq!(phones(text), vec!["212-555-0147".to_string()]);
    }

    #[test]
    fn dates_amounts_versions_and_ranges_are_not_phones() {
        for text in [
            "on 2023-04-05 we met",
            "on 05.04.2023 we met",
            "on 5/4/2023 we met",
            "it cost 1 500 000 euros",
            "population 12.345.678",
            "the 1990-2000 decade",
            "ZIP 62704-1234",
            "host 192.168.10.20",
            "build 10.0.19041",
            "pages 120-135",
            "2017 - 01 - 25 01:00:11.530490 (Sensor: 17)",
            "Latest level: 0.287 m at 17 / 03 / 2017 22:45:00 (GMT)",
            "jay dmb test 8 - 11 - 2016",
            "see https://arxiv.org/abs/0704.3116 for the method",
            "Emil Du Bois-Reymond (1818-1896), Rudolf Virchow (1821 - 1902)",
        ] {
            assert!(phones(text).is_empty(), "{text}: {:?}", phones(text));
        }
    }

    #[test]
    fn cards_of_every_length_and_issuer_range() {
        for card in [
            "676261983917",
            "4217232166849",
            "344341925412242",
            "30298063513968",
            "213159292244693",
            "6011278683873802",
            "2298288360759839",
            "4721851822225418940",
            "3782 822463 10005",
            "4111-1111-1111-1111",
        ] {
            let text = format!("card {card} please");
            assert_eq!(
                texts_of(&text, EntityKind::PaymentCard),
                vec![card.to_string()],
                "{card}"
            );
        }
        // Named as a card, any issuer range counts (Maestro's 0604 and a 12-digit number).
        assert_eq!(
            texts_of("my credit card is 060412345674.", EntityKind::PaymentCard),
            vec!["060412345674"]
        );
        // Called a card, a number whose check digit fails still is one.
        assert_eq!(
            texts_of(
                "charge my credit card 412345678901 today",
                EntityKind::PaymentCard
            ),
            vec!["412345678901"]
        );
        assert_eq!(
            texts_of("Visa number: 4123 4567 8901 2345", EntityKind::PaymentCard),
            vec!["4123 4567 8901 2345"]
        );
        // A Luhn-valid 12-digit number outside Maestro's ranges is an order number.
        assert!(texts_of("order 400000000002 shipped", EntityKind::PaymentCard).is_empty());
        // Phone-shaped groups are not a card even when the digits pass Luhn.
        assert!(texts_of("call 411-111-111-1111", EntityKind::PaymentCard).is_empty());
    }

    #[test]
    fn ssns_with_dashes_or_spaces() {
        assert_eq!(
            texts_of("SSN 123-45-6789.", EntityKind::UsSsn),
            vec!["123-45-6789"]
        );
        assert_eq!(
            texts_of("SSN 123 45 6789.", EntityKind::UsSsn),
            vec!["123 45 6789"]
        );
        assert!(texts_of("SSN 000-45-6789", EntityKind::UsSsn).is_empty());
    }
}
