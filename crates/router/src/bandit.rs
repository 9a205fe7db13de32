//! A contextual bandit (LinUCB, Li et al. 2010, with the discounting of Russac et al. 2019 so
//! it follows drift) that learns from `feedback()` which target pays off for which kind of
//! request, on top of the ordered rules: the rules still decide privacy, offline and the
//! like; where the score would decide, the bandit decides instead.
//!
//! It learns a correction, not a reward from nothing: each target's expected reward starts
//! at what the policy's own cost model predicts for it (quality prior, estimated cost and
//! latency, weighed with the page's reward weights), and the regression fits the difference
//! between that prediction and the reward the answer earned. Knowing nothing, it routes as
//! the policy does; it explores first where the policy's margin is thin; and a systematic
//! error of the cost model (a cloud tier slower than its figures) is learned once, from
//! every answer of that target, instead of once per kind of task. Its state is plain data
//! (serde) so the browser can keep it in IndexedDB.

use serde::{Deserialize, Serialize};

use crate::policy::{Decision, Target};
use crate::task::TaskType;

/// Features per decision: bias, the task type one-hot, and four scaled numbers.
pub const DIM: usize = 1 + TaskType::ALL.len() + 4;

/// The version of the saved state's meaning; state saved under another is refused.
const STATE_VERSION: u32 = 2;

/// What the bandit sees of one scored decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The context vector.
    pub x: [f64; DIM],
    /// The policy's predicted reward of each target (edge, cloud), which the bandit corrects.
    pub prior: [f64; 2],
}

impl Observation {
    /// Reads the context and the cost model's estimates from a decision's trace; the
    /// estimates are weighed with `weights`, the weights the rewards are computed with.
    pub fn of(decision: &Decision, weights: &RewardWeights) -> Self {
        let signal = |name: &str| {
            decision
                .trace
                .signals
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.value.clone())
        };
        let number = |name: &str| signal(name).and_then(|v| v.as_f64());
        let mut x = [0.0; DIM];
        x[0] = 1.0;
        if let Some(task) = signal("task")
            .and_then(|v| v.as_str().map(str::to_owned))
            .and_then(|t| TaskType::from_label(&t))
        {
            x[1 + task as usize] = number("task_confidence").unwrap_or(0.0).clamp(0.0, 1.0);
        }
        let base = 1 + TaskType::ALL.len();
        let scaled = |name: &str, unit: f64| (number(name).unwrap_or(0.0) / unit).clamp(0.0, 2.0);
        x[base] = scaled("expected_output_tokens", 1024.0);
        x[base + 1] = scaled("prompt_tokens_estimate", 1024.0);
        x[base + 2] = scaled("rtt_ms", 1000.0);
        x[base + 3] = scaled("edge_tokens_per_s", 50.0);
        // A decision from before the estimates were traced predicts nothing: plain LinUCB.
        let prior = match (
            number("edge_quality_prior"),
            number("edge_latency_s"),
            number("cloud_quality_prior"),
            number("cloud_latency_s"),
            number("cloud_cost_usd"),
        ) {
            (Some(eq), Some(el), Some(cq), Some(cl), Some(cc)) => {
                [weights.reward(eq, 0.0, el), weights.reward(cq, cc, cl)]
            }
            _ => [0.0, 0.0],
        };
        Observation { x, prior }
    }
}

/// The reward of one answer: quality − λ·cost − μ·latency.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RewardWeights {
    /// Per US cent.
    pub cost: f64,
    /// Per second.
    pub latency: f64,
}

impl Default for RewardWeights {
    fn default() -> Self {
        RewardWeights {
            cost: 0.5,
            latency: 0.1,
        }
    }
}

impl RewardWeights {
    /// Combines what the user reported (`quality`, 0–1) with what the answer cost.
    pub fn reward(&self, quality: f64, cost_usd: f64, latency_s: f64) -> f64 {
        quality - self.cost * cost_usd * 100.0 - self.latency * latency_s
    }
}

