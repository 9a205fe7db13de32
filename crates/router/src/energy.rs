//! What an answer costs the device's battery. Energy per token is an assumption, not a
//! measurement (a browser cannot read the device's power draw): the defaults below are for a
//! ~100M-parameter quantized model, the policy may replace them, and every decision traces
//! the joules it assumed. A device on mains power or charging, or one whose browser reports
//! no battery, pays nothing for energy.

use serde::{Deserialize, Serialize};

/// The battery as the Battery Status API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Battery {
    /// Charge, 0–1.
    pub level: f32,
    pub charging: bool,
}

/// Where the edge model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EdgeBackend {
    Webgpu,
    Cpu,
}

/// Joules per token, and what counts as a low battery.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnergyModel {
    /// Each token the edge decodes on the GPU, and on CPU threads (a phone's CPU spends
    /// several times the GPU's energy on the same matrix work).
    pub webgpu_j_per_token: f64,
    pub cpu_j_per_token: f64,
    /// A prompt token costs this share of a decoded one (prefill is batched).
    pub prefill_share: f64,
    /// Each token sent or received over the network, radio included.
    pub radio_j_per_token: f64,
    /// At or below this charge, discharging, long answers leave the device.
    pub low_battery: f32,
    /// What "long" means there: expected output tokens.
    pub low_battery_output_tokens: u32,
}

impl Default for EnergyModel {
    fn default() -> Self {
        EnergyModel {
            webgpu_j_per_token: 0.1,
            cpu_j_per_token: 0.3,
            prefill_share: 0.1,
            radio_j_per_token: 0.005,
            low_battery: 0.2,
            low_battery_output_tokens: 64,
        }
    }
}

impl EnergyModel {
    /// Joules the edge spends reading `prompt_tokens` and writing `output_tokens`; an unknown
    /// backend is taken to be the CPU (the dearer).
    pub fn edge_joules(
        &self,
        backend: Option<EdgeBackend>,
        prompt_tokens: u32,
        output_tokens: u32,
    ) -> f64 {
        let per_token = match backend {
            Some(EdgeBackend::Webgpu) => self.webgpu_j_per_token,
            _ => self.cpu_j_per_token,
        };
        per_token * (f64::from(output_tokens) + self.prefill_share * f64::from(prompt_tokens))
    }

    /// Joules the device spends sending the prompt and receiving the answer.
    pub fn cloud_joules(&self, prompt_tokens: u32, output_tokens: u32) -> f64 {
        self.radio_j_per_token * f64::from(prompt_tokens + output_tokens)
    }

    /// Whether the battery is low and not charging.
    pub fn battery_low(&self, battery: Option<Battery>) -> bool {
        battery.is_some_and(|b| !b.charging && b.level <= self.low_battery)
    }

    /// Checks that every value is usable.
    pub fn validate(&self) -> Result<(), String> {
        let joules = [
            self.webgpu_j_per_token,
            self.cpu_j_per_token,
            self.prefill_share,
            self.radio_j_per_token,
        ];
        if joules.iter().any(|j| !j.is_finite() || *j < 0.0) {
            return Err("energy: joules per token must be finite and non-negative".into());
        }
        if !(0.0..=1.0).contains(&self.low_battery) {
            return Err("energy.low_battery must lie in 0..=1".into());
        }
        Ok(())
    }
}

/// How dear a joule is now: 0 on mains power or charging (or with no battery reported), and
/// on battery the inverse of the charge left, so the last fifth of a battery costs five times
/// the first.
pub fn drain(battery: Option<Battery>) -> f64 {
    match battery {
        Some(b) if !b.charging => 1.0 / f64::from(b.level.clamp(0.05, 1.0)),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joules_follow_the_backend_and_drain_the_charge() {
        let m = EnergyModel::default();
        let gpu = m.edge_joules(Some(EdgeBackend::Webgpu), 100, 200);
        assert!((gpu - 0.1 * 210.0).abs() < 1e-9);
        assert!(
            m.edge_joules(None, 100, 200) > gpu,
            "an unknown backend is the CPU"
        );
        assert!(m.cloud_joules(100, 200) < gpu / 10.0);
        let on = |level, charging| Some(Battery { level, charging });
        assert_eq!(drain(None), 0.0);
        assert_eq!(drain(on(0.1, true)), 0.0);
        assert!((drain(on(0.5, false)) - 2.0).abs() < 1e-6);
        assert!(m.battery_low(on(0.15, false)) && !m.battery_low(on(0.15, true)));
        assert!(!m.battery_low(None));
        let bad = EnergyModel {
            cpu_j_per_token: -1.0,
            ..m
        };
        assert!(bad.validate().is_err());
    }
}
