//! The graded prompts the router is evaluated and trained on, read from their public
//! layouts into [`Item`]s: RouteLLM's MMLU and GSM8K files joined to their answer keys,
//! routine `{prompt, choices, answer}` sets, programming tasks with their tests, and the
//! training splits' own layouts (`../shared/data/train`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;
use straddle_router::rng::SplitMix;

use crate::question::Question;
use crate::routellm;

/// One graded prompt of one benchmark.
#[derive(Debug, Clone)]
pub struct Item {
    pub benchmark: String,
    /// The cross-fitting group: an MMLU domain, GSM8K, or one file.
    pub group: String,
    pub question: Question,
    /// The cloud model's correctness (0 or 1) where a file records it (GPT-4's in RouteLLM's
    /// files); `None` where the cloud must answer for itself.
    pub cloud: Option<f64>,
}

/// How many prompts of each domain an evaluation takes (all, where `None`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    /// GSM8K and each file count as one domain.
    pub per_domain: Option<usize>,
    /// MMLU's 28 domains, which may take fewer.
    pub per_mmlu_domain: Option<usize>,
}

/// The benchmarks under `dir` (the layout of `../shared/data`: `routellm/`, `mmlu-answers/`,
/// `gsm8k/`, `classify/*.jsonl`, `code/*.jsonl`), at most `limits` prompts per domain.
pub fn load_benchmarks(dir: &Path, limits: Limits) -> anyhow::Result<Vec<Item>> {
    let (mmlu, mut items): (Vec<Item>, Vec<Item>) = routellm_items(dir)?
        .into_iter()
        .partition(|i| i.benchmark == "mmlu");
    items.extend(choice_items(&dir.join("classify"))?);
    items.extend(code_items(&dir.join("code"))?);
    let mut items = limit_per_group(items, limits.per_domain);
    items.extend(limit_per_group(mmlu, limits.per_mmlu_domain));
    if items.is_empty() {
        bail!("no graded prompts under {}", dir.display());
    }
    Ok(items)
}

/// RouteLLM's MMLU and GSM8K prompts that an answer key grades, with GPT-4's correctness.
fn routellm_items(dir: &Path) -> anyhow::Result<Vec<Item>> {
    let routellm_dir = dir.join("routellm");
    if !routellm_dir.is_dir() {
        return Ok(Vec::new());
    }
    let benchmarks = routellm::load(
        &routellm_dir,
        routellm::DEFAULT_WEAK,
        routellm::DEFAULT_STRONG,
    )?;
    let letters = mmlu_keys(&dir.join("mmlu-answers"))?;
    let numbers = gsm8k_keys(&dir.join("gsm8k/test.jsonl"))?;
    let mut items = Vec::new();
    for b in benchmarks.iter().filter(|b| !b.graded) {
        for p in &b.prompts {
            let question = match b.name {
                "mmlu" => letters.get(p.text.trim()).map(|&key| Question::Letter {
                    prompt: p.text.clone(),
                    key,
                }),
                _ => numbers.get(p.text.trim()).map(|&key| Question::Number {
                    prompt: p.text.clone(),
                    key,
                }),
            };
            let Some(question) = question else { continue };
            items.push(Item {
                benchmark: b.name.to_string(),
                // An MMLU domain is a group; GSM8K is one (RouteLLM groups it by prompt).
                group: match b.name {
                    "mmlu" => p.group.trim_start_matches("mmlu/").to_string(),
                    name => name.to_string(),
                },
                question,
                cloud: Some(p.outcome.strong),
            });
        }
    }
    Ok(items)
}

/// The training prompts under `dir`: the training splits' files by name
/// (`../shared/data/train`: `gsm8k_train.jsonl` as word problems, `mbpp_train.jsonl` as
/// programs, every other `*.jsonl` as choice rows, lettered where the prompt hides them),
/// and our own generated prompts' folders (`classify/`, `short/`, `letter/`, `number/`,
/// `code/`). At most `limit` prompts a file, drawn with a fixed seed.
pub fn load_training(dir: &Path, limit: Option<usize>) -> anyhow::Result<Vec<Item>> {
    let mut items = Vec::new();
    for (path, lines) in jsonl_files(dir)? {
        let stem = file_stem(&path);
        let lines = sample(lines, limit);
        let read = match stem.as_str() {
            "gsm8k_train" => gsm8k_rows(&path, &lines),
            "mbpp_train" => code_rows(&path, &lines),
            _ => choice_rows(&path, &lines),
        };
        items.extend(read?.into_iter().map(|q| item(&stem, q)));
    }
    for sub in ["classify", "code"] {
        let read = if sub == "code" {
            code_items
        } else {
            choice_items
        };
        items.extend(
            read(&dir.join(sub))?
                .into_iter()
                .map(|i| Item { cloud: None, ..i }),
        );
    }
    items.extend(generated_items(dir)?);
    if items.is_empty() {
        bail!("no graded prompts under {}", dir.display());
    }
    Ok(items)
}

