//! What the cloud charges: one formula, used by the router's estimates and the worker's
//! holds and bills alike.

/// Prices of a cloud model, in USD per 1,000 tokens.
/// The default is free (an answer no upstream gave).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Price {
    pub in_per_1k: f64,
    pub out_per_1k: f64,
}

impl Price {
    /// The cost in USD of `tokens_in` input and `tokens_out` output tokens.
    pub fn cost(&self, tokens_in: f64, tokens_out: f64) -> f64 {
        tokens_in / 1000.0 * self.in_per_1k + tokens_out / 1000.0 * self.out_per_1k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_and_output_are_priced_per_thousand() {
        let p = Price {
            in_per_1k: 0.5,
            out_per_1k: 2.0,
        };
        assert_eq!(p.cost(2000.0, 500.0), 1.0 + 1.0);
        assert_eq!(p.cost(0.0, 0.0), 0.0);
    }
}
