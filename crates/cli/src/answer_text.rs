//! Reading a model's answer text the way a person would: the option letter, the choice or
//! the final number it gives.

/// The option letter a chat answer gives for a multiple-choice prompt: "B", "B.", "(B)",
/// "**B**", `\boxed{B}`, the last of "The answer is B", "Answer: B", "option B" or "choice B",
/// or else the text of exactly one of the prompt's options.
pub fn parse_letter(answer: &str, prompt: &str) -> Option<char> {
    let letters = option_letters(prompt);
    if let Some(c) = leading_letter(answer.trim(), &letters) {
        return Some(c);
    }
    if let Some(c) = last_cued_letter(answer, &letters) {
        return Some(c);
    }
    let lower = answer.to_lowercase();
    // The text of one option, and no other, named in the answer.
    let named: Vec<char> = option_texts(prompt)
        .into_iter()
        .filter(|(_, text)| text.len() > 1 && lower.contains(&text.to_lowercase()))
        .map(|(c, _)| c)
        .collect();
    match named[..] {
        [c] => Some(c),
        _ => None,
    }
}

/// Whether a partial answer opens with its letter, so no later text can change what
/// [`parse_letter`] reads: a lone "A" may yet be the article, so the letter must stand
/// whatever word comes next.
pub fn opens_with_letter(answer: &str, prompt: &str) -> bool {
    let then_a_word = format!("{}x", answer.trim_start());
    leading_letter(&then_a_word, &option_letters(prompt)).is_some()
}

/// An option letter standing alone at the text's start, after any opening marks; "A"
/// before a space is the article.
fn leading_letter(text: &str, letters: &[char]) -> Option<char> {
    let text = text.trim_start_matches([' ', ':', '*', '(', '[', '$', '\\', '{']);
    let mut chars = text.strip_prefix("boxed{").unwrap_or(text).chars();
    let (c, next) = (chars.next()?, chars.next());
    let ends = match next {
        None => true,
        Some(' ') => c != 'A',
        Some(n) => !n.is_alphanumeric(),
    };
    (letters.contains(&c) && ends).then_some(c)
}

/// The letter after the answer's last cue: a chat model that reasons first names the
/// options it weighs before the one it concludes with. An answer's cue may put its letter
/// on a line of its own; "option:" before a line break opens a list of them instead.
fn last_cued_letter(answer: &str, letters: &[char]) -> Option<char> {
    let lower = answer.to_lowercase();
    let cues = [
        ("answer is", true),
        ("answer:", true),
        ("option", false),
        ("choice", false),
    ];
    cues.iter()
        .flat_map(|&(cue, across_lines)| {
            let ends = lower.match_indices(cue).map(|(at, _)| at + cue.len());
            ends.map(move |end| (end, across_lines))
        })
        // Lower-casing may move a non-ASCII answer's offsets: then the cue reads nothing.
        .filter_map(|(end, across_lines)| {
            let rest = answer.get(end..)?;
            let rest = if across_lines {
                rest.trim_start_matches([' ', ':', '\n'])
            } else {
                rest
            };
            Some((end, leading_letter(rest, letters)?))
        })
        .max_by_key(|&(end, _)| end)
        .map(|(_, c)| c)
}

/// The letters of the prompt's options (`A. …` at a line's start).
fn option_letters(prompt: &str) -> Vec<char> {
    option_texts(prompt).into_iter().map(|(c, _)| c).collect()
}

/// Each option line's letter and text.
fn option_texts(prompt: &str) -> Vec<(char, String)> {
    prompt
        .lines()
        .filter_map(|l| {
            let l = l.trim_start().trim_start_matches('(');
            let mut chars = l.chars();
            let (c, sep) = (chars.next()?, chars.next()?);
            (c.is_ascii_uppercase() && matches!(sep, '.' | ')' | ':'))
                .then(|| (c, chars.as_str().trim().to_string()))
        })
        .collect()
}

/// The choice a chat answer names: the one that appears first as a whole word or phrase
/// (case aside); else the one whose first word the answer's first word begins, or is begun
/// by ("Sad" for "sadness"), when exactly one is; `None` when none does.
pub fn parse_choice(answer: &str, choices: &[String]) -> Option<usize> {
    let lower = answer.to_lowercase();
    let whole = choices
        .iter()
        .enumerate()
        .filter_map(|(i, c)| Some((first_whole(&lower, &c.to_lowercase())?, i)))
        .min_by_key(|&(at, i)| (at, std::cmp::Reverse(choices[i].len())))
        .map(|(_, i)| i);
    whole.or_else(|| same_stem(&lower, choices))
}