/// Our own generated prompts' `short/`, `letter/` and `number/` folders.
fn generated_items(dir: &Path) -> anyhow::Result<Vec<Item>> {
    #[derive(Deserialize)]
    struct Letter {
        prompt: String,
        answer: char,
    }
    #[derive(Deserialize)]
    struct Number {
        prompt: String,
        answer: f64,
    }
    #[derive(Deserialize)]
    struct Short {
        prompt: String,
        answers: Vec<String>,
    }
    let mut items = Vec::new();
    for (path, lines) in jsonl_files(&dir.join("short"))? {
        for (n, line) in lines {
            let q: Short = parse(&path, n, &line)?;
            let question = Question::Contains {
                prompt: q.prompt,
                keys: q.answers,
            };
            items.push(item("short", question));
        }
    }
    for (path, lines) in jsonl_files(&dir.join("letter"))? {
        for (n, line) in lines {
            let l: Letter = parse(&path, n, &line)?;
            let (prompt, key) = (l.prompt, l.answer);
            items.push(item("letter", Question::Letter { prompt, key }));
        }
    }
    for (path, lines) in jsonl_files(&dir.join("number"))? {
        for (n, line) in lines {
            let q: Number = parse(&path, n, &line)?;
            let (prompt, key) = (q.prompt, q.answer);
            items.push(item("number", Question::Number { prompt, key }));
        }
    }
    Ok(items)
}

fn item(group: &str, question: Question) -> Item {
    Item {
        benchmark: group.into(),
        group: group.into(),
        question,
        cloud: None,
    }
}

/// Keeps at most `limit` items of each group, in order.
pub fn limit_per_group(items: Vec<Item>, limit: Option<usize>) -> Vec<Item> {
    let Some(limit) = limit else { return items };
    let mut seen: HashMap<String, usize> = HashMap::new();
    items
        .into_iter()
        .filter(|i| {
            let n = seen.entry(i.group.clone()).or_default();
            *n += 1;
            *n <= limit
        })
        .collect()
}

/// At most `limit` of `lines`, a fixed-seed draw kept in file order.
fn sample<T>(lines: Vec<T>, limit: Option<usize>) -> Vec<T> {
    let Some(limit) = limit.filter(|&l| l < lines.len()) else {
        return lines;
    };
    let mut order: Vec<usize> = (0..lines.len()).collect();
    let mut rng = SplitMix(0x0074_7261_696e);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut keep = vec![false; lines.len()];
    order[..limit].iter().for_each(|&i| keep[i] = true);
    lines
        .into_iter()
        .zip(keep)
        .filter_map(|(l, k)| k.then_some(l))
        .collect()
}

/// MMLU answer keys by the prompt RouteLLM builds from each row.
fn mmlu_keys(dir: &Path) -> anyhow::Result<HashMap<String, char>> {
    let mut keys = HashMap::new();
    let files = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for path in files.filter_map(|e| e.ok().map(|e| e.path())) {
        if path.extension().is_none_or(|x| x != "csv") {
            continue;
        }
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_path(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        for (i, row) in reader.records().enumerate() {
            let row = row.with_context(|| format!("{}: row {}", path.display(), i + 1))?;
            let cells: Vec<&str> = row.iter().collect();
            let [q, a, b, c, d, key] = cells[..] else {
                bail!("{}: row {}: expected 6 columns", path.display(), i + 1);
            };
            let key = key
                .trim()
                .chars()
                .next()
                .filter(|k| ('A'..='D').contains(k));
            let Some(key) = key else {
                bail!("{}: row {}: answer must be A–D", path.display(), i + 1);
            };
            let prompt = format!("{q}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\nAnswer:");
            keys.insert(prompt.trim().to_string(), key);
        }
    }
    Ok(keys)
}

/// GSM8K's own `{question, answer}` row; the final answer follows `####`.
#[derive(Deserialize)]
struct Gsm8kRow {
    question: String,
    answer: String,
}

impl Gsm8kRow {
    fn key(&self) -> Option<f64> {
        let number = self.answer.rsplit("####").next()?.trim().replace(',', "");
        number.parse().ok()
    }
}

/// GSM8K final answers (after `####`) by question.
fn gsm8k_keys(path: &Path) -> anyhow::Result<HashMap<String, f64>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines: Vec<(usize, String)> = numbered(&text);
    let mut keys = HashMap::new();
    for q in gsm8k_rows(path, &lines)? {
        if let Question::Number { prompt, key } = q {
            keys.insert(prompt.trim().to_string(), key);
        }
    }
    Ok(keys)
}

