//! Check digits and byte classes the scanners confirm a match with, so a random 16-digit
//! number is not a card.

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

pub(super) fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Japan's My Number: twelve digits, the last a check digit over the first eleven.
pub(super) fn my_number_valid(d: &[u8]) -> bool {
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
