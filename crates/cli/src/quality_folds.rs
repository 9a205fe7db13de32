//! Each training set left out in turn: how well a quality model fitted to the other sets
//! ranks the left-out set's answers (AUROC for "the edge is right"), from the text alone,
//! with the first token, and with the edge model's state. A set left out stands for a kind
//! of request the model never saw, which is what the router meets in the field; this is
//! what chose the probe's settings, on training data only.

use std::fmt::Write as _;

use straddle_router::quality::{self, Example, ShareRow};

use crate::auroc::auroc;

/// One left-out set.
#[derive(Debug, Clone, PartialEq)]
pub struct Fold {
    pub group: String,
    pub prompts: usize,
    /// How many of them the edge answered right.
    pub right: usize,
    /// Within-set AUROC from the text, with the first token, with the state; `None` where
    /// the set's answers are all right or all wrong.
    pub auroc: [Option<f64>; 3],
}

/// Fits a model without each group in turn (`groups[i]` is example `i`'s) and scores the
/// group's examples with it.
pub fn leave_one_set_out(groups: &[&str], examples: &[Example], edge_sha256: &str) -> Vec<Fold> {
    let mut names: Vec<&str> = groups.to_vec();
    names.sort_unstable();
    names.dedup();
    let mut folds = Vec::new();
    for name in names {
        let (held, rest): (Vec<(&&str, &Example)>, Vec<_>) =
            groups.iter().zip(examples).partition(|(g, _)| **g == name);
        let rest: Vec<Example> = rest.into_iter().map(|(_, e)| e.clone()).collect();
        let Ok(model) = quality::train(&rest, edge_sha256, "fold") else {
            continue; // the other sets' answers are one-sided: nothing to rank with
        };
        let held: Vec<&Example> = held.into_iter().map(|(_, e)| e).collect();
        let right: Vec<bool> = held.iter().map(|e| e.edge_ok).collect();
        let score = |e: &Example, inputs: usize| {
            let edge = (inputs > 0).then_some(e.edge);
            let state = (inputs > 1).then_some(e.state.as_slice());
            model.estimate(&e.text, edge, state).p_edge_ok
        };
        let auroc = [0, 1, 2].map(|inputs| {
            let scores: Vec<f64> = held.iter().map(|e| score(e, inputs)).collect();
            auroc(&scores, &right)
        });
        folds.push(Fold {
            group: name.to_string(),
            prompts: held.len(),
            right: right.iter().filter(|&&r| r).count(),
            auroc,
        });
    }
    folds
}

/// Right and wrong answers a set needs of each for its AUROC to count in the mean: with two
/// right answers of a hundred, the AUROC is two ranks and says little.
const MIN_OF_EACH: usize = 10;

impl Fold {
    /// Whether the set has enough right and wrong answers for its AUROC to mean something.
    fn counts(&self) -> bool {
        self.right >= MIN_OF_EACH && self.prompts - self.right >= MIN_OF_EACH
    }
}

/// The folds as a Markdown table, with the mean AUROC of each column over the sets with
/// enough right and wrong answers.
pub fn render(folds: &[Fold]) -> String {
    let cell = |a: Option<f64>| a.map_or("—".to_string(), |a| format!("{a:.3}"));
    let mut out = String::from(
        "| left-out set | prompts | edge right | AUROC text | AUROC first token | AUROC state |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for f in folds {
        let [t, e, s] = f.auroc.map(cell);
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {t} | {e} | {s} |",
            f.group,
            f.prompts,
            f.right as f64 / f.prompts.max(1) as f64
        );
    }
    let mean = |k: usize| {
        let v: Vec<f64> = folds
            .iter()
            .filter(|f| f.counts())
            .filter_map(|f| f.auroc[k])
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let _ = writeln!(
        out,
        "| mean (sets with {MIN_OF_EACH} right and {MIN_OF_EACH} wrong) | | | {} | {} | {} |",
        cell(mean(0)),
        cell(mean(1)),
        cell(mean(2))
    );
    out
}

