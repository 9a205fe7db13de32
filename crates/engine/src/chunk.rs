//! A sequence's tokens in a forward pass, and the pass they belong to: a prompt fed in
//! chunks (chunked prefill) or after a reused prefix still takes the places one pass over the
//! whole prompt gives its tokens, so that its answer does not depend on how it was fed.

use std::ops::Range;

use crate::qmatrix::Place;

/// One sequence's tokens for a forward pass, at its cache's next positions.
#[derive(Debug, Clone)]
pub struct Chunk<'a> {
    /// The tokens.
    pub tokens: &'a [u32],
    /// The positions of the pass they are part of (a whole prompt, however it is fed); each
    /// token is computed as that pass would compute it.
    pub pass: Range<usize>,
    /// Whether the last token's logits are wanted.
    pub want_logits: bool,
}

impl Chunk<'_> {
    /// Each token's place in its pass, the first token at position `start`.
    pub(crate) fn places(&self, start: usize) -> impl Iterator<Item = Place> + '_ {
        (start..start + self.tokens.len()).map(|at| self.place(at))
    }

    fn place(&self, at: usize) -> Place {
        debug_assert!(self.pass.contains(&at), "{at} outside {:?}", self.pass);
        Place::in_pass(at.saturating_sub(self.pass.start), self.pass.len())
    }
}
