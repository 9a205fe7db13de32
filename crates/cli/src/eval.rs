//! Scoring a strong/weak router the way RouteLLM does (Ong et al., 2024): sweep a threshold
//! over the router's per-prompt "strong model needed" score, trace quality against the share
//! of strong-model calls, and summarise the curve as PGR, APGR and CPT. Also the cross-fitted
//! learned scorer, so no prompt is scored by a model that saw it (or, grouped, its domain).

use straddle_router::features::{Features, extract};
use straddle_router::linear::{LinearModel, ModelError, TrainConfig};
use straddle_router::rng::{SplitMix, mix};

/// What each model scored on one prompt: 0/1 correctness, or a judge's mean score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub weak: f64,
    pub strong: f64,
}

/// One threshold's result: the share of prompts sent to the strong model (0–1) and the
/// mean quality that routing earns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CurvePoint {
    pub strong_share: f64,
    pub quality: f64,
}

/// RouteLLM's sweep: thresholds at the `bins + 1` quantiles of the scores (linear
/// interpolation, as `pandas.qcut` cuts); a prompt goes to the strong model when its score is
/// at or above the threshold, strictly above for the last one (so that point makes no strong
/// calls). Sorted by strong share.
pub fn curve(scores: &[f64], outcomes: &[Outcome], bins: usize) -> Vec<CurvePoint> {
    let n = scores.len().min(outcomes.len());
    if n == 0 || bins == 0 {
        return Vec::new();
    }
    let mut sorted: Vec<f64> = scores[..n].to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut points: Vec<CurvePoint> = (0..=bins)
        .map(|b| {
            let t = quantile(&sorted, b as f64 / bins as f64);
            let last = b == bins;
            let (mut strong, mut quality) = (0usize, 0f64);
            for (s, o) in scores[..n].iter().zip(outcomes) {
                if (!last && *s >= t) || (last && *s > t) {
                    strong += 1;
                    quality += o.strong;
                } else {
                    quality += o.weak;
                }
            }
            CurvePoint {
                strong_share: strong as f64 / n as f64,
                quality: quality / n as f64,
            }
        })
        .collect();
    points.sort_by(|a, b| a.strong_share.total_cmp(&b.strong_share));
    points
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// The numbers RouteLLM reports for one router on one benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Quality of the weak and strong model alone.
    pub weak: f64,
    pub strong: f64,
    /// Performance gap recovered at 20 %, 50 % and 80 % strong calls.
    pub pgr_at: [f64; 3],
    /// Average PGR over the call-share curve (area under it, normalised).
    pub apgr: f64,
    /// Call-performance threshold: strong-call share needed for 50 % and 80 % PGR.
    pub cpt50: Option<f64>,
    pub cpt80: Option<f64>,
    /// Strong-call share needed to reach 95 % of the strong model's quality; one minus it
    /// is the share of strong-model spend saved at that quality.
    pub share_at_95_quality: Option<f64>,
}

/// Summarises a curve against the two models' own quality.
pub fn summarize(curve: &[CurvePoint], weak: f64, strong: f64) -> Summary {
    let gap = strong - weak;
    let pgr = |q: f64| {
        if gap.abs() > f64::EPSILON {
            (q - weak) / gap
        } else {
            0.0
        }
    };
    let pgr_at = [0.2, 0.5, 0.8].map(|s| pgr(quality_at(curve, s)));
    // Trapezoids of quality over share, less the weak model's rectangle, over the gap's.
    let (mut auc, mut span) = (0.0, 0.0);
    for w in curve.windows(2) {
        let dx = w[1].strong_share - w[0].strong_share;
        auc += dx * (w[0].quality + w[1].quality) / 2.0;
        span += dx;
    }
    let apgr = if span > 0.0 && gap.abs() > f64::EPSILON {
        (auc - weak * span) / (gap * span)
    } else {
        0.0
    };
    Summary {
        weak,
        strong,
        pgr_at,
        apgr,
        cpt50: share_reaching(curve, weak + 0.5 * gap),
        cpt80: share_reaching(curve, weak + 0.8 * gap),
        share_at_95_quality: share_reaching(curve, 0.95 * strong),
    }
}

