//! What generation needs of a model: a causal language model that runs chunks of tokens
//! against caches of its own. The CPU [`Model`] and the burn `DeviceModel` implement it, so
//! the loop, batching and speculation (`Engine<M>`, `Speculation`) are written once.
//!
//! Passes are `async` because a browser reads GPU results back asynchronously; everywhere
//! else they finish without waiting, and [`BlockingLm`] marks the models whose callers may
//! run them synchronously.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use crate::chunk::Chunk;
use crate::config::ModelError;
use crate::kv::KvCache;
use crate::model::Model;

/// One sequence's keys and values, as the generation loop and speculation see them.
pub trait ModelCache: Sized {
    /// Positions filled.
    fn filled(&self) -> usize;
    /// Forgets positions from `len` on (a rejected draft, a prompt that shares only a prefix).
    fn rewind(&mut self, len: usize);
    /// Positions it can hold.
    fn room(&self) -> usize;
    /// A copy of the first `n` positions, to start later prompts that begin the same way;
    /// `None` where computing them again costs less than the copy (a device's cache).
    fn prefix(&self, n: usize) -> Option<Self>;
}

/// A model that runs chunks of tokens at its caches' next positions and returns logits.
// Callers are single-threaded (a browser tab, a blocking server step), so the futures need
// no `Send`.
#[allow(async_fn_in_trait)]
pub trait CausalLm {
    /// One sequence's keys and values.
    type Cache: ModelCache;

    /// An empty cache for `positions` (capped at the context the model covers).
    fn new_cache(&self, positions: usize) -> Self::Cache;

    /// Grows `cache` to `positions` (capped likewise), keeping what it holds.
    fn reserve(&self, cache: &mut Self::Cache, positions: usize);

    /// Runs `chunks[i]` at `caches[i]`'s next positions, all in one pass (continuous
    /// batching); one entry per chunk, the last token's logits where the chunk wants them.
    async fn forward_chunks(
        &self,
        chunks: &[Chunk<'_>],
        caches: &mut [&mut Self::Cache],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError>;

    /// Runs `tokens` after the cache's contents and returns the last position's logits.
    async fn forward_last(
        &self,
        tokens: &[u32],
        cache: &mut Self::Cache,
    ) -> Result<Vec<f32>, ModelError>;

    /// Runs `tokens` after the cache's contents and returns every position's logits, each as
    /// decoding it alone would give it (what verifying a draft needs).
    async fn forward_all(
        &self,
        tokens: &[u32],
        cache: &mut Self::Cache,
    ) -> Result<Vec<Vec<f32>>, ModelError>;

    /// The final hidden state (after the output norm) at the last position of `cache` whose
    /// logits a pass computed: after prefill, the state a probe of the model reads to judge
    /// whether its answer will be good.
    async fn last_state(&self, cache: &Self::Cache) -> Result<Option<Vec<f32>>, ModelError>;
}

/// A model whose passes finish without waiting (the CPU model everywhere, a device model
/// outside the browser, whose readback blocks): synchronous callers may run it.
pub trait BlockingLm: CausalLm {
    /// [`CausalLm::forward_chunks`], run to completion on this thread.
    fn forward_chunks_blocking(
        &self,
        chunks: &[Chunk<'_>],
        caches: &mut [&mut Self::Cache],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        ready(self.forward_chunks(chunks, caches))
    }

    /// [`CausalLm::forward_last`], run to completion on this thread.
    fn forward_last_blocking(
        &self,
        tokens: &[u32],
        cache: &mut Self::Cache,
    ) -> Result<Vec<f32>, ModelError> {
        ready(self.forward_last(tokens, cache))
    }

    /// [`CausalLm::forward_all`], run to completion on this thread.
    fn forward_all_blocking(
        &self,
        tokens: &[u32],
        cache: &mut Self::Cache,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        ready(self.forward_all(tokens, cache))
    }
}

/// The value of a pass of a [`BlockingLm`], which never waits: the shared async code runs to
/// completion in one poll.
pub(crate) fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(value) => value,
        // Only `BlockingLm` models are run this way, and their passes never wait.
        Poll::Pending => unreachable!("a blocking model's pass awaited"),
    }
}

/// [`ModelCache`]'s sizes for a cache that has them as `len`, `truncate` and `capacity`.
macro_rules! cache_sizes {
    () => {
        fn filled(&self) -> usize {
            self.len()
        }

        fn rewind(&mut self, len: usize) {
            self.truncate(len);
        }

        fn room(&self) -> usize {
            self.capacity()
        }
    };
}
// The device model's cache is the other user, and only with the `device` feature.
#[cfg(feature = "device")]
pub(crate) use cache_sizes;

impl ModelCache for KvCache {
    cache_sizes!();

    fn prefix(&self, n: usize) -> Option<Self> {
        KvCache::prefix(self, n)
    }
}

impl CausalLm for Model {
    type Cache = KvCache;

    fn new_cache(&self, positions: usize) -> KvCache {
        Model::new_cache(self, positions)
    }

    fn reserve(&self, cache: &mut KvCache, positions: usize) {
        cache.reserve(positions.min(self.max_context()));
    }

    async fn forward_chunks(
        &self,
        chunks: &[Chunk<'_>],
        caches: &mut [&mut KvCache],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        Model::forward_chunks(self, chunks, caches)
    }

    async fn forward_last(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
    ) -> Result<Vec<f32>, ModelError> {
        Ok(self
            .forward(tokens, cache, false)?
            .pop()
            .unwrap_or_default())
    }

    async fn forward_all(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.forward_decoded(tokens, cache)
    }

    async fn last_state(&self, cache: &KvCache) -> Result<Option<Vec<f32>>, ModelError> {
        Ok(cache.last_state().map(<[f32]>::to_vec))
    }
}

impl BlockingLm for Model {}