/// The one choice whose first word shares a stem of three or more letters with the answer's
/// first word: the first as a prefix of the other.
fn same_stem(lower: &str, choices: &[String]) -> Option<usize> {
    let first_word = |s: &str| -> String {
        let s = s.trim_start_matches(|c: char| !c.is_alphanumeric());
        s.chars().take_while(|c| c.is_alphanumeric()).collect()
    };
    let word = first_word(lower);
    if word.chars().count() < 3 {
        return None;
    }
    let stems: Vec<usize> = (0..choices.len())
        .filter(|&i| {
            let c = first_word(&choices[i].to_lowercase());
            c.chars().count() >= 3 && (c.starts_with(&word) || word.starts_with(&c))
        })
        .collect();
    match stems[..] {
        [i] => Some(i),
        _ => None,
    }
}

/// Where `needle` first stands in `hay` as a whole word or phrase.
fn first_whole(hay: &str, needle: &str) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    let is_word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    hay.match_indices(needle).map(|(at, _)| at).find(|&at| {
        !is_word(hay[..at].chars().next_back()) && !is_word(hay[at + needle.len()..].chars().next())
    })
}

/// The last number in a text (`1,234.5` reads as 1234.5), the usual GSM8K grading.
pub fn final_number(text: &str) -> Option<f64> {
    let mut last = None;
    let mut current = String::new();
    for c in text.chars().chain([' ']) {
        if c.is_ascii_digit()
            || (c == '.' && !current.is_empty())
            || (c == ',' && !current.is_empty())
        {
            current.push(c);
        } else if !current.is_empty() {
            let cleaned: String = current.trim_end_matches(['.', ',']).replace(',', "");
            last = cleaned.parse().ok().or(last);
            current.clear();
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_number_is_read_as_gsm8k_grades_it() {
        assert_eq!(final_number("16 - 3 - 4 = 9, so 9 * 2 = $18."), Some(18.0));
        assert_eq!(final_number("The answer is 1,234.5 dollars"), Some(1234.5));
        assert_eq!(final_number("no digits"), None);
        assert_eq!(final_number("3 apples and 12."), Some(12.0));
    }

    #[test]
    fn a_chat_answer_to_a_lettered_question_is_read_as_a_person_would() {
        let prompt = "Which is a prime?\nA. 4\nB. 6\nC. 7 (seven)\nD. 9\nAnswer:";
        assert_eq!(parse_letter("C", prompt), Some('C'));
        assert_eq!(parse_letter("(C) 7", prompt), Some('C'));
        assert_eq!(parse_letter("**C. 7 (seven)**", prompt), Some('C'));
        assert_eq!(parse_letter("The answer is C.", prompt), Some('C'));
        assert_eq!(
            parse_letter("It is 7 (seven), the only prime.", prompt),
            Some('C')
        );
        // An article is not an option, and naming two options answers neither.
        assert_eq!(parse_letter("A prime has two divisors.", prompt), None);
        assert_eq!(
            parse_letter("Both 4 (even) and 7 (seven)", prompt),
            Some('C')
        );
        assert_eq!(parse_letter("E", prompt), None);
        assert_eq!(
            parse_letter("So the answer is \\(\\boxed{C}\\).", prompt),
            Some('C')
        );
        assert_eq!(
            parse_letter(
                "Let's weigh each option:\n\nA. 4 is even.\n\nThe answer is:\n\nC",
                prompt
            ),
            Some('C'),
            "the conclusion, not the first option weighed"
        );
        assert_eq!(
            parse_letter(
                "Let's weigh each option:\nA. 4 is even, so 7 (seven).",
                prompt
            ),
            Some('C'),
            "a list of options is not a conclusion"
        );
        assert!(opens_with_letter("C. 7 (seven), since", prompt));
        assert!(!opens_with_letter("A prime has", prompt));
        assert!(
            !opens_with_letter("C", prompt),
            "the next word may yet follow it"
        );
        assert!(!opens_with_letter("A ", prompt), "the article");
        assert!(opens_with_letter("B ", prompt));
    }

    #[test]
    fn a_chat_answer_names_the_choice_it_gives_first() {
        let choices: Vec<String> = ["negative", "neutral", "positive"]
            .map(String::from)
            .to_vec();
        assert_eq!(parse_choice("Positive", &choices), Some(2));
        assert_eq!(parse_choice("The sentiment is neutral.", &choices), Some(1));
        assert_eq!(
            parse_choice("negative, not positive", &choices),
            Some(0),
            "the first named"
        );
        assert_eq!(
            parse_choice("nonnegative", &choices),
            None,
            "whole words only"
        );
        assert_eq!(
            parse_choice("Positively so.", &choices),
            Some(2),
            "a shared stem"
        );
        let emotions: Vec<String> = ["anger", "joy", "optimism", "sadness"]
            .map(String::from)
            .to_vec();
        assert_eq!(parse_choice("Sad.", &emotions), Some(3));
        assert_eq!(parse_choice("So", &emotions), None, "too short to say");
        assert_eq!(parse_choice("I cannot tell.", &choices), None);
        let topics: Vec<String> = ["card", "card arrival"].map(String::from).to_vec();
        assert_eq!(
            parse_choice("Card arrival", &topics),
            Some(1),
            "the longer at a tie"
        );
    }
}
