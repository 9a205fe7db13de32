//! `straddle bench-structured`: constrained decoding with the edge model on real-world JSON
//! schemas — how many compile, how many answers finish, whether every finished answer
//! validates (checked by a validator that is not the grammar engine), the tokens an answer
//! takes, and what the grammar costs per token beside the decode step it masks.

use std::path::PathBuf;

use anyhow::Context;
use serde_json::Value;
use straddle_engine::gguf::FileSource;
use straddle_engine::{
    ChatMessage, Completion, Constraint, Engine, Finish, Flow, GenerateParams, OutputFormat, Prompt,
};

/// Settings of the benchmark.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// One `{"url", "title", "description", "schema"}` a line (what
    /// `crates/cli/data/structured/schemastore.py` writes).
    #[arg(long)]
    pub schemas: PathBuf,
    /// The edge model (default: the model `cargo xtask setup` fetched).
    #[arg(long, env = "STRADDLE_MODEL")]
    pub model: Option<PathBuf>,
    /// Schemas to try, evenly spaced through the file.
    #[arg(long, default_value_t = 60)]
    pub limit: usize,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
}

/// One schema of the collection.
#[derive(serde::Deserialize)]
struct Case {
    title: String,
    description: String,
    schema: Value,
}

/// What one schema's answer did.
enum Outcome {
    /// Neither strict nor lenient compilation accepted it; why (the lenient error).
    NotCompiled(String),
    Answered {
        strict: bool,
        finished: bool,
        /// `None` when the reference validator cannot read the schema either.
        valid: Option<bool>,
        completion: Completion,
    },
}

/// Runs the benchmark and returns its markdown table.
pub fn run(args: &BenchArgs) -> anyhow::Result<String> {
    let model = args
        .model
        .clone()
        .unwrap_or_else(|| straddle_models::DEFAULT_EDGE.path());
    let engine = Engine::load(FileSource::open(&model)?, 2048)
        .with_context(|| format!("loading {}", model.display()))?;
    let cases = spread(read_cases(&args.schemas)?, args.limit);
    let bar = crate::progress::bar(cases.len() as u64, "schemas");
    let mut outcomes = Vec::with_capacity(cases.len());
    for case in &cases {
        outcomes.push(answer(&engine, case, args.max_tokens)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(table(&outcomes, args))
}

fn read_cases(path: &std::path::Path) -> anyhow::Result<Vec<Case>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("line {}", i + 1)))
        .collect()
}

/// `limit` cases evenly spaced through `all` (all of them when there are fewer).
fn spread<T>(all: Vec<T>, limit: usize) -> Vec<T> {
    let n = all.len();
    if limit == 0 || n <= limit {
        return all;
    }
    all.into_iter()
        .enumerate()
        .filter(|(i, _)| (i * limit) % n < limit)
        .map(|(_, c)| c)
        .collect()
}

/// The schema compiled strictly when the grammar engine enforces all of it, else leniently;
/// the lenient error when neither compiles.
fn compile(engine: &Engine, schema: &Value) -> Result<(bool, Constraint), String> {
    let format = |strict| OutputFormat::JsonSchema {
        schema: schema.clone(),
        strict,
    };
    if let Ok(c) = engine.constrain(&format(true)) {
        return Ok((true, c));
    }
    engine
        .constrain(&format(false))
        .map(|c| (false, c))
        .map_err(|e| e.to_string())
}

fn answer(engine: &Engine, case: &Case, max_tokens: usize) -> anyhow::Result<Outcome> {
    let (strict, constraint) = match compile(engine, &case.schema) {
        Ok(compiled) => compiled,
        Err(why) => return Ok(Outcome::NotCompiled(why)),
    };
    let about: String = format!("{} {}", case.title, case.description)
        .chars()
        .take(300)
        .collect();
    let question = format!("Write a short example JSON document of this kind: {about}");
    let params = GenerateParams {
        max_tokens,
        constraint: Some(constraint),
        ..Default::default()
    };
    let messages = [ChatMessage::new("user", question)];
    let completion = engine.generate(Prompt::Messages(&messages), &params, |_| Flow::Continue)?;
    let finished = completion.finish == Finish::Stop;
    let valid = finished
        .then(|| validates(&case.schema, &completion.text))
        .flatten();
    Ok(Outcome::Answered {
        strict,
        finished,
        valid,
        completion,
    })
}

