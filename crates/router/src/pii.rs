//! Personal data detection: typed spans found by linear scans and confirmed by validators
//! (Luhn for cards, mod-97 for IBANs, check digits for Chinese resident IDs), so a random
//! 16-digit number is not a card. No regular expressions: every scanner is one pass over
//! the bytes, so a hostile 1 MB prompt costs linear time.

use serde::{Deserialize, Serialize};

/// A class of personal or secret data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntityKind {
    Email,
    Phone,
    PaymentCard,
    Iban,
    UsSsn,
    CnResidentId,
    IpAddress,
    Secret,
    /// A person's name, found after a context cue.
    PersonName,
    /// A date of birth, found after a context cue.
    DateOfBirth,
    /// A first-person medical disclosure.
    MedicalContext,
    /// A network card's hardware address.
    MacAddress,
    /// A passport number, found after a context cue.
    Passport,
    /// A street address: a house number with a street name (en, de, fr, es, it, zh, ja, ko,
    /// ru).
    StreetAddress,
    /// A national identity number with its check or date validated: South Korea's resident
    /// registration number, Russia's SNILS, Japan's My Number (after its cue).
    NationalId,
}

/// How much harm a leak of an entity class does; the policy compares it with its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sensitivity {
    Low,
    Medium,
    High,
    Critical,
}

impl EntityKind {
    /// The class's wire name (as serde writes it), for messages that must never carry values.
    pub fn as_str(self) -> &'static str {
        match self {
            EntityKind::Email => "email",
            EntityKind::Phone => "phone",
            EntityKind::PaymentCard => "payment_card",
            EntityKind::Iban => "iban",
            EntityKind::UsSsn => "us_ssn",
            EntityKind::CnResidentId => "cn_resident_id",
            EntityKind::IpAddress => "ip_address",
            EntityKind::Secret => "secret",
            EntityKind::PersonName => "person_name",
            EntityKind::DateOfBirth => "date_of_birth",
            EntityKind::MedicalContext => "medical_context",
            EntityKind::MacAddress => "mac_address",
            EntityKind::Passport => "passport",
            EntityKind::StreetAddress => "street_address",
            EntityKind::NationalId => "national_id",
        }
    }

    /// The sensitivity of this class.
    pub fn sensitivity(self) -> Sensitivity {
        match self {
            EntityKind::IpAddress | EntityKind::MacAddress => Sensitivity::Low,
            EntityKind::Email
            | EntityKind::Phone
            | EntityKind::PersonName
            | EntityKind::StreetAddress => Sensitivity::Medium,
            EntityKind::PaymentCard
            | EntityKind::DateOfBirth
            | EntityKind::Passport
            | EntityKind::MedicalContext
            | EntityKind::Iban
            | EntityKind::UsSsn
            | EntityKind::CnResidentId
            | EntityKind::NationalId => Sensitivity::High,
            EntityKind::Secret => Sensitivity::Critical,
        }
    }
}

/// One detected entity: its class and byte range in the scanned text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub kind: EntityKind,
    pub start: usize,
    pub end: usize,
    pub confidence: f32,
}

