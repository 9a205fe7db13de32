//! Personal data detection: typed spans found by linear scans and confirmed by validators
//! (Luhn for cards, mod-97 for IBANs, check digits for Chinese resident IDs), so a random
//! 16-digit number is not a card. No regular expressions: every scanner is one pass over
//! the bytes, so a hostile 1 MB prompt costs linear time.

mod address;
mod address_ja_ko_ru;
mod checks;
mod cues;
mod digits;
mod kinds;
mod names;
mod shapes;
pub mod tagger;

pub use checks::{cn_id_valid, iban_valid, luhn_valid};
pub use kinds::{EntityKind, Sensitivity, Span};

/// Finds every entity in `text`, sorted by position, overlaps resolved in favour of the
/// more confident, then longer, then earlier span.
pub fn detect(text: &str) -> Vec<Span> {
    detect_with(text, tagger::bundled().ok())
}

/// [`detect`] with another tagger for names, places and organisations, or none (the rules
/// alone), for evaluation.
pub fn detect_with(text: &str, tagger: Option<&tagger::Tagger>) -> Vec<Span> {
    let b = text.as_bytes();
    let mut spans = Vec::new();
    shapes::emails(text, &mut spans);
    digits::detect(b, &mut spans);
    shapes::ibans(b, &mut spans);
    shapes::ipv4(b, &mut spans);
    shapes::ipv6_and_mac(text, &mut spans);
    shapes::secrets(text, &mut spans);
    cues::detect(text, &mut spans);
    address::detect(text, &mut spans);
    address_ja_ko_ru::detect(text, &mut spans);
    names::detect(text, &mut spans);
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
    tagger::bundled()
        .map(tagger::Tagger::version)
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
        assert_eq!(
            found("iban: de89 3704 0044 0532 0130 00, thanks"),
            vec![(EntityKind::Iban, "de89 3704 0044 0532 0130 00")]
        );
        assert!(found("ab12 cdef ghij klmn opqr st").is_empty());
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
        assert!(checks::my_number_valid(b"123456789018"));
        assert!(!checks::my_number_valid(b"123456789017"));
        assert!(!checks::my_number_valid(b"12345678901"));
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