/// Whether `text` parses and validates against `schema`; `None` when the validator cannot
/// build from the schema (a reference it cannot resolve offline).
fn validates(schema: &Value, text: &str) -> Option<bool> {
    let validator = jsonschema::validator_for(schema).ok()?;
    Some(
        serde_json::from_str::<Value>(text)
            .ok()
            .is_some_and(|v| validator.is_valid(&v)),
    )
}

fn table(outcomes: &[Outcome], args: &BenchArgs) -> String {
    let tried = outcomes.len();
    let answered: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Answered {
                strict,
                finished,
                valid,
                completion,
            } => Some((*strict, *finished, *valid, completion)),
            Outcome::NotCompiled(_) => None,
        })
        .collect();
    let strict = answered.iter().filter(|a| a.0).count();
    let finished: Vec<_> = answered.iter().filter(|a| a.1).collect();
    let checked = finished.iter().filter(|a| a.2.is_some()).count();
    let valid = finished.iter().filter(|a| a.2 == Some(true)).count();
    let strict_finished = finished.iter().filter(|a| a.0).count();
    let strict_valid = finished.iter().filter(|a| a.0 && a.2 == Some(true)).count();
    let tokens: usize = answered.iter().map(|a| a.3.tokens.len()).sum();
    let finished_tokens: usize = finished.iter().map(|a| a.3.tokens.len()).sum();
    let grammar_ms: f64 = answered.iter().map(|a| a.3.grammar_ms).sum();
    let decode_ms: f64 = answered.iter().map(|a| a.3.decode_ms).sum();
    let per_token = |ms: f64| ms / tokens.max(1) as f64;
    let step_ms = per_token(decode_ms - grammar_ms);
    let mask_ms = per_token(grammar_ms);
    let table = format!(
        "| schemas tried | compiled (strict / lenient) | answers finished in {max} tokens | finished answers valid (strict-compiled) | mean tokens per finished answer | grammar per token | decode step per token | grammar / step |\n\
         |---|---|---|---|---|---|---|---|\n\
         | {tried} | {compiled} of {tried} ({strict} / {lenient}) | {nf} of {compiled} | {valid} of {checked} ({strict_valid} of {strict_finished}) | {mean:.1} | {mask_ms:.3} ms | {step_ms:.2} ms | {ratio:.1}% |\n",
        max = args.max_tokens,
        compiled = answered.len(),
        lenient = answered.len() - strict,
        nf = finished.len(),
        mean = finished_tokens as f64 / finished.len().max(1) as f64,
        ratio = 100.0 * mask_ms / step_ms.max(f64::EPSILON),
    );
    format!("{table}\n{}", refusals(outcomes))
}

/// An error's kind: its first line, with what it quotes (a URL, a name) left out.
fn kind_of(error: &str) -> String {
    let line = error.lines().next().unwrap_or_default();
    let line = line.strip_prefix("invalid JSON schema: ").unwrap_or(line);
    // Every other piece between single quotes is what the error names.
    let kept: Vec<&str> = line.split('\'').step_by(2).collect();
    kept.join("'…'").chars().take(60).collect()
}

/// Why the schemas that did not compile were refused, most common first.
fn refusals(outcomes: &[Outcome]) -> String {
    let mut why = std::collections::BTreeMap::<String, usize>::new();
    for o in outcomes {
        if let Outcome::NotCompiled(e) = o {
            *why.entry(kind_of(e)).or_default() += 1;
        }
    }
    let mut why: Vec<_> = why.into_iter().collect();
    why.sort_by_key(|w| std::cmp::Reverse(w.1));
    let lines: String = why
        .iter()
        .map(|(e, n)| format!("- {n} × `{}`\n", e.replace('`', "'")))
        .collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!("Not compiled:\n\n{lines}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_leave_out_what_they_name() {
        assert_eq!(
            kind_of("invalid JSON schema: Resource 'https://x/y.json' is not present\nmore"),
            "Resource '…' is not present"
        );
        assert_eq!(
            kind_of("regex parse error:\n  ^(?=x)"),
            "regex parse error:"
        );
    }

    #[test]
    fn spread_takes_evenly_spaced_cases() {
        let picked = spread((0..10).collect(), 3);
        assert_eq!(picked.len(), 3);
        assert!(picked.windows(2).all(|w| w[1] - w[0] >= 3), "{picked:?}");
        assert_eq!(spread((0..2).collect(), 5), vec![0, 1]);
    }
}
