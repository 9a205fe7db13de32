//! Personal data detection: typed spans found by linear scans and validated by checksums.

use serde::{Deserialize, Serialize};

/// A class of personal or secret data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntityKind {
    Email,
    PaymentCard,
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

/// Finds e-mail addresses and Luhn-valid card numbers in `text`, in one linear pass each.
pub fn detect(text: &str) -> Vec<Span> {
    let mut spans = Vec::new();
    let bytes = text.as_bytes();
    // E-mail: expand around each '@' over the characters an address may hold.
    for (at, _) in text.match_indices('@') {
        let local = bytes[..at]
            .iter()
            .rev()
            .take_while(|&&b| b.is_ascii_alphanumeric() || b"._%+-".contains(&b))
            .count();
        let domain = bytes[at + 1..]
            .iter()
            .take_while(|&&b| b.is_ascii_alphanumeric() || b".-".contains(&b))
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
    // Cards: runs of 13–19 digits, allowing single spaces or dashes between groups.
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() || (i > 0 && bytes[i - 1].is_ascii_digit()) {
            i += 1;
            continue;
        }
        let (mut j, mut digits) = (i, Vec::new());
        while j < bytes.len() {
            if bytes[j].is_ascii_digit() {
                digits.push(bytes[j] - b'0');
                j += 1;
            } else if (bytes[j] == b' ' || bytes[j] == b'-')
                && j + 1 < bytes.len()
                && bytes[j + 1].is_ascii_digit()
            {
                j += 1;
            } else {
                break;
            }
        }
        if (13..=19).contains(&digits.len()) && luhn_valid(&digits) {
            spans.push(Span {
                kind: EntityKind::PaymentCard,
                start: i,
                end: j,
                confidence: 0.9,
            });
        }
        i = j.max(i + 1);
    }
    spans.sort_by_key(|s| s.start);
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_email_and_valid_card_but_not_invalid_card() {
        let text =
            "mail me at jane.doe@example.com, card 4111 1111 1111 1111, not 4111 1111 1111 1112";
        let kinds: Vec<_> = detect(text)
            .iter()
            .map(|s| (s.kind, &text[s.start..s.end]))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (EntityKind::Email, "jane.doe@example.com"),
                (EntityKind::PaymentCard, "4111 1111 1111 1111")
            ]
        );
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
}
