//! Straddle's routing policy.
//!
//! Pure: no I/O, no clock, no randomness it was not handed. Shared by the browser (which
//! decides), the worker (which re-checks privacy) and the CLI (which evaluates).

pub mod pii;
