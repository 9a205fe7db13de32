//! Which upstreams exist and in what order to try them: configuration (`UPSTREAMS` JSON, or
//! the single `UPSTREAM_URL`), weighted choice within a priority, and a circuit breaker per
//! upstream (open after consecutive failures, one half-open probe after a pause; `health.rs`
//! keeps them for the whole deployment). Pure: the worker hands in the clock and a random
//! number.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use straddle_router::price::Price;

/// One upstream server.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    pub name: String,
    /// Base URL; `/v1/chat/completions` is appended.
    pub url: String,
    #[serde(default)]
    pub price_in_per_1k: f64,
    #[serde(default)]
    pub price_out_per_1k: f64,
    /// Share of traffic among upstreams of the same priority.
    #[serde(default = "one")]
    pub weight: f64,
    /// Lower goes first; higher ones are failover targets.
    #[serde(default)]
    pub priority: u32,
    /// Time allowed until the response headers arrive.
    #[serde(default = "first_byte_default")]
    pub first_byte_timeout_ms: u64,
    /// Time allowed for the whole answer, stream included; a stream still going then is
    /// ended with an error event (a connect that hangs is caught by the first-byte timeout:
    /// a Worker's `fetch` does not expose the connect on its own).
    #[serde(default = "total_default")]
    pub total_timeout_ms: u64,
    #[serde(default)]
    pub supports_verify: bool,
    /// The models it serves, each under the name it knows it by (`{"fast":
    /// "llama-3.1-8b-instruct"}`); empty: any model, forwarded under the caller's name.
    #[serde(default)]
    pub models: BTreeMap<String, String>,
    /// The secret binding (`wrangler secret put NAME`) holding its API key, sent as
    /// `Authorization: Bearer`.
    #[serde(default)]
    pub api_key_secret: Option<String>,
    /// How long its breaker stays open after [`FAILURES_TO_OPEN`] failures in a row, before
    /// one probe may try it again.
    #[serde(default = "breaker_open_default")]
    pub breaker_open_ms: u64,
}

impl Upstream {
    /// Its prices.
    pub fn price(&self) -> Price {
        Price {
            in_per_1k: self.price_in_per_1k,
            out_per_1k: self.price_out_per_1k,
        }
    }

    /// Whether it serves the caller's `model`.
    pub fn serves(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.contains_key(model)
    }

    /// The name to send for the caller's `model`, when it differs.
    pub fn renamed(&self, model: &str) -> Option<&str> {
        self.models
            .get(model)
            .map(String::as_str)
            .filter(|m| *m != model)
    }
}

fn one() -> f64 {
    1.0
}

fn first_byte_default() -> u64 {
    30_000
}

fn total_default() -> u64 {
    600_000
}

fn breaker_open_default() -> u64 {
    30_000
}

/// Reads the upstream list: `UPSTREAMS` (a JSON array) wins over `UPSTREAM_URL`.
pub fn configured(
    upstreams_json: Option<&str>,
    single_url: Option<&str>,
    price_in: f64,
    price_out: f64,
) -> Result<Vec<Upstream>, String> {
    if let Some(json) = upstreams_json.filter(|j| !j.trim().is_empty()) {
        let list: Vec<Upstream> =
            serde_json::from_str(json).map_err(|e| format!("UPSTREAMS: {e}"))?;
        if list.is_empty() {
            return Err("UPSTREAMS is empty".into());
        }
        let sound = |u: &Upstream| {
            u.weight.is_finite()
                && u.weight > 0.0
                && u.price_in_per_1k >= 0.0
                && u.price_out_per_1k >= 0.0
                && u.first_byte_timeout_ms > 0
                && u.total_timeout_ms >= u.first_byte_timeout_ms
        };
        if let Some(bad) = list.iter().find(|u| !sound(u)) {
            return Err(format!(
                "UPSTREAMS: `{}` needs a positive weight, non-negative prices and a total \
                 timeout no shorter than its first-byte timeout",
                bad.name
            ));
        }
        return Ok(list);
    }
    let url = single_url
        .filter(|u| !u.is_empty())
        .ok_or("no upstream configured (UPSTREAMS or UPSTREAM_URL)")?;
    Ok(vec![Upstream {
        name: "default".into(),
        url: url.into(),
        price_in_per_1k: price_in,
        price_out_per_1k: price_out,
        weight: 1.0,
        priority: 0,
        first_byte_timeout_ms: first_byte_default(),
        total_timeout_ms: total_default(),
        supports_verify: false,
        models: BTreeMap::new(),
        api_key_secret: None,
        breaker_open_ms: breaker_open_default(),
    }])
}

