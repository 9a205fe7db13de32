//! The cascade: a request routed to the edge starts there, and the web crate feeds each
//! generated token's log-probability and entropy to a [`CascadeMonitor`]; if the model is
//! unsure over its first tokens, or says it does not know, the monitor asks to escalate and
//! the answer continues in the cloud.

use serde::{Deserialize, Serialize};

/// When an edge answer should be handed to the cloud.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CascadeRule {
    /// Tokens observed before the confidence statistics decide.
    pub window: usize,
    /// Escalate when the mean log-probability of the chosen tokens is below this.
    pub min_mean_logprob: f32,
    /// Escalate when the mean entropy (nats) of the next-token distributions is above this.
    pub max_mean_entropy: f32,
    /// Also escalate on "I don't know"-style phrases in the first `2 × window` tokens.
    pub detect_refusals: bool,
}

impl Default for CascadeRule {
    /// Starting points, not calibrated values: a small model's confident greedy tokens sit
    /// around −0.5 to −1.5 nats; a mean below −2.5 over eight tokens is guessing.
    fn default() -> Self {
        CascadeRule {
            window: 8,
            min_mean_logprob: -2.5,
            max_mean_entropy: 3.5,
            detect_refusals: true,
        }
    }
}

/// What the monitor says after a token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Escalation {
    /// Not enough evidence yet.
    Undecided,
    /// The edge answer may run to the end.
    Continue,
    /// Hand over to the cloud, for this reason.
    Escalate { reason: String },
}

const REFUSALS: &[&str] = &[
    "i don't know",
    "i do not know",
    "i'm not sure",
    "i am not sure",
    "i cannot answer",
    "i can't answer",
    "i'm unable to",
    "i am unable to",
    "as an ai",
    "我不知道",
    "我不确定",
    "无法回答",
];

/// Watches one edge answer as it is generated.
#[derive(Debug, Clone)]
pub struct CascadeMonitor {
    rule: CascadeRule,
    tokens: usize,
    logprob_sum: f64,
    entropy_sum: f64,
    /// The answer so far, lower-cased, for the refusal phrases.
    text: String,
    call: Escalation,
}

impl CascadeMonitor {
    /// A monitor for one answer.
    pub fn new(rule: CascadeRule) -> Self {
        CascadeMonitor {
            rule,
            tokens: 0,
            logprob_sum: 0.0,
            entropy_sum: 0.0,
            text: String::new(),
            call: Escalation::Undecided,
        }
    }

    /// The monitor's call so far.
    pub fn escalation(&self) -> &Escalation {
        &self.call
    }

    /// Feeds one generated token; the call, once `Escalate`, stays.
    pub fn push(&mut self, token_text: &str, logprob: f32, entropy: f32) -> &Escalation {
        if matches!(self.call, Escalation::Escalate { .. }) {
            return &self.call;
        }
        self.tokens += 1;
        // A NaN or infinite statistic is no evidence of confidence.
        self.logprob_sum += if logprob.is_finite() {
            f64::from(logprob)
        } else {
            -30.0
        };
        self.entropy_sum += if entropy.is_finite() {
            f64::from(entropy)
        } else {
            30.0
        };
        let watching_text = self.rule.detect_refusals && self.tokens <= 2 * self.rule.window.max(1);
        if watching_text {
            self.text.push_str(&token_text.to_lowercase());
            let normalised = self.text.replace('’', "'");
            if let Some(p) = REFUSALS.iter().find(|p| normalised.contains(*p)) {
                self.call = Escalation::Escalate {
                    reason: format!("the edge model said \"{p}\""),
                };
                return &self.call;
            }
        }
        if self.tokens == self.rule.window.max(1) && self.call == Escalation::Undecided {
            let n = self.tokens as f64;
            let (mean_lp, mean_h) = (self.logprob_sum / n, self.entropy_sum / n);
            self.call = if mean_lp < f64::from(self.rule.min_mean_logprob) {
                Escalation::Escalate {
                    reason: format!(
                        "low confidence: mean log-prob {mean_lp:.2} over the first {} tokens (< {})",
                        self.tokens, self.rule.min_mean_logprob
                    ),
                }
            } else if mean_h > f64::from(self.rule.max_mean_entropy) {
                Escalation::Escalate {
                    reason: format!(
                        "uncertain: mean entropy {mean_h:.2} nats over the first {} tokens (> {})",
                        self.tokens, self.rule.max_mean_entropy
                    ),
                }
            } else {
                Escalation::Continue
            };
        }
        &self.call
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tokens: &[(&str, f32, f32)]) -> Escalation {
        let mut m = CascadeMonitor::new(CascadeRule::default());
        for (t, lp, h) in tokens {
            m.push(t, *lp, *h);
        }
        m.escalation().clone()
    }

    #[test]
    fn confident_tokens_continue_after_the_window() {
        let confident = [("The", -0.4, 1.0); 8];
        assert_eq!(run(&confident[..7]), Escalation::Undecided);
        assert_eq!(run(&confident), Escalation::Continue);
    }

    #[test]
    fn guessing_or_spread_out_distributions_escalate() {
        let guessing = [("x", -4.0, 2.0); 8];
        assert!(
            matches!(run(&guessing), Escalation::Escalate { reason } if reason.contains("log-prob"))
        );
        let spread = [("x", -1.0, 5.0); 8];
        assert!(
            matches!(run(&spread), Escalation::Escalate { reason } if reason.contains("entropy"))
        );
        let broken = [("x", f32::NAN, 1.0); 8];
        assert!(matches!(run(&broken), Escalation::Escalate { .. }));
    }

    #[test]
    fn a_refusal_escalates_at_once_even_when_confident() {
        let tokens = [
            ("I", -0.1, 0.5),
            (" don", -0.1, 0.5),
            ("’t", -0.1, 0.5),
            (" know", -0.1, 0.5),
        ];
        assert!(
            matches!(run(&tokens), Escalation::Escalate { reason } if reason.contains("i don't know"))
        );
        assert!(matches!(
            run(&[("我不", -0.1, 0.5), ("知道", -0.1, 0.5)]),
            Escalation::Escalate { .. }
        ));
        // After the watch window a phrase in a long answer is content, not a refusal.
        let mut long: Vec<(&str, f32, f32)> = vec![("ok ", -0.3, 1.0); 20];
        long.push(("I don't know", -0.3, 1.0));
        assert_eq!(run(&long), Escalation::Continue);
    }

    #[test]
    fn the_rule_is_data() {
        let json = serde_json::to_string(&CascadeRule::default()).expect("ser");
        let back: CascadeRule = serde_json::from_str(&json).expect("de");
        assert_eq!(back, CascadeRule::default());
        assert!(serde_json::from_str::<CascadeRule>(r#"{"window":8}"#).is_err());
    }
}
