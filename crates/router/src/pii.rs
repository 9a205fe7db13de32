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
    /// A driver's licence number, found after a context cue.
    DriverLicense,
    /// A city, region or country, found by the tagger.
    Location,
    /// A company or other organisation, found by the tagger.
    Organization,
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
            EntityKind::DriverLicense => "driver_license",
            EntityKind::Location => "location",
            EntityKind::Organization => "organization",
            EntityKind::StreetAddress => "street_address",
            EntityKind::NationalId => "national_id",
        }
    }

    /// Whether the class identifies no one by itself (a place, an organisation).
    pub fn is_context(self) -> bool {
        matches!(self, EntityKind::Location | EntityKind::Organization)
    }

    /// The sensitivity of this class.
    pub fn sensitivity(self) -> Sensitivity {
        match self {
            EntityKind::IpAddress
            | EntityKind::MacAddress
            | EntityKind::Location
            | EntityKind::Organization => Sensitivity::Low,
            EntityKind::Email
            | EntityKind::Phone
            | EntityKind::PersonName
            | EntityKind::StreetAddress => Sensitivity::Medium,
            EntityKind::PaymentCard
            | EntityKind::DateOfBirth
            | EntityKind::Passport
            | EntityKind::DriverLicense
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

pub(crate) fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Finds every entity in `text`, sorted by position, overlaps resolved in favour of the
/// more confident, then longer, then earlier span.
pub fn detect(text: &str) -> Vec<Span> {
    detect_with(text, crate::pii_tagger::bundled().ok())
}

/// [`detect`] with another tagger for names, places and organisations, or none (the rules
/// alone), for evaluation.
pub fn detect_with(text: &str, tagger: Option<&crate::pii_tagger::Tagger>) -> Vec<Span> {
    let b = text.as_bytes();
    let mut spans = Vec::new();
    emails(text, &mut spans);
    crate::pii_digits::detect(b, &mut spans);
    ibans(b, &mut spans);
    ipv4(b, &mut spans);
    ipv6_and_mac(text, &mut spans);
    secrets(text, &mut spans);
    crate::pii_cues::detect(text, &mut spans);
    crate::pii_address::detect(text, &mut spans);
    crate::pii_address_ja_ko_ru::detect(text, &mut spans);
    crate::pii_names::detect(text, &mut spans);
    if let Some(tagger) = tagger {
        spans.extend(tagger.tag(text));
    }
    // Overlaps go to the more confident span (a validated card over a tagger's guess), then
    // the longer, then the earlier.
    spans.sort_by(|x, y| {
        let by_confidence = y.confidence.total_cmp(&x.confidence);
        let by_length = (y.end - y.start).cmp(&(x.end - x.start));
        by_confidence.then(by_length).then(x.start.cmp(&y.start))
    });
    // Accepted spans by start: a new span is free when the nearest accepted span before it
    // ends by its start and the next one starts at or after its end (n log n in all).
    let mut taken: std::collections::BTreeMap<usize, Span> = std::collections::BTreeMap::new();
    for s in spans {
        let before_free = taken
            .range(..=s.start)
            .next_back()
            .is_none_or(|(_, o)| o.end <= s.start);
        let after_free = taken
            .range(s.start..)
            .next()
            .is_none_or(|(&start, _)| start >= s.end);
        if before_free && after_free {
            taken.insert(s.start, s);
        }
    }
    taken.into_values().collect()
}

/// The spans of `detect` that are personal data: places and organisations count only in a
/// text that also holds something that identifies someone ("Springfield" alone is a place,
/// beside a name it narrows down who).
pub fn detect_personal(text: &str) -> Vec<Span> {
    let spans = detect(text);
    let identifies = spans.iter().any(|s| !s.kind.is_context());
    spans
        .into_iter()
        .filter(|s| identifies || !s.kind.is_context())
        .collect()
}

/// The bundled name tagger's version, or why it could not be loaded (then names, places
/// and organisations without cue words go undetected, and callers must fail closed).
pub fn tagger_version() -> Result<String, String> {
    crate::pii_tagger::bundled()
        .map(crate::pii_tagger::Tagger::version)
        .map_err(ToString::to_string)
}

/// The text of every span of `kind` that the rules alone find in `text` (each scanner's
/// tests; the tagger has its own).
#[cfg(test)]
pub(crate) fn texts_of(text: &str, kind: EntityKind) -> Vec<String> {
    detect_with(text, None)
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
        detect_with(text, None)
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
        let kinds: Vec<_> = detect_with(text, None)
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
        assert!(detect_with("Meet at 10:30:45, ratio 3:2:1, colour dead:beef.", None).is_empty());
    }

    #[test]
    fn secrets() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlLXZhbHVl";
        let text = format!(
            "key AKIAIOSFODNN7EXAMPLE and sk-abcdefghijklmnopqrstuvwx and {jwt}\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----"
        );
        let kinds: Vec<_> = detect_with(&text, None)
            .into_iter()
            .map(|s| s.kind)
            .collect();
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

    #[test]
    fn the_issues_greeting_card_is_found_whole() {
        let text = "Please write a two-line greeting card for Johanna Kessler. She lives at 742 \
                    Evergreen Terrace, Springfield and her number is 212-555-0147x3321.";
        let found: Vec<(EntityKind, &str)> = detect(text)
            .into_iter()
            .map(|s| (s.kind, &text[s.start..s.end]))
            .collect();
        for want in [
            (EntityKind::PersonName, "Johanna Kessler"),
            (EntityKind::Phone, "212-555-0147x3321"),
        ] {
            assert!(found.contains(&want), "{want:?} in {found:?}");
        }
        assert!(
            found
                .iter()
                .any(|(k, t)| *k == EntityKind::StreetAddress
                    && t.starts_with("742 Evergreen Terrace")),
            "{found:?}"
        );
    }

    #[test]
    fn a_validated_number_beats_the_taggers_guess() {
        let text = "Charge 4012524982139351 for the annual plan.";
        assert_eq!(
            detect(text).iter().map(|s| s.kind).collect::<Vec<_>>(),
            [EntityKind::PaymentCard]
        );
    }

    #[test]
    fn places_alone_are_not_personal_data() {
        let question = "What is the capital of France?";
        assert!(
            detect(question)
                .iter()
                .any(|s| s.kind == EntityKind::Location)
        );
        assert!(detect_personal(question).is_empty());
        let with_name = "Send it to Johanna Kessler in Springfield.";
        let kinds: Vec<_> = detect_personal(with_name).iter().map(|s| s.kind).collect();
        assert!(kinds.contains(&EntityKind::Location), "{kinds:?}");
    }
}
