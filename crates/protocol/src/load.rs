//! How loaded a cloud server is (`GET /v1/load`), as the server reports it and the worker
//! relays it to the page, whose router adds the wait to the cloud's latency.

use serde::{Deserialize, Serialize};

/// A cloud server's load at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// Requests waiting for a slot.
    pub queued: u32,
    /// Requests being answered.
    pub active: u32,
    /// How many requests it answers at once.
    pub slots: u32,
    /// Its decode rate per sequence, tokens per second, over what it has served; `None`
    /// before it has decoded anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f32>,
}

impl LoadReport {
    /// The load of two servers that share the traffic: their queues and slots added, the
    /// slower decode rate kept.
    pub fn plus(self, other: LoadReport) -> LoadReport {
        let tokens_per_s = match (self.tokens_per_s, other.tokens_per_s) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        LoadReport {
            queued: self.queued + other.queued,
            active: self.active + other.active,
            slots: self.slots + other.slots,
            tokens_per_s,
        }
    }

    /// Seconds a new request waits for a slot, if each request ahead of it takes
    /// `service_s`: the queue drains `slots` requests at a time.
    pub fn wait_s(&self, service_s: f64) -> f64 {
        let slots = self.slots.max(1);
        if self.active + self.queued < slots {
            return 0.0;
        }
        // Ahead of a new request: everything queued, and a slot's worth of those active.
        let rounds = f64::from(self.queued / slots + 1);
        rounds * service_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_slot_means_no_wait_and_a_full_queue_waits_in_rounds() {
        let load = |queued, active| LoadReport {
            queued,
            active,
            slots: 4,
            tokens_per_s: Some(20.0),
        };
        assert_eq!(load(0, 3).wait_s(2.0), 0.0);
        assert_eq!(load(0, 4).wait_s(2.0), 2.0);
        assert_eq!(load(4, 4).wait_s(2.0), 4.0);
        assert_eq!(load(9, 4).wait_s(2.0), 6.0);
    }
}
