//! Straddle's routing policy.
//!
//! Pure: no I/O, no clock, no randomness it was not handed. Shared by the browser (which
//! decides), the worker (which re-checks privacy) and the CLI (which evaluates).
//! `pii` finds personal data, `language` names the prompt's language, `signals` reads the
//! expected length, `policy`
//! applies the ordered rules and the cost score and explains itself, `redact` replaces
//! personal data with placeholders for upload and puts it back into the answer; `features`
//! and `linear` are the small learned models (task type, difficulty) over hashed n-grams;
//! `quality` estimates whether the edge model's answer will be acceptable;
//! `eval` scores a strong/weak router with RouteLLM's metrics.

pub mod bandit;
pub mod cascade;
pub mod energy;
pub mod eval;
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
pub mod sim;
pub mod task;