/// Discounted LinUCB with one ridge regression per target, fitting the policy's error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinUcb {
    /// What the state means ([`STATE_VERSION`]); absent in state saved before it existed.
    #[serde(default)]
    version: u32,
    /// Width of the confidence bonus: larger explores more.
    pub alpha: f64,
    /// Weight kept by old evidence at each update (1 = never forget; 0.99 ≈ the last few
    /// hundred answers of that target).
    pub discount: f64,
    /// Per target (edge, cloud): `γA + x xᵀ + (1 − γ)I`, row-major. Solved afresh (Cholesky,
    /// 16×16) at each choice: the discount's identity term rules out a rank-one inverse update.
    a: [Vec<f64>; 2],
    /// Per target: the discounted Σ (reward − prior) · x.
    b: [Vec<f64>; 2],
    /// Feedback seen per target.
    pub pulls: [u64; 2],
}

/// Why bandit state could not be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid bandit state: {0}")]
pub struct StateError(String);

impl LinUcb {
    /// A bandit that knows nothing yet.
    pub fn new(alpha: f64, discount: f64) -> Self {
        let identity: Vec<f64> = (0..DIM * DIM)
            .map(|i| if i / DIM == i % DIM { 1.0 } else { 0.0 })
            .collect();
        LinUcb {
            version: STATE_VERSION,
            alpha,
            discount: discount.clamp(0.5, 1.0),
            a: [identity.clone(), identity],
            b: [vec![0.0; DIM], vec![0.0; DIM]],
            pulls: [0, 0],
        }
    }

    /// Restores state saved with `serde_json`, checking its shape.
    pub fn from_json(json: &str) -> Result<Self, StateError> {
        let s: LinUcb = serde_json::from_str(json).map_err(|e| StateError(e.to_string()))?;
        if s.version != STATE_VERSION {
            return Err(StateError(format!(
                "state version {} is not {STATE_VERSION}: it was learned under another model",
                s.version
            )));
        }
        let shapes_ok = s.a.iter().all(|m| m.len() == DIM * DIM)
            && s.b.iter().all(|v| v.len() == DIM)
            && s.a.iter().chain(&s.b).flatten().all(|v| v.is_finite());
        if !shapes_ok || !s.alpha.is_finite() || s.alpha < 0.0 || !(0.5..=1.0).contains(&s.discount)
        {
            return Err(StateError(format!(
                "expected {DIM}×{DIM} matrices, {DIM}-vectors, alpha ≥ 0 and discount in 0.5..=1"
            )));
        }
        if s.a.iter().any(|a| cholesky(a).is_none()) {
            return Err(StateError(
                "a design matrix is not positive definite".into(),
            ));
        }
        Ok(s)
    }

    fn arm(target: Target) -> usize {
        match target {
            Target::Edge => 0,
            // A speculative answer is the cloud's answer: it teaches the cloud arm.
            Target::Cloud | Target::Speculative => 1,
        }
    }

    /// Each target's expected reward (the prior plus the learned correction) and the width
    /// of its confidence interval, for this observation.
    pub fn estimates(&self, obs: &Observation) -> [(f64, f64); 2] {
        [0, 1].map(|arm| {
            // A stays positive definite (γA + xxᵀ + (1−γ)I); a failed factorisation can only
            // come from hand-edited state, which `from_json` refuses.
            let Some(l) = cholesky(&self.a[arm]) else {
                return (f64::NEG_INFINITY, 0.0);
            };
            let a_inv_x = solve(&l, &obs.x);
            // θ = A⁻¹b, so the correction θ·x is b·(A⁻¹x) (A is symmetric).
            let correction = dot(&self.b[arm], &a_inv_x);
            let width = dot(&obs.x, &a_inv_x).max(0.0).sqrt();
            (obs.prior[arm] + correction, width)
        })
    }

    /// Upper confidence bound of each target's reward for this observation.
    pub fn scores(&self, obs: &Observation) -> [f64; 2] {
        self.estimates(obs)
            .map(|(mean, width)| mean + self.alpha * width)
    }