/// Quality at a strong share, linear between curve points and flat past the ends (as
/// `numpy.interp`).
fn quality_at(curve: &[CurvePoint], share: f64) -> f64 {
    let Some(first) = curve.first() else {
        return 0.0;
    };
    if share <= first.strong_share {
        return first.quality;
    }
    for w in curve.windows(2) {
        if share <= w[1].strong_share {
            let dx = w[1].strong_share - w[0].strong_share;
            let t = if dx > 0.0 {
                (share - w[0].strong_share) / dx
            } else {
                1.0
            };
            return w[0].quality + t * (w[1].quality - w[0].quality);
        }
    }
    curve.last().map_or(0.0, |p| p.quality)
}

/// The smallest strong share at which the piecewise-linear curve reaches `target` (what
/// RouteLLM's `numpy.interp` inversion gives when the curve rises), or `None` if it never does.
fn share_reaching(curve: &[CurvePoint], target: f64) -> Option<f64> {
    let first = curve.first()?;
    if first.quality >= target {
        return Some(first.strong_share);
    }
    for w in curve.windows(2) {
        if w[1].quality >= target {
            let dq = w[1].quality - w[0].quality;
            let t = if dq > 0.0 {
                (target - w[0].quality) / dq
            } else {
                1.0
            };
            return Some(w[0].strong_share + t * (w[1].strong_share - w[0].strong_share));
        }
    }
    None
}

/// A prompt for the learned scorer: its text, whether the weak model failed it, and its
/// group (a benchmark domain; prompts of one group are never split across folds).
#[derive(Debug, Clone, PartialEq)]
pub struct Labelled {
    pub text: String,
    pub weak_fails: bool,
    pub group: String,
}

/// Labels of the difficulty scorer: the probability of the second is the routing score.
pub const DIFFICULTY_LABELS: [&str; 2] = ["weak_suffices", "weak_fails"];

/// Scores every prompt with a difficulty model trained on the other folds only: groups are
/// dealt to `folds` folds in an order shuffled by `config.seed`.
pub fn cross_fit_scores(
    data: &[Labelled],
    folds: usize,
    config: TrainConfig,
) -> Result<Vec<f64>, ModelError> {
    let folds = folds.max(2);
    // Groups in an order shuffled by the seed, dealt round-robin into folds.
    let mut keyed: Vec<(u64, &str)> = data
        .iter()
        .map(|d| (mix(config.seed ^ fnv(d.group.as_bytes())), d.group.as_str()))
        .collect();
    keyed.sort_unstable();
    keyed.dedup();
    let fold_of: std::collections::HashMap<&str, usize> = keyed
        .iter()
        .enumerate()
        .map(|(i, (_, g))| (*g, i % folds))
        .collect();
    let fold = |g: &str| fold_of.get(g).copied().unwrap_or(0);
    let features: Vec<Features> = data.iter().map(|d| extract(&d.text)).collect();
    let labels: Vec<String> = DIFFICULTY_LABELS.iter().map(|s| s.to_string()).collect();
    let mut scores = vec![0f64; data.len()];
    for k in 0..folds {
        let train: Vec<(Features, usize)> = data
            .iter()
            .zip(&features)
            .filter(|(d, _)| fold(&d.group) != k)
            .map(|(d, f)| (f.clone(), usize::from(d.weak_fails)))
            .collect();
        if data.iter().all(|d| fold(&d.group) != k) {
            continue;
        }
        let model = LinearModel::train(labels.clone(), &train, config, "cross-fit fold")?;
        for (i, d) in data.iter().enumerate() {
            if fold(&d.group) == k {
                scores[i] = f64::from(model.probabilities(&features[i])[1]);
            }
        }
    }
    Ok(scores)
}