/// Failures in a row that open a breaker.
pub const FAILURES_TO_OPEN: u32 = 3;

/// One upstream's circuit breaker: closed until [`FAILURES_TO_OPEN`] failures in a row, then
/// open for the upstream's `breaker_open_ms`, then half-open: one probe at a time, on a lease,
/// so a probe whose request vanished does not keep it shut.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Breaker {
    pub failures: u32,
    pub open_until_ms: i64,
    /// Until when the half-open probe is out.
    pub probe_until_ms: i64,
}

impl Breaker {
    /// Whether a request may go now, taking the half-open probe (leased for `lease_ms`) when
    /// it is due.
    pub fn allow(&mut self, now_ms: i64, lease_ms: i64) -> bool {
        if self.failures < FAILURES_TO_OPEN {
            return true;
        }
        if now_ms < self.open_until_ms || now_ms < self.probe_until_ms {
            return false;
        }
        self.probe_until_ms = now_ms + lease_ms;
        true
    }

    /// A success closes it.
    pub fn success(&mut self) {
        *self = Breaker::default();
    }

    /// A failure counts towards opening it for `open_ms` (and a failed probe reopens it).
    pub fn failure(&mut self, now_ms: i64, open_ms: i64) {
        self.failures += 1;
        self.probe_until_ms = 0;
        if self.failures >= FAILURES_TO_OPEN {
            self.open_until_ms = now_ms + open_ms;
        }
    }

    /// Whether it is open (or half-open).
    #[cfg(test)]
    pub fn is_open(&self) -> bool {
        self.failures >= FAILURES_TO_OPEN
    }
}

/// Whether a request may go to an upstream, and its failures in a row so far (a success
/// need not be reported while there are none).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Admission {
    pub allowed: bool,
    pub failures: u32,
}

/// Breakers kept in one worker isolate, where the deployment's health object is not bound.
#[derive(Debug, Default)]
pub struct Breakers {
    by_name: HashMap<String, Breaker>,
}

impl Breakers {
    /// Whether a request may go to `name` now ([`Breaker::allow`]).
    pub fn admit(&mut self, name: &str, now_ms: i64, lease_ms: i64) -> Admission {
        let b = self.by_name.entry(name.to_owned()).or_default();
        Admission {
            allowed: b.allow(now_ms, lease_ms),
            failures: b.failures,
        }
    }

    /// How a request to `name` went.
    pub fn report(&mut self, name: &str, ok: bool, now_ms: i64, open_ms: i64) {
        let b = self.by_name.entry(name.to_owned()).or_default();
        if ok {
            b.success();
        } else {
            b.failure(now_ms, open_ms);
        }
    }
}

/// The order to try upstreams in: by priority, and within a priority a weighted shuffle
/// drawn from `random` (uniform in [0, 1)).
pub fn order(list: &[Upstream], mut random: impl FnMut() -> f64) -> Vec<usize> {
    let mut priorities: Vec<u32> = list.iter().map(|u| u.priority).collect();
    priorities.sort_unstable();
    priorities.dedup();
    let mut out = Vec::with_capacity(list.len());
    for p in priorities {
        let mut group: Vec<usize> = (0..list.len()).filter(|&i| list[i].priority == p).collect();
        while !group.is_empty() {
            let total: f64 = group.iter().map(|&i| list[i].weight).sum();
            let mut at = random() * total;
            let pick = group
                .iter()
                .position(|&i| {
                    at -= list[i].weight;
                    at < 0.0
                })
                .unwrap_or(group.len() - 1);
            out.push(group.remove(pick));
        }
    }
    out
}