fn gsm8k_rows(path: &Path, lines: &[(usize, String)]) -> anyhow::Result<Vec<Question>> {
    lines
        .iter()
        .map(|(n, line)| {
            let row: Gsm8kRow = parse(path, *n, line)?;
            let Some(key) = row.key() else {
                bail!("{}: line {n}: no final answer after ####", path.display());
            };
            Ok(Question::Number {
                prompt: row.question,
                key,
            })
        })
        .collect()
}

/// A routine `{prompt, choices, answer}` row.
#[derive(Deserialize)]
struct ChoiceRow {
    prompt: String,
    choices: Vec<String>,
    answer: usize,
}

/// `{prompt, choices, answer}` rows. A prompt that does not show every choice (ARC's
/// `Question: …\nAnswer:`) is asked with its choices as lettered options in MMLU's layout,
/// the way a person pastes a multiple-choice question: asked bare, neither model could name
/// an option it never saw. Beyond [`MAX_LETTERED`] choices (Banking77's 77 topics) the prompt
/// is asked as it is.
fn choice_rows(path: &Path, lines: &[(usize, String)]) -> anyhow::Result<Vec<Question>> {
    lines
        .iter()
        .map(|(n, line)| {
            let row: ChoiceRow = parse(path, *n, line)?;
            if row.answer >= row.choices.len() {
                bail!("{}: line {n}: answer out of range", path.display());
            }
            Ok(
                if hides_a_choice(&row) && row.choices.len() <= MAX_LETTERED {
                    lettered(row)
                } else {
                    Question::Choice {
                        prompt: row.prompt,
                        choices: row.choices,
                        key: row.answer,
                    }
                },
            )
        })
        .collect()
}

/// Most options a question is lettered with (A–H).
const MAX_LETTERED: usize = 8;

/// Whether some choice does not appear in the prompt (case aside).
fn hides_a_choice(row: &ChoiceRow) -> bool {
    let prompt = row.prompt.to_lowercase();
    row.choices
        .iter()
        .any(|c| !prompt.contains(&c.to_lowercase()))
}

/// The row as a lettered question: its stem without `Question:` and `Answer:`, then
/// `A. …` lines, then `Answer:`.
fn lettered(row: ChoiceRow) -> Question {
    let stem = row.prompt.trim();
    let stem = stem.strip_prefix("Question:").unwrap_or(stem);
    let stem = stem.strip_suffix("Answer:").unwrap_or(stem).trim();
    let options: String = ('A'..='H')
        .zip(&row.choices)
        .map(|(l, c)| format!("\n{l}. {c}"))
        .collect();
    Question::Letter {
        prompt: format!("{stem}{options}\nAnswer:"),
        key: ('A'..='H').nth(row.answer).unwrap_or('A'),
    }
}

/// Every `classify/*.jsonl` file: one benchmark of `{"prompt", "choices", "answer"}` lines.
fn choice_items(dir: &Path) -> anyhow::Result<Vec<Item>> {
    let mut items = Vec::new();
    for (path, lines) in jsonl_files(dir)? {
        let stem = file_stem(&path);
        for question in choice_rows(&path, &lines)? {
            items.push(Item {
                benchmark: stem.clone(),
                group: stem.clone(),
                question,
                cloud: None,
            });
        }
    }
    Ok(items)
}

/// A programming task: `{task_id, prompt, test_setup_code, tests}` (MBPP's layout).
#[derive(Deserialize)]
struct CodeRow {
    prompt: String,
    #[serde(default)]
    test_setup_code: String,
    tests: Vec<String>,
}

fn code_rows(path: &Path, lines: &[(usize, String)]) -> anyhow::Result<Vec<Question>> {
    lines
        .iter()
        .map(|(n, line)| {
            let row: CodeRow = parse(path, *n, line)?;
            if row.tests.is_empty() {
                bail!("{}: line {n}: a task needs tests", path.display());
            }
            Ok(Question::Code {
                prompt: row.prompt,
                setup: row.test_setup_code,
                tests: row.tests,
            })
        })
        .collect()
}

/// Every `code/*.jsonl` file: one benchmark of programming tasks.
fn code_items(dir: &Path) -> anyhow::Result<Vec<Item>> {
    let mut items = Vec::new();
    for (path, lines) in jsonl_files(dir)? {
        let stem = file_stem(&path);
        for question in code_rows(&path, &lines)? {
            items.push(Item {
                benchmark: "code".into(),
                group: stem.clone(),
                question,
                cloud: None,
            });
        }
    }
    Ok(items)
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, n: usize, line: &str) -> anyhow::Result<T> {
    serde_json::from_str(line).with_context(|| format!("{}: line {n}", path.display()))
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Each non-empty line of `text` with its line number.
fn numbered(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l.to_string()))
        .collect()
}