/// Whether `digits` passes the Luhn checksum (payment cards).
pub fn luhn_valid(digits: &[u8]) -> bool {
    let mut sum = 0u32;
    for (i, &d) in digits.iter().rev().enumerate() {
        let mut v = u32::from(d);
        if i % 2 == 1 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    !digits.is_empty() && sum.is_multiple_of(10)
}

/// Whether `iban` (letters and digits, no spaces) passes ISO 13616's mod-97 check.
pub fn iban_valid(iban: &[u8]) -> bool {
    if !(15..=34).contains(&iban.len()) {
        return false;
    }
    let mut rem = 0u32;
    for &c in iban[4..].iter().chain(&iban[..4]) {
        let v = match c {
            b'0'..=b'9' => u32::from(c - b'0'),
            b'A'..=b'Z' => u32::from(c - b'A') + 10,
            _ => return false,
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}

/// Whether an 18-character Chinese resident ID has a valid check character (GB 11643).
pub fn cn_id_valid(id: &[u8]) -> bool {
    const W: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
    const CHECK: &[u8; 11] = b"10X98765432";
    if id.len() != 18 || !id[..17].iter().all(u8::is_ascii_digit) {
        return false;
    }
    let sum: u32 = id[..17]
        .iter()
        .zip(W)
        .map(|(&c, w)| u32::from(c - b'0') * w)
        .sum();
    CHECK[(sum % 11) as usize] == id[17].to_ascii_uppercase()
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Finds every entity in `text`, sorted by position, overlaps resolved in favour of the
/// earlier, then longer, span.
pub fn detect(text: &str) -> Vec<Span> {
    let b = text.as_bytes();
    let mut spans = Vec::new();
    emails(text, &mut spans);
    digit_runs(b, &mut spans);
    ibans(b, &mut spans);
    ipv4(b, &mut spans);
    ipv6_and_mac(text, &mut spans);
    secrets(text, &mut spans);
    crate::pii_cues::detect(text, &mut spans);
    crate::pii_address::detect(text, &mut spans);
    crate::pii_address_ja_ko_ru::detect(text, &mut spans);
    crate::pii_names::detect(text, &mut spans);
    spans.sort_by(|x, y| x.start.cmp(&y.start).then(y.end.cmp(&x.end)));
    let mut out: Vec<Span> = Vec::with_capacity(spans.len());
    for s in spans {
        if out.last().is_none_or(|l| s.start >= l.end) {
            out.push(s);
        }
    }
    out
}

/// The text of every span of `kind` that `detect` finds in `text`.
#[cfg(test)]
pub(crate) fn texts_of(text: &str, kind: EntityKind) -> Vec<String> {
    detect(text)
        .into_iter()
        .filter(|s| s.kind == kind)
        .map(|s| text[s.start..s.end].to_owned())
        .collect()
}

fn emails(text: &str, spans: &mut Vec<Span>) {
    let bytes = text.as_bytes();
    for (at, _) in text.match_indices('@') {
        let local = bytes[..at]
            .iter()
            .rev()
            .take_while(|&&c| c.is_ascii_alphanumeric() || b"._%+-".contains(&c))
            .count();
        let domain = bytes[at + 1..]
            .iter()
            .take_while(|&&c| c.is_ascii_alphanumeric() || b".-".contains(&c))
            .count();
        let dom = text[at + 1..at + 1 + domain].trim_end_matches('.');
        if local > 0 && dom.contains('.') && !dom.starts_with('.') {
            spans.push(Span {
                kind: EntityKind::Email,
                start: at - local,
                end: at + 1 + dom.len(),
                confidence: 0.95,
            });
        }
    }
}

/// Runs of digits with single separators: cards, phones, SSNs, Chinese IDs.
fn digit_runs(b: &[u8], spans: &mut Vec<Span>) {
    let mut i = 0;
    while i < b.len() {
        let plus = b[i] == b'+' && b.get(i + 1).is_some_and(u8::is_ascii_digit);
        let paren = b[i] == b'(' && b.get(i + 1).is_some_and(u8::is_ascii_digit);
        if !(b[i].is_ascii_digit() || plus || paren) || (i > 0 && is_word(b[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        let mut j = i + usize::from(plus || paren);
        let mut digits = Vec::new();
        let mut seps = Vec::new();
        while j < b.len() {
            let c = b[j];
            if c.is_ascii_digit() {
                digits.push(c - b'0');
                j += 1;
            } else if c == b' '
                && b.get(j + 1) == Some(&b'(')
                && b.get(j + 2).is_some_and(u8::is_ascii_digit)
            {
                // "8 (912) 345-67-89", "+7 (912) …": an area code in brackets.
                seps.push(b'(');
                j += 2;
            } else if matches!(c, b' ' | b'-' | b'.' | b')')
                && b.get(j + 1)
                    .is_some_and(|n| n.is_ascii_digit() || (c == b')' && *n == b' '))
            {
                seps.push(c);
                j += 1;
                if c == b')' && b.get(j) == Some(&b' ') {
                    j += 1;
                }
            } else {
                break;
            }
        }
        // An ID ending in X (Chinese resident ID).
        let x_tail = digits.len() == 17 && b.get(j).is_some_and(|c| c.eq_ignore_ascii_case(&b'X'));
        let end = if x_tail { j + 1 } else { j };
        if end < b.len() && is_word(b[end]) {
            i = end.max(i + 1);
            continue;
        }
        let n = digits.len();
        let text_digits: Vec<u8> = digits.iter().map(|d| d + b'0').collect();
        let kind = if seps.is_empty() && (n == 18 || x_tail) && {
            let mut id = text_digits.clone();
            if x_tail {
                id.push(b'X');
            }
            cn_id_valid(&id)
        } {
            Some((EntityKind::CnResidentId, 0.95))
        } else if (n == 13
            && seps == [b'-']
            && b.get(start + 6) == Some(&b'-')
            && kr_rrn_valid(&digits))
            || (n == 11
                && seps == [b'-', b'-', b' ']
                && b.get(start + 3) == Some(&b'-')
                && snils_valid(&digits))
        {
            // Korean resident registration number; Russian SNILS.
            Some((EntityKind::NationalId, 0.9))
        } else if (13..=19).contains(&n) && !plus && luhn_valid(&digits) {
            Some((EntityKind::PaymentCard, 0.9))
        } else if n == 9
            && seps == [b'-', b'-']
            && b.get(start + 3) == Some(&b'-')
            && ssn_valid(&digits)
        {
            Some((EntityKind::UsSsn, 0.9))
        } else if plus && (8..=15).contains(&n) {
            Some((EntityKind::Phone, 0.9))
        } else if n == 11 && seps.is_empty() && digits[0] == 1 && (3..=9).contains(&digits[1]) {
            Some((EntityKind::Phone, 0.85)) // Chinese mobile
        } else if n == 10 && !seps.is_empty() && (2..=9).contains(&digits[0]) {
            Some((EntityKind::Phone, 0.7)) // North American (xxx) xxx-xxxx
        } else if (9..=11).contains(&n) && !seps.is_empty() && digits[0] == 0 && digits[1] != 0 {
            // A national number behind its trunk prefix 0: Japan "090-1234-5678", Korea
            // "010-1234-5678", UK "020 7946 0958", France "06 12 34 56 78", Germany.
            Some((EntityKind::Phone, 0.7))
        } else if n == 11 && !seps.is_empty() && digits[0] == 8 && digits[1] == 9 {
            Some((EntityKind::Phone, 0.7)) // Russian mobile "8 (912) 345-67-89"
        } else {
            None
        };
        if let Some((kind, confidence)) = kind {
            spans.push(Span {
                kind,
                start,
                end,
                confidence,
            });
        }
        i = end.max(i + 1);
    }
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

/// Japan's My Number: twelve digits, the last a check digit over the first eleven.
pub(crate) fn my_number_valid(d: &[u8]) -> bool {
    if d.len() != 12 || d.iter().any(|c| !c.is_ascii_digit()) {
        return false;
    }
    let sum: u32 = (1..=11)
        .map(|n| {
            let p = u32::from(d[11 - n] - b'0');
            let q = if n <= 6 { n as u32 + 1 } else { n as u32 - 5 };
            p * q
        })
        .sum();
    let r = sum % 11;
    let check = if r <= 1 { 0 } else { 11 - r };
    check == u32::from(d[11] - b'0')
}

fn ssn_valid(d: &[u8]) -> bool {
    let area = u32::from(d[0]) * 100 + u32::from(d[1]) * 10 + u32::from(d[2]);
    let group = u32::from(d[3]) * 10 + u32::from(d[4]);
    let serial: u32 = d[5..].iter().fold(0, |a, &x| a * 10 + u32::from(x));
    area != 0 && area != 666 && area < 900 && group != 0 && serial != 0
}

fn ibans(b: &[u8], spans: &mut Vec<Span>) {
    let mut i = 0;
    while i + 4 <= b.len() {
        let starts = b[i].is_ascii_uppercase()
            && b[i + 1].is_ascii_uppercase()
            && b[i + 2].is_ascii_digit()
            && b[i + 3].is_ascii_digit();
        if !starts || (i > 0 && is_word(b[i - 1])) {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut compact = Vec::new();
        while j < b.len() && compact.len() < 34 {
            if b[j].is_ascii_digit() || b[j].is_ascii_uppercase() {
                compact.push(b[j]);
                j += 1;
            } else if b[j] == b' '
                && b.get(j + 1).is_some_and(|c| c.is_ascii_alphanumeric())
                && compact.len() % 4 == 0
            {
                j += 1;
            } else {
                break;
            }
        }
        // Trim trailing groups until the checksum holds (a sentence may follow the IBAN).
        let mut found = None;
        let mut len = compact.len();
        while len >= 15 {
            if iban_valid(&compact[..len]) {
                found = Some(len);
                break;
            }
            len -= 1;
        }
        if let Some(len) = found {
            let mut end = i;
            let mut seen = 0;
            while seen < len {
                if b[end] != b' ' {
                    seen += 1;
                }
                end += 1;
            }
            spans.push(Span {
                kind: EntityKind::Iban,
                start: i,
                end,
                confidence: 0.95,
            });
            i = end;
        } else {
            i += 1;
        }
    }
}

fn ipv4(b: &[u8], spans: &mut Vec<Span>) {
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() || (i > 0 && (is_word(b[i - 1]) || b[i - 1] == b'.')) {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut octets = 0;
        let ok = loop {
            let s = j;
            let mut v = 0u32;
            while j < b.len() && b[j].is_ascii_digit() && j - s < 3 {
                v = v * 10 + u32::from(b[j] - b'0');
                j += 1;
            }
            if j == s || v > 255 || (j < b.len() && b[j].is_ascii_digit()) {
                break false;
            }
            octets += 1;
            if octets == 4 {
                break j >= b.len()
                    || !(is_word(b[j])
                        || (b[j] == b'.' && b.get(j + 1).is_some_and(u8::is_ascii_digit)));
            }
            if b.get(j) != Some(&b'.') {
                break false;
            }
            j += 1;
        };
        if ok {
            spans.push(Span {
                kind: EntityKind::IpAddress,
                start: i,
                end: j,
                confidence: 0.8,
            });
            i = j;
        } else {
            i += 1;
        }
    }
}

/// IPv6 addresses (validated by the standard parser) and MAC addresses (six pairs of hex
/// digits joined by one kind of separator), found among runs of hex digits, `:`, `-`, `.`.
fn ipv6_and_mac(text: &str, spans: &mut Vec<Span>) {
    let b = text.as_bytes();
    let in_run = |c: u8| c.is_ascii_hexdigit() || c == b':' || c == b'-' || c == b'.';
    let mut i = 0;
    while i < b.len() {
        if !in_run(b[i]) || (i > 0 && is_word(b[i - 1])) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && in_run(b[j]) {
            j += 1;
        }
        // A sentence may end right after the address.
        let mut end = j;
        while end > i && matches!(b[end - 1], b'.' | b'-' | b':') && !text[i..end].ends_with("::") {
            end -= 1;
        }
        let followed_by_word = b.get(j).is_some_and(|c| is_word(*c));
        let token = &text[i..end];
        if !followed_by_word {
            if is_mac(token.as_bytes()) {
                spans.push(Span {
                    kind: EntityKind::MacAddress,
                    start: i,
                    end,
                    confidence: 0.9,
                });
            } else if token.matches(':').count() >= 2
                && token.bytes().filter(u8::is_ascii_hexdigit).count() >= 3
                && token.parse::<std::net::Ipv6Addr>().is_ok()
            {
                spans.push(Span {
                    kind: EntityKind::IpAddress,
                    start: i,
                    end,
                    confidence: 0.85,
                });
            }
        }
        i = j.max(i + 1);
    }
}

fn is_mac(t: &[u8]) -> bool {
    if t.len() != 17 {
        return false;
    }
    let sep = t[2];
    (sep == b':' || sep == b'-')
        && t.chunks(3).all(|g| {
            g[0].is_ascii_hexdigit()
                && g[1].is_ascii_hexdigit()
                && g.get(2).is_none_or(|&c| c == sep)
        })
}

/// Tokens that start with `prefix` and run while `in_token` holds, kept when `is_secret`
/// accepts the whole token. Matches inside the token last measured are skipped, so
/// "eyJeyJeyJ…" costs one pass, not one pass per match.
fn prefixed_tokens(
    text: &str,
    prefix: &str,
    in_token: impl Fn(u8) -> bool,
    is_secret: impl Fn(&str) -> bool,
    confidence: f32,
    spans: &mut Vec<Span>,
) {
    let b = text.as_bytes();
    let mut until = 0;
    for (i, _) in text.match_indices(prefix) {
        if i < until {
            continue;
        }
        let body = i + prefix.len();
        until = body + b[body..].iter().take_while(|&&c| in_token(c)).count();
        if (i == 0 || !is_word(b[i - 1])) && is_secret(&text[i..until]) {
            spans.push(Span {
                kind: EntityKind::Secret,
                start: i,
                end: until,
                confidence,
            });
        }
    }
}

fn secrets(text: &str, spans: &mut Vec<Span>) {
    let key_char = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_';
    prefixed_tokens(
        text,
        "AKIA",
        |c| c.is_ascii_uppercase() || c.is_ascii_digit(),
        |t| t.len() == 20,
        0.95,
        spans,
    );
    prefixed_tokens(text, "sk-", key_char, |t| t.len() >= 23, 0.9, spans);
    prefixed_tokens(
        text,
        "eyJ",
        |c| key_char(c) || c == b'.',
        |t| t.split('.').count() == 3 && t.split('.').all(|p| p.len() >= 4) && t.contains(".eyJ"),
        0.95,
        spans,
    );
    let mut until = 0;
    for (i, _) in text.match_indices("-----BEGIN ") {
        if i < until {
            continue;
        }
        let head_end = text[i..].find('\n').map_or(text.len(), |k| i + k);
        until = head_end;
        if text[i..head_end].contains("PRIVATE KEY-----") {
            let end = text[head_end..]
                .find("-----END ")
                .and_then(|k| {
                    text[head_end + k..]
                        .find("KEY-----")
                        .map(|m| head_end + k + m + 8)
                })
                .unwrap_or(head_end);
            until = end;
            spans.push(Span {
                kind: EntityKind::Secret,
                start: i,
                end,
                confidence: 0.99,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str) -> Vec<(EntityKind, &str)> {
        detect(text)
            .into_iter()
            .map(|s| (s.kind, &text[s.start..s.end]))
            .collect()
    }

    #[test]
    fn finds_email_and_valid_card_but_not_invalid_card() {
        let text =
            "mail me at jane.doe@example.com, card 4111 1111 1111 1111, not 4111 1111 1111 1112";
        assert_eq!(
            found(text),
            vec![
                (EntityKind::Email, "jane.doe@example.com"),
                (EntityKind::PaymentCard, "4111 1111 1111 1111")
            ]
        );
    }

    #[test]
    fn names_match_the_wire_format() {
        for k in [
            EntityKind::Email,
            EntityKind::Phone,
            EntityKind::PaymentCard,
            EntityKind::Iban,
            EntityKind::UsSsn,
            EntityKind::CnResidentId,
            EntityKind::IpAddress,
            EntityKind::Secret,
            EntityKind::StreetAddress,
        ] {
            assert_eq!(serde_json::to_value(k).expect("ser"), k.as_str());
        }
    }

    #[test]
    fn luhn() {
        assert!(luhn_valid(&[
            4, 5, 3, 9, 1, 4, 8, 8, 0, 3, 4, 3, 6, 4, 6, 7
        ]));
        assert!(!luhn_valid(&[
            4, 5, 3, 9, 1, 4, 8, 8, 0, 3, 4, 3, 6, 4, 6, 8
        ]));
    }

    #[test]
    fn iban_with_spaces_validated_by_mod_97() {
        assert_eq!(
            found("pay to GB82 WEST 1234 5698 7654 32 today"),
            vec![(EntityKind::Iban, "GB82 WEST 1234 5698 7654 32")]
        );
        assert!(found("pay to GB82 WEST 1234 5698 7654 33 today").is_empty());
        assert_eq!(
            found("DE89370400440532013000"),
            vec![(EntityKind::Iban, "DE89370400440532013000")]
        );
    }

    #[test]
    fn ssn_and_chinese_id_with_check_digit() {
        assert_eq!(
            found("SSN 123-45-6789."),
            vec![(EntityKind::UsSsn, "123-45-6789")]
        );
        assert!(found("SSN 000-45-6789").is_empty());
        assert_eq!(
            found("身份证号11010519491231002X，"),
            vec![(EntityKind::CnResidentId, "11010519491231002X")]
        );
        assert!(
            found("身份证号110105194912310021，")
                .iter()
                .all(|(k, _)| *k != EntityKind::CnResidentId)
        );
    }

    #[test]
    fn phones_in_international_us_and_chinese_formats() {
        assert_eq!(
            found("call +44 20 7946 0958"),
            vec![(EntityKind::Phone, "+44 20 7946 0958")]
        );
        assert_eq!(
            found("call (415) 555-2671 now"),
            vec![(EntityKind::Phone, "(415) 555-2671")]
        );
        assert_eq!(
            found("手机13812345678"),
            vec![(EntityKind::Phone, "13812345678")]
        );
        assert!(found("in 2024 we sold 1500 units").is_empty());
    }

    #[test]
    fn national_phone_formats_behind_a_trunk_prefix() {
        for phone in [
            "090-1234-5678",
            "03-1234-5678",
            "010-1234-5678",
            "02-123-4567",
            "020 7946 0958",
            "06 12 34 56 78",
            "030 12345678",
            "8 (912) 345-67-89",
            "+7 (912) 345-67-89",
        ] {
            let text = format!("電話 / call {phone}, thanks");
            assert_eq!(found(&text), vec![(EntityKind::Phone, phone)], "{phone}");
        }
        // Dates, versions and counts are not phones.
        for text in [
            "on 01.02.2023",
            "v0.12.3",
            "0 1 2",
            "scored 89 (of 100) points",
        ] {
            assert!(found(text).is_empty(), "{text}: {:?}", found(text));
        }
    }

    #[test]
    fn korean_resident_numbers_russian_snils_and_japanese_my_numbers() {
        assert_eq!(
            found("주민등록번호 900101-1234567 입니다"),
            vec![(EntityKind::NationalId, "900101-1234567")]
        );
        // Month 13 is no birth date.
        assert!(
            found("주문번호 901301-1234567")
                .iter()
                .all(|(k, _)| *k != EntityKind::NationalId)
        );
        assert_eq!(
            found("СНИЛС 112-233-445 95."),
            vec![(EntityKind::NationalId, "112-233-445 95")]
        );
        assert!(found("СНИЛС 112-233-445 96.").is_empty(), "check digits");
        assert!(my_number_valid(b"123456789018"));
        assert!(!my_number_valid(b"123456789017"));
        assert!(!my_number_valid(b"12345678901"));
        assert_eq!(
            serde_json::to_value(EntityKind::NationalId).expect("ser"),
            "national_id"
        );
    }

    #[test]
    fn ip_addresses_and_not_versions() {
        assert_eq!(
            found("server 192.168.1.20 is down"),
            vec![(EntityKind::IpAddress, "192.168.1.20")]
        );
        assert!(found("version 1.2.3 and 300.1.1.1").is_empty());
    }

    #[test]
    fn ipv6_and_mac_addresses() {
        let text = "Server 2001:db8:85a3::8a2e:370:7334 and loopback ::1, NIC 00:1A:2B:3C:4D:5E or 00-1a-2b-3c-4d-5e.";
        let kinds: Vec<_> = detect(text)
            .into_iter()
            .map(|s| (s.kind, text[s.start..s.end].to_owned()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (
                    EntityKind::IpAddress,
                    "2001:db8:85a3::8a2e:370:7334".to_owned()
                ),
                (EntityKind::MacAddress, "00:1A:2B:3C:4D:5E".to_owned()),
                (EntityKind::MacAddress, "00-1a-2b-3c-4d-5e".to_owned()),
            ]
        );
        // Clock times, ratios and hex words are not addresses.
        assert!(detect("Meet at 10:30:45, ratio 3:2:1, colour dead:beef.").is_empty());
    }

    #[test]
    fn secrets() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlLXZhbHVl";
        let text = format!(
            "key AKIAIOSFODNN7EXAMPLE and sk-abcdefghijklmnopqrstuvwx and {jwt}\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----"
        );
        let kinds: Vec<_> = detect(&text).into_iter().map(|s| s.kind).collect();
        assert_eq!(kinds, vec![EntityKind::Secret; 4]);
    }

    #[test]
    fn megabyte_of_adversarial_input_is_linear() {
        // Each input repeats what would make a naive scanner re-read the rest of the text at
        // every match; quadratic work on 1 MB would take minutes, linear takes milliseconds.
        let mb = |unit: &str| unit.repeat((1 << 20) / unit.len());
        let inputs = [
            mb("1-2-3-4-5-6-7-8-9-0 @@@@a@b GB82WEST 1.1.1. eyJ.eyJ. sk- AKIA "),
            mb("eyJ"),
            mb("sk-"),
            mb("AKIA"),
            mb("-----BEGIN "),
            mb("1-"),
            mb("GB82"),
            format!("{}@", "a".repeat(1 << 20)),
            mb("a@"),
            mb("1."),
        ];
        for text in &inputs {
            let t = std::time::Instant::now();
            let _ = detect(text);
            assert!(
                t.elapsed() < std::time::Duration::from_secs(2),
                "{:?}…: {:?}",
                &text[..12],
                t.elapsed()
            );
        }
    }
}