/// For each share of a first-token `bar` asked of the text before prefill (`rows`, from
/// [`quality::with_pre_generation_share`] on `examples` training answers): how many would go
/// up unprefilled, and how many of those the state probe would have kept at the whole bar
/// (and how many of them the edge got right), with the `chosen` share marked.
pub fn when_to_prefill(rows: &[ShareRow], chosen: f64, examples: usize, bar: f64) -> String {
    let mut out = format!(
        "| share of the bar {bar} before prefill | sent up before prefill | of them the state would keep (right) |\n|---:|---:|---:|\n"
    );
    for r in rows {
        let mark = if r.share == chosen { " (chosen)" } else { "" };
        let _ = writeln!(
            out,
            "| {:.1}{mark} | {} of {examples} | {} ({}) |",
            r.share, r.sent_up, r.kept, r.kept_right
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use straddle_router::quality::{EdgeSignals, TEXT_DIM};

    /// Two sets in which the state's first element says whether the edge is right.
    fn examples() -> (Vec<&'static str>, Vec<Example>) {
        (0..80)
            .map(|i| {
                let right = i % 3 != 0;
                let group = if i % 2 == 0 { "a" } else { "b" };
                let wobble = (i % 7) as f32 / 7.0;
                let example = Example {
                    text: [wobble; TEXT_DIM],
                    edge: EdgeSignals {
                        entropy: 1.0 + wobble,
                        logprob: -0.5,
                        margin: 1.0,
                    },
                    state: vec![if right { 1.0 } else { -1.0 } + wobble / 3.0, wobble],
                    edge_ok: right,
                };
                (group, example)
            })
            .unzip()
    }

    #[test]
    fn a_set_left_out_is_ranked_by_a_model_fitted_to_the_others() {
        let (groups, examples) = examples();
        let folds = leave_one_set_out(&groups, &examples, &"ab".repeat(32));
        assert_eq!(folds.len(), 2);
        for f in &folds {
            assert_eq!(f.prompts, 40);
            assert!(f.auroc[2].expect("both labels") > 0.95, "{f:?}");
        }
        let table = render(&folds);
        assert!(
            table.contains("| a | 40 |") && table.contains("| mean ("),
            "{table}"
        );
    }

    #[test]
    fn a_set_with_two_right_answers_is_shown_but_not_averaged() {
        let fold = |group: &str, right: usize, auroc: f64| Fold {
            group: group.into(),
            prompts: 100,
            right,
            auroc: [Some(auroc); 3],
        };
        let table = render(&[fold("few", 2, 0.1), fold("many", 40, 0.7)]);
        assert!(table.contains("| few | 100 | 0.02 | 0.100"), "{table}");
        assert!(table.ends_with("| 0.700 | 0.700 | 0.700 |\n"), "{table}");
    }

    #[test]
    fn the_prefill_table_counts_what_goes_up_unprefilled_at_each_share() {
        let (_, examples) = examples();
        let model = quality::train(&examples, &"ab".repeat(32), "toy").expect("trains");
        let (model, rows) = quality::with_pre_generation_share(model, &examples, 0.5);
        let table = when_to_prefill(&rows, model.pre_generation_share, examples.len(), 0.5);
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(rows.len(), 5, "{table}");
        let sent_up = |row: &str| -> usize {
            let cell = row.split('|').nth(2).expect("cell").trim();
            cell.split(' ')
                .next()
                .expect("count")
                .parse()
                .expect("number")
        };
        assert!(
            rows.windows(2).all(|w| sent_up(w[0]) <= sent_up(w[1])),
            "a larger share sends up at least as many: {table}"
        );
        assert!(rows.iter().all(|r| r.contains("of 80")), "{table}");
        assert_eq!(
            rows.iter().filter(|r| r.contains("(chosen)")).count(),
            1,
            "{table}"
        );
    }
}