/// A file's non-empty lines, each with its line number.
type Lines = Vec<(usize, String)>;

/// Every `*.jsonl` file in `dir`, sorted, with its numbered non-empty lines; a missing
/// directory has none.
fn jsonl_files(dir: &Path) -> anyhow::Result<Vec<(PathBuf, Lines)>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            Ok((path, numbered(&text)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, p: &str, s: &str) {
        let path = dir.join(p);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, s).expect("write");
    }

    #[test]
    fn the_training_splits_are_read_in_their_own_layouts() {
        let dir = std::env::temp_dir().join(format!("route-data-{}", std::process::id()));
        write(
            &dir,
            "arc_train.jsonl",
            "{\"prompt\": \"Question: Which is wet?\\nAnswer:\", \"choices\": [\"sand\", \"water\", \"salt\"], \"answer\": 1}\n",
        );
        write(
            &dir,
            "gsm8k_train.jsonl",
            "{\"question\": \"2 and 3 apples?\", \"answer\": \"2+3=5\\n#### 5\"}\n",
        );
        write(
            &dir,
            "mbpp_train.jsonl",
            "{\"task_id\": 1, \"prompt\": \"Add.\", \"test_setup_code\": \"\", \"tests\": [\"assert f(1) == 2\"]}\n",
        );
        write(
            &dir,
            "sentiment.jsonl",
            "{\"prompt\": \"Mood, sad or glad?\", \"choices\": [\"sad\", \"glad\"], \"answer\": 0}\n",
        );
        let items = load_training(&dir, None).expect("reads");
        let kinds: Vec<(&str, &Question)> = items
            .iter()
            .map(|i| (i.group.as_str(), &i.question))
            .collect();
        assert!(
            matches!(kinds[0], ("arc_train", Question::Letter { prompt, key: 'B' })
            if prompt == "Which is wet?\nA. sand\nB. water\nC. salt\nAnswer:")
        );
        assert!(matches!(kinds[1], ("gsm8k_train", Question::Number { key, .. }) if *key == 5.0));
        assert!(
            matches!(kinds[2], ("mbpp_train", Question::Code { tests, .. }) if tests.len() == 1)
        );
        assert!(matches!(
            kinds[3],
            ("sentiment", Question::Choice { key: 0, .. })
        ));
        write(
            &dir,
            "mbpp_train.jsonl",
            "{\"prompt\": \"Add.\", \"tests\": []}\n",
        );
        let err = format!("{:#}", load_training(&dir, None).expect_err("no tests"));
        assert!(
            err.contains("mbpp_train.jsonl: line 1: a task needs tests"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_question_whose_choices_are_not_shown_is_lettered_unless_they_are_too_many() {
        let dir = std::env::temp_dir().join(format!("route-classify-{}", std::process::id()));
        let topics: Vec<String> = (0..9).map(|i| format!("\"topic {i}\"")).collect();
        write(
            &dir,
            "classify/mixed.jsonl",
            &format!(
                "{}\n{}\n{}\n",
                "{\"prompt\": \"Question: Which is wet?\\nAnswer:\", \"choices\": [\"sand\", \"water\"], \"answer\": 1}",
                "{\"prompt\": \"Is water wet or dry?\", \"choices\": [\"wet\", \"dry\"], \"answer\": 0}",
                format_args!(
                    "{{\"prompt\": \"Topic?\", \"choices\": [{}], \"answer\": 8}}",
                    topics.join(", ")
                ),
            ),
        );
        let items = load_benchmarks(&dir, Limits::default()).expect("reads");
        let questions: Vec<&Question> = items.iter().map(|i| &i.question).collect();
        assert!(matches!(questions[0], Question::Letter { prompt, key: 'B' }
            if prompt == "Which is wet?\nA. sand\nB. water\nAnswer:"));
        assert!(matches!(questions[1], Question::Choice { key: 0, .. }));
        assert!(matches!(questions[2], Question::Choice { key: 8, .. }));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_limit_draws_the_same_rows_every_time() {
        let rows: Vec<usize> = (0..100).collect();
        let a = sample(rows.clone(), Some(10));
        assert_eq!(a.len(), 10);
        assert_eq!(a, sample(rows.clone(), Some(10)));
        assert!(a.windows(2).all(|w| w[0] < w[1]), "file order kept");
        assert_eq!(sample(rows, None).len(), 100);
    }
}
