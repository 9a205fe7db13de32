//! Personal data and secrets known by their shape: e-mail addresses, IBANs, IPv4, IPv6 and
//! MAC addresses, API keys and tokens.

use super::checks::{iban_valid, is_word};
use super::kinds::{EntityKind, Span};

pub(super) fn emails(text: &str, spans: &mut Vec<Span>) {
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

pub(super) fn ibans(b: &[u8], spans: &mut Vec<Span>) {
    let mut i = 0;
    while i + 4 <= b.len() {
        // People paste IBANs in lower case too; the mod-97 check keeps words out.
        let starts = b[i].is_ascii_alphabetic()
            && b[i + 1].is_ascii_alphabetic()
            && b[i + 2].is_ascii_digit()
            && b[i + 3].is_ascii_digit();
        if !starts || (i > 0 && is_word(b[i - 1])) {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut compact = Vec::new();
        while j < b.len() && compact.len() < 34 {
            if b[j].is_ascii_alphanumeric() {
                compact.push(b[j].to_ascii_uppercase());
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

pub(super) fn ipv4(b: &[u8], spans: &mut Vec<Span>) {
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
pub(super) fn ipv6_and_mac(text: &str, spans: &mut Vec<Span>) {
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

pub(super) fn secrets(text: &str, spans: &mut Vec<Span>) {
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
