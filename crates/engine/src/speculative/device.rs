//! Drafting and verifying on a [`DeviceModel`] (WebGPU in a browser, wgpu natively): the same
//! code as the CPU model's, through [`crate::CausalLm`].

use super::{Draft, draft_greedy};
#[cfg(not(target_arch = "wasm32"))]
use super::{Verdict, verify_after};
use crate::config::ModelError;
use crate::device_model::{DeviceCache, DeviceModel};
#[cfg(not(target_arch = "wasm32"))]
use crate::sample::{Rng, SamplingParams};

impl DeviceModel {
    /// [`crate::model::Model::draft`] on the device.
    pub async fn draft(
        &self,
        cache: &mut DeviceCache,
        last_logits: &[f32],
        k: usize,
    ) -> Result<Draft, ModelError> {
        draft_greedy(self, cache, last_logits, k).await
    }

    /// [`crate::model::Model::verify_after`] on the device, blocking on the readback (a native
    /// server).
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
        verify_after(self, cache, pending, draft, params, context, rng)
    }
}
