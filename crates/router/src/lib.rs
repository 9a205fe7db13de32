//! Straddle's routing policy.
//!
//! Pure: no I/O, no clock, no randomness it was not handed. Shared by the browser (which
//! decides), the worker (which re-checks privacy) and the CLI (which evaluates).
//!
//! - `pii` finds personal data (`pii/`: one scanner per file, and the tagger); `redact`
//!   replaces it with placeholders for upload and puts it back into the answer;
//! - `language` names the prompt's language, `task` its task type, `signals` the expected
//!   length, `features` and `linear` are the small learned models over hashed n-grams;
//! - `quality` estimates whether the edge model's answer will be acceptable, `energy` what an
//!   answer costs the battery, `price` what the cloud charges;
//! - `policy` applies the ordered rules and the cost score and explains itself; `cascade`
//!   decides mid-stream escalation; `bandit` learns from feedback;
//! - `rng` is the seeded generator the bandit, the trainers and the CLI's evaluations share.
//!
//! The evaluations themselves (`eval`, RouteLLM's metrics; `sim`, a simulated request stream)
//! live in the CLI, so the browser and the worker do not ship them.

pub mod bandit;
pub mod cascade;
pub mod energy;
pub mod features;
pub mod language;
pub mod linear;
pub mod pii;
pub mod policy;
pub mod price;
pub mod quality;
pub mod redact;
pub mod rng;
pub mod signals;
pub mod task;