/// A uniform [0, 1) stream determined by `key` (FNV-1a seeding SplitMix64), for orders that
/// must repeat for the same key.
pub fn keyed_random(key: &str) -> impl FnMut() -> f64 {
    let mut state = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(name: &str, weight: f64, priority: u32) -> Upstream {
        Upstream {
            name: name.into(),
            url: format!("http://{name}"),
            price_in_per_1k: 0.0,
            price_out_per_1k: 0.0,
            weight,
            priority,
            first_byte_timeout_ms: 1000,
            total_timeout_ms: 2000,
            supports_verify: false,
            models: BTreeMap::new(),
            api_key_secret: None,
            breaker_open_ms: 30_000,
        }
    }

    #[test]
    fn a_model_map_limits_and_renames() {
        let list = configured(
            Some(r#"[{"name":"a","url":"http://a","models":{"fast":"llama-8b","same":"same"}},{"name":"b","url":"http://b"}]"#),
            None,
            0.0,
            0.0,
        )
        .expect("json");
        assert!(list[0].serves("fast") && !list[0].serves("other"));
        assert!(list[1].serves("other"), "no map: any model");
        assert_eq!(list[0].renamed("fast"), Some("llama-8b"));
        assert_eq!(list[0].renamed("same"), None);
        assert_eq!(list[1].renamed("fast"), None);
        assert_eq!(list[0].total_timeout_ms, 600_000);
    }

    #[test]
    fn configuration_from_json_or_a_single_url_with_clear_errors() {
        let list = configured(
            Some(r#"[{"name":"a","url":"http://a","weight":2},{"name":"b","url":"http://b","priority":1}]"#),
            None,
            0.0,
            0.0,
        )
        .expect("json");
        assert_eq!(list.len(), 2);
        assert_eq!(list[1].first_byte_timeout_ms, 30_000);
        let single = configured(None, Some("http://x"), 1.0, 2.0).expect("single");
        assert_eq!(single[0].price_out_per_1k, 2.0);
        assert!(configured(Some("[]"), None, 0.0, 0.0).is_err());
        assert!(
            configured(
                Some(r#"[{"name":"a","url":"u","colour":1}]"#),
                None,
                0.0,
                0.0
            )
            .is_err()
        );
        assert!(
            configured(
                Some(r#"[{"name":"a","url":"u","weight":0}]"#),
                None,
                0.0,
                0.0
            )
            .is_err()
        );
        assert!(configured(None, None, 0.0, 0.0).is_err());
        assert!(
            configured(
                Some(r#"[{"name":"a","url":"u","first_byte_timeout_ms":5000,"total_timeout_ms":100}]"#),
                None,
                0.0,
                0.0
            )
            .is_err(),
            "a total timeout shorter than the first byte's"
        );
    }

    #[test]
    fn priorities_first_then_weights() {
        let list = [up("backup", 1.0, 1), up("big", 3.0, 0), up("small", 1.0, 0)];
        let mut firsts = [0usize; 3];
        let mut seed = 1u64;
        for _ in 0..4000 {
            let o = order(&list, || {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 11) as f64 / (1u64 << 53) as f64
            });
            assert_eq!(o.len(), 3);
            assert_eq!(o[2], 0, "the backup always comes last");
            firsts[o[0]] += 1;
        }
        // `big` carries three quarters of the first tries.
        let share = firsts[1] as f64 / 4000.0;
        assert!((share - 0.75).abs() < 0.04, "{share}");
    }

    #[test]
    fn a_keyed_order_repeats_for_its_key_and_keys_still_spread_by_weight() {
        let list = [up("big", 3.0, 0), up("small", 1.0, 0)];
        for key in ["session-1", "s2", "x"] {
            assert_eq!(
                order(&list, keyed_random(key)),
                order(&list, keyed_random(key))
            );
        }
        let big_first = (0..4000)
            .filter(|i| order(&list, keyed_random(&format!("s{i}")))[0] == 0)
            .count();
        let share = big_first as f64 / 4000.0;
        assert!((share - 0.75).abs() < 0.04, "{share}");
    }

    #[test]
    fn a_breaker_opens_after_failures_and_lets_one_probe_through_later() {
        const OPEN: i64 = 30_000;
        const LEASE: i64 = 1_000;
        let mut b = Breaker::default();
        for _ in 0..FAILURES_TO_OPEN {
            assert!(b.allow(0, LEASE));
            b.failure(0, OPEN);
        }
        assert!(b.is_open());
        assert!(!b.allow(1_000, LEASE));
        assert!(b.allow(OPEN, LEASE), "half-open probe");
        assert!(!b.allow(OPEN + 1, LEASE), "only one probe at a time");
        assert!(
            b.allow(OPEN + LEASE, LEASE),
            "a probe that never reported lets another go"
        );
        b.failure(OPEN + LEASE + 1, OPEN);
        assert!(!b.allow(OPEN + LEASE + 2, LEASE), "a failed probe reopens");
        assert!(b.allow(2 * OPEN + LEASE + 1, LEASE));
        b.success();
        assert!(!b.is_open());
        let mut isolate = Breakers::default();
        isolate.report("a", false, 0, OPEN);
        assert_eq!(
            isolate.admit("a", 0, LEASE),
            Admission {
                allowed: true,
                failures: 1
            }
        );
        assert!(
            isolate.admit("b", 0, LEASE).allowed,
            "others are unaffected"
        );
    }
}