/// Uniform scores in [0, 1) from a seed: RouteLLM's random router.
pub fn random_scores(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix(seed);
    (0..n).map(|_| rng.next_f64()).collect()
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 prompts: the weak model gets the first 60 right, the strong one the first 90.
    fn outcomes() -> Vec<Outcome> {
        (0..100)
            .map(|i| Outcome {
                weak: f64::from(i < 60),
                strong: f64::from(i < 90),
            })
            .collect()
    }

    #[test]
    fn an_oracle_recovers_the_gap_with_the_fewest_strong_calls() {
        let o = outcomes();
        let oracle: Vec<f64> = o.iter().map(|x| x.strong - x.weak).collect();
        let c = curve(&oracle, &o, 10);
        assert_eq!(c.first().map(|p| p.strong_share), Some(0.0));
        assert_eq!(c.last().map(|p| p.strong_share), Some(1.0));
        let s = summarize(&c, 0.6, 0.9);
        // The 30 prompts only the strong model solves are the top scores: a 30 % strong
        // share recovers the whole gap, so PGR at 50 % and 80 % calls is 1.
        assert!((s.pgr_at[1] - 1.0).abs() < 1e-9 && (s.pgr_at[2] - 1.0).abs() < 1e-9);
        assert!(s.apgr > 0.8, "{}", s.apgr);
        assert!(s.cpt80.expect("reached") <= 0.3 + 1e-9);
    }

    #[test]
    fn a_random_router_recovers_the_gap_in_proportion() {
        let o = outcomes();
        let mut apgr = 0.0;
        for seed in 0..200 {
            let c = curve(&random_scores(o.len(), seed), &o, 10);
            apgr += summarize(&c, 0.6, 0.9).apgr;
        }
        apgr /= 200.0;
        assert!((apgr - 0.5).abs() < 0.03, "{apgr}");
    }

    #[test]
    fn an_inverted_router_is_worse_than_random() {
        let o = outcomes();
        let inverted: Vec<f64> = o.iter().map(|x| x.weak - x.strong).collect();
        let s = summarize(&curve(&inverted, &o, 10), 0.6, 0.9);
        assert!(s.apgr < 0.3, "{}", s.apgr);
        assert!(s.cpt50.expect("reached at 100 %") > 0.7);
    }

    #[test]
    fn empty_input_gives_an_empty_curve() {
        assert!(curve(&[], &[], 10).is_empty());
        let s = summarize(&[], 0.5, 0.8);
        assert_eq!(s.cpt50, None);
    }

    #[test]
    fn cross_fitting_learns_a_signal_it_never_saw_in_the_scored_fold() {
        // The strong model wins on prompts with arithmetic; groups keep topics together.
        let mut data = Vec::new();
        for g in 0..20 {
            for i in 0..10 {
                let hard = i % 2 == 0;
                let text = if hard {
                    format!("topic{g} compute {} * {} + {}", i * 37, g + 13, i)
                } else {
                    format!("topic{g} name the colour of item {i}")
                };
                data.push(Labelled {
                    text,
                    weak_fails: hard,
                    group: format!("g{g}"),
                });
            }
        }
        let scores = cross_fit_scores(&data, 5, TrainConfig::default()).expect("train");
        let o: Vec<Outcome> = data
            .iter()
            .map(|d| Outcome {
                weak: f64::from(!d.weak_fails),
                strong: 1.0,
            })
            .collect();
        let learned = summarize(&curve(&scores, &o, 10), 0.5, 1.0).apgr;
        let oracle_scores: Vec<f64> = o.iter().map(|x| x.strong - x.weak).collect();
        // Half the prompts need the strong model, so even the oracle's APGR is 0.75.
        let oracle = summarize(&curve(&oracle_scores, &o, 10), 0.5, 1.0).apgr;
        assert!(
            learned > oracle - 0.05,
            "learned {learned}, oracle {oracle}"
        );
    }
}
