//! The request's inputs: where an answer may run and what the caller measured.

use serde::{Deserialize, Serialize};

use crate::energy::{Battery, EdgeBackend};
use crate::signals;
use straddle_protocol::LoadReport;

/// Where to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    Edge,
    Cloud,
    /// The edge drafts, the cloud verifies each draft in one pass: the cloud's answer, token
    /// for token, for a fraction of its forward passes and output-token price.
    Speculative,
}

impl Target {
    /// The wire name (`edge`, `cloud`, `speculative`).
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Edge => "edge",
            Target::Cloud => "cloud",
            Target::Speculative => "speculative",
        }
    }
}

/// What the caller knows about the device and the network (measured by the web crate).
/// `Default` is offline with no edge model: name what is known and default the rest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Context {
    pub online: bool,
    /// Whether the edge model is loaded and can run.
    pub edge_available: bool,
    /// Measured edge decode speed.
    pub edge_tokens_per_s: f32,
    /// Measured round trip to the worker.
    pub rtt_ms: f32,
    /// Languages the edge model handles (GGUF `general.languages`).
    pub edge_languages: Vec<String>,
    /// The cloud can verify edge drafts: the worker's upstream serves `/v1/verify` and the
    /// tokenizer hash its `/v1/models` reports equals the edge model's.
    #[serde(default)]
    pub cloud_verifies: bool,
    /// Measured bandwidth to the worker, kilobits per second: uploading the prompt adds to
    /// the cloud's latency. Unknown: not counted.
    #[serde(default)]
    pub bandwidth_kbps: Option<f32>,
    /// Measured edge prefill speed, prompt tokens per second: the edge reads the prompt
    /// before its first token. Unknown: not counted.
    #[serde(default)]
    pub edge_prefill_tokens_per_s: Option<f32>,
    /// The longest conversation the edge can hold, in tokens (its KV cache, sized from the
    /// device's memory); a longer one cannot run there.
    #[serde(default)]
    pub edge_context_tokens: Option<u32>,
    /// What the tenant has left to spend, USD (the worker's usage report): a request
    /// expected to cost more stays on the edge.
    #[serde(default)]
    pub budget_remaining_usd: Option<f64>,
    /// SHA-256 of the loaded edge model's GGUF (hex): the quality model uses the edge's
    /// first-token signals only for the model it was trained for.
    #[serde(default)]
    pub edge_model_sha256: Option<String>,
    /// The device's battery (the Battery Status API), where the browser reports one.
    #[serde(default)]
    pub battery: Option<Battery>,
    /// Where the edge model runs, for its energy per token.
    #[serde(default)]
    pub edge_backend: Option<EdgeBackend>,
    /// The request holds its answer to a schema or a tool call (`response_format`, `tools`):
    /// the answer's expected length then follows the schema.
    #[serde(default)]
    pub structured: Option<signals::StructuredOutput>,
    /// The cloud server's load as the worker relays it (`GET /v1/load`): its queue adds to
    /// the cloud's latency, its measured rate replaces the policy's. Unknown: no queue.
    #[serde(default)]
    pub cloud_load: Option<LoadReport>,
    /// The cloud's measured time to first token (the page's running average), for an
    /// upstream that reports no load: what it takes beyond the round trip counts as queue.
    #[serde(default)]
    pub cloud_ttft_ms: Option<f32>,
    /// Seconds until the on-device engine is free for this request: the answers ahead of
    /// it on this page.
    #[serde(default)]
    pub edge_busy_s: Option<f32>,
    /// The browser asks pages to save data (the Network Information API's `saveData`):
    /// speculation, which sends the drafts up again with every verify call, is not chosen.
    #[serde(default)]
    pub save_data: bool,
}
