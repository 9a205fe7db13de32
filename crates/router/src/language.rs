//! The language of a prompt, as the ISO 639-1 code the policy compares with the edge
//! model's `general.languages`: by script first (Han, kana, Hangul, Cyrillic, Arabic,
//! Devanagari, Greek, Hebrew, Thai), then, for Latin script, by the function words of the
//! seven most used Latin-script languages. A wrong "en" sends a prompt the edge model cannot
//! read to the edge, so anything clearly not English must say so.

use std::collections::HashMap;
use std::sync::OnceLock;

/// Latin-script prompts are judged on their first words only: enough to tell, and bounded.
const LATIN_WORDS_READ: usize = 400;

/// Bytes read to count scripts.
const SCRIPT_BYTES_READ: usize = 8 * 1024;

/// Votes at which a language has won: reading stops there.
const DECIDED: usize = 12;

/// Bytes of the longest word in `FUNCTION_WORDS` ("alsjeblieft").
const LONGEST_FUNCTION_WORD: usize = 12;

/// Short, frequent words that tell the Latin-script languages apart. A word may stand for
/// several languages ("de", "que"); the most votes win. Words that are also English ("as",
/// "per", "come", "was") or maths variables ("y", "o") are left out: they would out-vote
/// English on word problems.
const FUNCTION_WORDS: &[(&str, &[&str])] = &[
    (
        "en",
        &[
            "the", "and", "is", "are", "of", "to", "you", "what", "how", "it", "this", "that",
            "with", "for", "in", "into", "my", "me", "please", "can", "do", "i", "a", "an",
        ],
    ),
    (
        "fr",
        &[
            "le", "la", "les", "des", "est", "une", "et", "je", "vous", "dans", "qui", "pas",
            "avec", "ce", "sont", "de", "bonjour", "merci", "comment", "ça", "où", "quel",
            "quelle", "aussi", "mais", "très", "au", "aux", "du", "suis",
        ],
    ),
    (
        "de",
        &[
            "der", "die", "das", "und", "ist", "nicht", "ich", "sie", "ein", "eine", "zu", "mit",
            "für", "auf", "wie", "mein", "bitte", "danke", "hallo", "auch", "sind", "dem", "den",
            "warum", "kann", "können",
        ],
    ),
    (
        "es",
        &[
            "el", "la", "los", "las", "es", "una", "que", "de", "por", "para", "con", "del",
            "cómo", "qué", "está", "hola", "gracias", "mi", "yo", "muy", "pero", "también",
            "puedes", "dónde", "cuál",
        ],
    ),
    (
        "it",
        &[
            "il", "la", "gli", "della", "che", "è", "non", "una", "sono", "con", "di", "cosa",
            "ciao", "grazie", "mi", "io", "anche", "perché", "nel", "questo", "puoi",
        ],
    ),
    (
        "pt",
        &[
            "os", "não", "uma", "é", "para", "que", "da", "em", "como", "você", "olá", "obrigado",
            "obrigada", "meu", "minha", "muito", "também", "são", "onde", "qual", "pode",
        ],
    ),
    (
        "nl",
        &[
            "de",
            "het",
            "een",
            "en",
            "is",
            "niet",
            "ik",
            "je",
            "van",
            "voor",
            "met",
            "wat",
            "hoe",
            "zijn",
            "mijn",
            "alsjeblieft",
            "bedankt",
            "hallo",
            "ook",
            "waarom",
            "kun",
        ],
    ),
];

/// Letters counted per script.
#[derive(Default)]
struct Scripts {
    han: usize,
    kana: usize,
    hangul: usize,
    cyrillic: usize,
    ukrainian: usize,
    arabic: usize,
    devanagari: usize,
    greek: usize,
    hebrew: usize,
    thai: usize,
    latin: usize,
}

