//! Drafting on a [`DeviceModel`] (WebGPU in a browser, wgpu natively): the same loop and
//! bookkeeping as the CPU model's, with the passes awaited.

use super::{Draft, DraftCache, DraftLength, Drafter, Speculation, draft_greedy};
#[cfg(not(target_arch = "wasm32"))]
use super::{Verdict, verify_after_with};
use crate::device_engine::DeviceEngine;
use crate::device_model::{DeviceCache, DeviceModel};
use crate::generate::{EngineError, GenerateParams, Prompt};
use crate::model::ModelError;
#[cfg(not(target_arch = "wasm32"))]
use crate::sample::{Rng, SamplingParams};

draft_cache!(DeviceCache);

impl Drafter for DeviceModel {
    type Cache = DeviceCache;

    async fn forward_last(
        &self,
        tokens: &[u32],
        cache: &mut DeviceCache,
    ) -> Result<Vec<f32>, ModelError> {
        Ok(self
            .forward_read(tokens, cache, false)
            .await?
            .pop()
            .unwrap_or_default())
    }
}

impl DeviceModel {
    /// [`Model::draft`] on the device.
    pub async fn draft(
        &self,
        cache: &mut DeviceCache,
        last_logits: &[f32],
        k: usize,
    ) -> Result<Draft, ModelError> {
        draft_greedy(self, cache, last_logits, k).await
    }

    /// [`Model::verify_after`] on the device, blocking on the readback (a native server).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn verify_after(
        &self,
        cache: &mut DeviceCache,
        pending: u32,
        draft: &[u32],
        params: &SamplingParams,
        context: &[u32],
        rng: &mut Rng,
    ) -> Result<Verdict, ModelError> {
        verify_after_with(
            cache,
            pending,
            draft,
            params,
            context,
            rng,
            |input, cache| self.forward_blocking(input, cache, true),
        )
    }
}

impl Speculation<DeviceCache> {
    /// [`Speculation::start`] with the drafting model on a device (WebGPU in a browser).
    pub async fn start_on_device(
        engine: &DeviceEngine,
        prompt: Prompt<'_>,
        params: &GenerateParams,
        lengths: DraftLength,
    ) -> Result<Self, EngineError> {
        let (prompt, mut cache) = engine.prompt_and_cache(prompt, params.context)?;
        let logits = engine.model.forward_last(&prompt, &mut cache).await?;
        Ok(Self::prefilled(cache, logits, prompt, params, lengths))
    }
}