    /// The target with the higher bound among `allowed` (ties go to the first allowed).
    pub fn choose(&self, obs: &Observation, allowed: &[Target]) -> Option<Target> {
        let s = self.scores(obs);
        allowed
            .iter()
            .copied()
            .fold(None, |best: Option<Target>, t| match best {
                Some(b) if s[Self::arm(b)] >= s[Self::arm(t)] => Some(b),
                _ => Some(t),
            })
    }

    /// Learns from the reward one target earned for this observation.
    pub fn update(&mut self, target: Target, obs: &Observation, reward: f64) {
        let arm = Self::arm(target);
        let residual = reward - obs.prior[arm];
        if !residual.is_finite() || obs.x.iter().any(|v| !v.is_finite()) {
            return;
        }
        let x = &obs.x;
        let g = self.discount;
        let a = &mut self.a[arm];
        for i in 0..DIM {
            for j in 0..DIM {
                let ridge = if i == j { 1.0 - g } else { 0.0 };
                a[i * DIM + j] = g * a[i * DIM + j] + x[i] * x[j] + ridge;
            }
        }
        for (b, xi) in self.b[arm].iter_mut().zip(x) {
            *b = g * *b + residual * xi;
        }
        self.pulls[arm] += 1;
    }
}

impl Default for LinUcb {
    /// A narrow bonus (rewards are about 0–1 and the policy's prediction is the start) and
    /// a memory of roughly the last 200 answers of each target, so it follows drift.
    fn default() -> Self {
        LinUcb::new(0.3, 0.995)
    }
}

/// Lower-triangular `L` with `L Lᵀ = m`, or `None` when `m` is not positive definite.
fn cholesky(m: &[f64]) -> Option<Vec<f64>> {
    let mut l = vec![0.0; DIM * DIM];
    for i in 0..DIM {
        for j in 0..=i {
            let sum: f64 = (0..j).map(|k| l[i * DIM + k] * l[j * DIM + k]).sum();
            if i == j {
                let d = m[i * DIM + i] - sum;
                if d <= 0.0 || !d.is_finite() {
                    return None;
                }
                l[i * DIM + i] = d.sqrt();
            } else {
                l[i * DIM + j] = (m[i * DIM + j] - sum) / l[j * DIM + j];
            }
        }
    }
    Some(l)
}

