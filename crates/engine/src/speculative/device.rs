//! Drafting on a [`DeviceModel`] (WebGPU in a browser, wgpu natively): the same code as the
//! CPU model's, through [`crate::CausalLm`]; natively it verifies through
//! [`super::verify_after`] as every blocking model does.

use super::{Draft, draft_greedy};
use crate::config::ModelError;
use crate::device_model::{DeviceCache, DeviceModel};

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
}