/// The prompt's language: an ISO 639-1 code.
pub fn detect(text: &str) -> &'static str {
    // Pure ASCII (most prompts) holds no other script: straight to the Latin vote.
    if text.is_ascii() {
        return latin(text);
    }
    // The opening kilobytes tell the script; a pasted megabyte is not read to the end.
    let mut head = text.len().min(SCRIPT_BYTES_READ);
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut s = Scripts::default();
    for c in text[..head].chars() {
        match c as u32 {
            0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0xF900..=0xFAFF => s.han += 1,
            0x3040..=0x30FF | 0x31F0..=0x31FF | 0xFF66..=0xFF9D => s.kana += 1,
            0xAC00..=0xD7AF | 0x1100..=0x11FF | 0x3130..=0x318F => s.hangul += 1,
            0x0400..=0x04FF => {
                s.cyrillic += 1;
                // і ї є ґ (either case) are Ukrainian, not Russian.
                s.ukrainian +=
                    usize::from(matches!(c, 'і' | 'ї' | 'є' | 'ґ' | 'І' | 'Ї' | 'Є' | 'Ґ'));
            }
            0x0600..=0x06FF | 0x0750..=0x077F => s.arabic += 1,
            0x0900..=0x097F => s.devanagari += 1,
            0x0370..=0x03FF => s.greek += 1,
            0x0590..=0x05FF => s.hebrew += 1,
            0x0E00..=0x0E7F => s.thai += 1,
            _ if c.is_alphabetic() => s.latin += 1,
            _ => {}
        }
    }
    // An ideograph or syllable carries about as much as a short Latin word; an alphabetic
    // letter about a fifth of one. The largest share of the text decides.
    let candidates = [
        // Japanese writes with Han and kana together; kana alone marks it.
        (if s.kana > 0 { "ja" } else { "zh" }, 3 * (s.han + s.kana)),
        ("ko", 3 * s.hangul),
        (
            if s.ukrainian * 50 >= s.cyrillic.max(1) && s.ukrainian > 0 {
                "uk"
            } else {
                "ru"
            },
            s.cyrillic,
        ),
        ("ar", s.arabic),
        ("hi", s.devanagari),
        ("el", s.greek),
        ("he", s.hebrew),
        ("th", s.thai),
    ];
    let (lang, weight) = candidates
        .iter()
        .copied()
        .max_by_key(|(_, w)| *w)
        .unwrap_or(("en", 0));
    // Three letters at least: a lone π or σ in a formula is maths, not Greek.
    if weight >= 3 && weight >= s.latin {
        return lang;
    }
    latin(text)
}

/// Each function word with the languages (bits, in `FUNCTION_WORDS` order) it votes for.
fn function_words() -> &'static HashMap<&'static str, u8> {
    static WORDS: OnceLock<HashMap<&'static str, u8>> = OnceLock::new();
    WORDS.get_or_init(|| {
        let mut map = HashMap::new();
        for (bit, (_, words)) in FUNCTION_WORDS.iter().enumerate() {
            for w in *words {
                *map.entry(*w).or_insert(0) |= 1 << bit;
            }
        }
        map
    })
}

/// The Latin-script language whose function words the prompt uses most.
fn latin(text: &str) -> &'static str {
    let words = function_words();
    let mut votes = [0usize; FUNCTION_WORDS.len()];
    let mut lower = String::new();
    for word in text
        .split(|c: char| !c.is_alphabetic())
        // Longer words are never function words: counted as read, not looked up.
        .filter(|w| !w.is_empty())
        .take(LATIN_WORDS_READ)
    {
        if word.len() > LONGEST_FUNCTION_WORD {
            continue;
        }
        lower.clear();
        lower.extend(word.chars().flat_map(char::to_lowercase));
        if let Some(&langs) = words.get(lower.as_str()) {
            for (bit, v) in votes.iter_mut().enumerate() {
                *v += usize::from(langs & (1 << bit) != 0);
            }
            // A language this far ahead has decided it; the rest is not read.
            if votes.iter().any(|&v| v >= DECIDED) {
                break;
            }
        }
    }
    let english = votes[0];
    FUNCTION_WORDS
        .iter()
        .zip(votes)
        .skip(1)
        // Another language needs two words of its own and twice English's votes: names
        // with particles ("Juan de la Cruz") stay inside English sentences.
        .enumerate()
        .filter(|(_, (_, v))| *v >= 2 && *v > 2 * english)
        // Among equal votes the language listed first wins, so the answer is stable.
        .max_by_key(|(i, (_, v))| (*v, std::cmp::Reverse(*i)))
        .map_or("en", |(_, ((lang, _), _))| lang)
}

#[cfg(test)]
mod tests {
    use super::detect;