/// Solves `L Lᵀ y = x`.
fn solve(l: &[f64], x: &[f64; DIM]) -> [f64; DIM] {
    let mut y = [0.0; DIM];
    for i in 0..DIM {
        let sum: f64 = (0..i).map(|k| l[i * DIM + k] * y[k]).sum();
        y[i] = (x[i] - sum) / l[i * DIM + i];
    }
    for i in (0..DIM).rev() {
        let sum: f64 = (i + 1..DIM).map(|k| l[k * DIM + i] * y[k]).sum();
        y[i] = (y[i] - sum) / l[i * DIM + i];
    }
    y
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(task: usize) -> Observation {
        with_prior(task, [0.0, 0.0])
    }

    fn with_prior(task: usize, prior: [f64; 2]) -> Observation {
        let mut x = [0.0; DIM];
        x[0] = 1.0;
        x[1 + task] = 1.0;
        Observation { x, prior }
    }

    #[test]
    fn learns_which_target_pays_for_which_task() {
        let mut b = LinUcb::new(0.5, 1.0);
        // Task 0: the edge earns 0.8, the cloud 0.5; task 1: the reverse.
        for _ in 0..200 {
            for task in [0, 1] {
                let x = context(task);
                let t = b
                    .choose(&x, &[Target::Edge, Target::Cloud])
                    .expect("a target");
                let r = match (task, t) {
                    (0, Target::Edge) | (1, Target::Cloud) => 0.8,
                    _ => 0.5,
                };
                b.update(t, &x, r);
            }
        }
        let both = [Target::Edge, Target::Cloud];
        assert_eq!(b.choose(&context(0), &both), Some(Target::Edge));
        assert_eq!(b.choose(&context(1), &both), Some(Target::Cloud));
        // Both arms were tried: exploration happened.
        assert!(b.pulls.iter().all(|&p| p > 5), "{:?}", b.pulls);
        // Only what the rules allow is ever chosen.
        assert_eq!(b.choose(&context(1), &[Target::Edge]), Some(Target::Edge));
        assert_eq!(b.choose(&context(1), &[]), None);
    }

    #[test]
    fn state_round_trips_and_bad_state_is_an_error() {
        let mut b = LinUcb::new(1.0, 0.99);
        b.update(Target::Cloud, &context(3), 0.7);
        let json = serde_json::to_string(&b).expect("ser");
        assert_eq!(LinUcb::from_json(&json).expect("back"), b);
        assert!(LinUcb::from_json("{").is_err());
        let mut v: serde_json::Value = serde_json::from_str(&json).expect("value");
        v["b"][0] = serde_json::json!([1.0]);
        assert!(LinUcb::from_json(&v.to_string()).is_err());
        let mut v: serde_json::Value = serde_json::from_str(&json).expect("value");
        v.as_object_mut().expect("object").remove("version");
        let old = LinUcb::from_json(&v.to_string()).expect_err("state of the first version");
        assert!(old.to_string().contains("version 0"), "{old}");
        let mut v: serde_json::Value = serde_json::from_str(&json).expect("value");
        v["a"][1][0] = serde_json::json!(-5.0);
        assert!(
            LinUcb::from_json(&v.to_string()).is_err(),
            "not positive definite"
        );
    }

    #[test]
    fn discounting_follows_a_change_of_which_target_pays() {
        let mut b = LinUcb::new(0.3, 0.98);
        let both = [Target::Edge, Target::Cloud];
        let x = context(2);
        let play = |b: &mut LinUcb, edge_pays: bool| {
            for _ in 0..300 {
                let t = b.choose(&x, &both).expect("a target");
                let r = if (t == Target::Edge) == edge_pays {
                    0.9
                } else {
                    0.3
                };
                b.update(t, &x, r);
            }
        };
        play(&mut b, true);
        assert_eq!(b.choose(&x, &both), Some(Target::Edge));
        play(&mut b, false);
        assert_eq!(b.choose(&x, &both), Some(Target::Cloud));
    }

    #[test]
    fn a_non_finite_reward_is_ignored() {
        let mut b = LinUcb::new(1.0, 0.99);
        let before = b.clone();
        b.update(Target::Edge, &context(0), f64::NAN);
        assert_eq!(b, before);
    }

    #[test]
    fn knowing_nothing_it_follows_the_policy_and_learns_its_systematic_error_once() {
        let both = [Target::Edge, Target::Cloud];
        let mut b = LinUcb::new(0.2, 1.0);
        // The policy predicts the cloud 0.1 better on every task…
        let prior = [0.5, 0.6];
        for task in 0..4 {
            assert_eq!(
                b.choose(&with_prior(task, prior), &both),
                Some(Target::Cloud)
            );
        }
        // …but the cloud is slower than its figures: every answer earns 0.3 less than
        // predicted, the edge's what was predicted. Feedback on tasks 0–2 only.
        for _ in 0..100 {
            for task in 0..3 {
                let obs = with_prior(task, prior);
                let t = b.choose(&obs, &both).expect("a target");
                let r = if t == Target::Cloud { 0.3 } else { 0.5 };
                b.update(t, &obs, r);
            }
        }
        assert_eq!(b.choose(&with_prior(0, prior), &both), Some(Target::Edge));
        // The error sits in the cloud arm's bias, so a task never seen is routed with it.
        let [(edge, _), (cloud, _)] = b.estimates(&with_prior(3, prior));
        assert!(edge > cloud, "means: edge {edge} cloud {cloud}");
    }
}