    #[test]
    fn scripts_name_their_language() {
        assert_eq!(detect("What is the capital of France?"), "en");
        assert_eq!(detect("北京是中国的首都吗？"), "zh");
        assert_eq!(detect("Translate 你好 into English please, thanks"), "en");
        assert_eq!(detect("東京の天気はどうですか？"), "ja");
        assert_eq!(detect("カタカナだけ"), "ja");
        assert_eq!(detect("서울의 날씨는 어때요?"), "ko");
        assert_eq!(detect("Какая столица Франции?"), "ru");
        assert_eq!(detect("Яка столиця Франції? Скажіть, будь ласка."), "uk");
        assert_eq!(detect("ما هي عاصمة فرنسا؟"), "ar");
        assert_eq!(detect("फ्रांस की राजधानी क्या है?"), "hi");
        assert_eq!(detect("Ποια είναι η πρωτεύουσα της Γαλλίας;"), "el");
        assert_eq!(detect("מה הבירה של צרפת?"), "he");
        assert_eq!(detect("เมืองหลวงของฝรั่งเศสคืออะไร"), "th");
        // A word of another script inside an English request stays English.
        assert_eq!(detect("How do I say 'спасибо' politely?"), "en");
        assert_eq!(
            detect("Explain what 東京 means in one sentence, please."),
            "en"
        );
    }

    #[test]
    fn latin_script_languages_by_their_function_words() {
        assert_eq!(detect("Quelle est la capitale de la France ?"), "fr");
        assert_eq!(detect("Bonjour, comment ça va ? Je suis à Paris."), "fr");
        assert_eq!(
            detect("Wie ist das Wetter heute in Berlin? Ich bin müde."),
            "de"
        );
        assert_eq!(
            detect("¿Cuál es la capital de España? Gracias por la ayuda."),
            "es"
        );
        assert_eq!(
            detect("Qual è la capitale d'Italia? Grazie per l'aiuto, ciao."),
            "it"
        );
        assert_eq!(
            detect("Olá, você pode me ajudar com uma receita? Obrigado."),
            "pt"
        );
        assert_eq!(
            detect("Hoe is het weer vandaag? Ik ben moe en wil naar huis."),
            "nl"
        );
        // One foreign word, or a name, does not make English something else.
        assert_eq!(
            detect("Translate 'je ne sais pas' into English for me."),
            "en"
        );
        assert_eq!(detect("Summarise the report by Juan de la Cruz."), "en");
        assert_eq!(detect("Bonjour"), "en");
        assert_eq!(detect(""), "en");
        assert_eq!(detect("12345 ?!"), "en");
    }

    #[test]
    fn no_function_word_is_longer_than_the_bound() {
        for (_, words) in super::FUNCTION_WORDS {
            assert!(
                words
                    .iter()
                    .all(|w| w.len() <= super::LONGEST_FUNCTION_WORD),
                "{words:?}"
            );
        }
    }

    #[test]
    fn a_megabyte_is_read_in_bounded_time() {
        let big = "le ".repeat(400_000) + &"the ".repeat(10);
        assert_eq!(detect(&big), "fr");
    }

    #[test]
    fn english_benchmark_text_stays_english() {
        // RouteLLM's MT-Bench, GSM8K and MMLU files: word problems ("twice as many", "per
        // day") and formulas (μ, σ, π) that a careless guess calls Portuguese or Greek.
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/routellm");
        let Ok(mmlu) = std::fs::read_dir(dir.join("mmlu")) else {
            // Written past libtest's capture, so `cargo xtask test` counts the skip.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stdout(),
                "skipped: {} is absent (it lives outside the repo)",
                dir.display()
            );
            return;
        };
        let mut files = vec![
            dir.join("mt_bench_question.jsonl"),
            dir.join("gsm8k_responses.csv"),
        ];
        files.extend(mmlu.filter_map(|e| e.ok()).map(|e| e.path()));
        let mut lines = 0;
        for file in files {
            let text = std::fs::read_to_string(&file).expect("readable benchmark file");
            for line in text.lines() {
                lines += 1;
                assert_eq!(detect(line), "en", "{}: {line}", file.display());
            }
        }
        assert!(lines > 10_000, "{lines} lines read");
    }
}
