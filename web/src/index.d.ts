// Types of Straddle's JS API (`import { Straddle } from "straddle"`).

/** Why something failed; stable across versions. */
export type StraddleErrorCode =
  | "invalid_request" // a request field is wrong (`param` names it)
  | "invalid_options" // an option of Straddle.create is wrong
  | "wasm_unavailable" // the .wasm could not be fetched or compiled
  | "model_fetch" // the model could not be downloaded
  | "model_integrity" // the model's SHA-256 did not match `sha256`
  | "insufficient_memory" // the model is too large for this device (refused before any download)
  | "storage_quota" // the site's storage has no room for the model (refused before any download)
  | "model_not_found" // Straddle.models.delete: no stored model has that id
  | "model_invalid" // the file is not a model this engine can run (truncated, hostile, unsupported)
  | "webgpu_unavailable" // backend "webgpu" was asked for and the browser has none
  | "edge_unavailable" // no on-device model, and the cloud may not answer
  | "edge_failed" // the engine failed (out of memory, its worker crashed) and could not be loaded again
  | "device_lost" // the GPU device under the model was lost, and the model could not be loaded again
  | "privacy_no_route" // the request must stay on the device, and the device cannot answer
  | "cloud_unavailable" // no worker configured, cloud switched off, or offline
  | "cloud_unreachable" // the worker did not answer
  | "timeout" // the worker sent no headers in time
  | "unauthorized" | "forbidden" | "budget_exhausted" | "rate_limited" | "privacy_refused" | "too_large"
  | "cloud_rejected" // another 4xx from the worker
  | "upstream_error" // a 5xx or a malformed answer
  | "upstream_cut" // the cloud stream broke off after the answer had started
  | "aborted" // the caller's AbortSignal fired
  | "unknown_answer"; // feedback for an id this session never returned

export class StraddleError extends Error {
  readonly name: "StraddleError";
  readonly code: StraddleErrorCode;
  /** The HTTP status, for errors that came from the worker. */
  readonly status?: number;
  /** The request field at fault, for `invalid_request`. */
  readonly param?: string;
}

export type PolicyPreset = "balanced" | "low-latency" | "high-accuracy" | "low-cost" | "offline" | "privacy-strict" | "battery-saver";

/** Adjustments over a preset (any field of the router's policy document). */
export interface PolicyOverrides {
  preset?: PolicyPreset;
  version?: string;
  keep_on_device_at?: "low" | "medium" | "high" | "critical";
  long_output_tokens?: number;
  weights?: { latency: number; cost: number; quality: number };
  cloud_price_in_per_1k?: number;
  cloud_price_out_per_1k?: number;
  cloud_tokens_per_s?: number;
  edge_quality?: number;
  cloud_quality?: number;
  cascade?: { window: number; min_mean_logprob: number; max_mean_entropy: number; detect_refusals: boolean };
  /** Draft acceptance below which a speculative reply hands the rest to plain cloud streaming (0.3; 0 never). */
  speculative_min_acceptance?: number;
  /** Least P(edge answer acceptable) at the edge's first token for the edge to answer (0.5; half of it before generation). */
  min_edge_quality?: number;
  [field: string]: unknown;
}

export interface LoadProgress {
  phase: "download" | "cache" | "verify" | "compile" | "ready";
  loaded: number;
  total: number;
  /** null while the total is unknown. */
  percent: number | null;
  /** Download only: the rate so far, and the seconds left at that rate (null until known). */
  bytesPerS?: number | null;
  secondsLeft?: number | null;
}

export interface StraddleOptions {
  /** URL of the GGUF model for this device; omit for a cloud-only client. */
  model?: string;
  /** Lowercase hex SHA-256 the model must have; a mismatch is `model_integrity`. */
  sha256?: string;
  /** The edge worker's base URL; omit for an edge-only client. */
  worker?: string;
  /** The tenant token (from the tenant's backend), or a function that fetches a fresh one. */
  token?: string | (() => string | Promise<string>);
  policy?: PolicyPreset | PolicyOverrides;
  /** "auto": WebGPU on a real GPU, the wasm CPU kernels otherwise. */
  backend?: "auto" | "webgpu" | "cpu";
  /**
   * Threads for the CPU backend: "auto" (default) uses every core the browser reports when the
   * page is cross-origin isolated (served with `Cross-Origin-Opener-Policy: same-origin` and
   * `Cross-Origin-Embedder-Policy: require-corp`), else 1; a number caps it; 1 never starts the
   * threaded build. `device().threads` says what ran, `device().threadsError` why not more.
   */
  threads?: "auto" | number;
  /**
   * Tokens of conversation the device's engine holds (default 1024, at most what the model was
   * trained for). Before downloading the model, its header says what it needs at this
   * context; where the device's memory holds less, the context is halved (down to 256) until
   * it fits, and `device().contextTokens` says what was chosen.
   */
  contextTokens?: number;
  onProgress?: (p: LoadProgress) => void;
  /** false: never send anything to the cloud. Default true. */
  cloud?: boolean;
  /** Replace personal data with placeholders before upload, restoring it locally. Default true. */
  redact?: boolean;
  /**
   * Keep the model in this site's storage across reloads (OPFS, where a cut download resumes;
   * the Cache API where a browser has no OPFS), after checking the storage quota. Default true.
   */
  cacheModel?: boolean;
  /** Resolve `create` only once the model is loaded (default), or at once. */
  waitForModel?: boolean;
  /**
   * Where the router reads the battery: a function resolving to an object with `level` (0–1)
   * and `charging`, read on every decision (a `BatteryManager` stays current). Default: the
   * Battery Status API where the browser has one; none means mains power.
   */
  battery?: () => Promise<{ level: number; charging: boolean }>;
  /** How long the worker may take to send headers before the edge answers instead. Default 15000. */
  firstByteTimeoutMs?: number;
  /** `model` sent to the cloud. Default "default". */
  cloudModel?: string;
  /** Groups cost records at the worker. Default: a random id per client. */
  session?: string;
  /** The product feature these requests serve, for the tenant's cost report. */
  feature?: string;
  /**
   * Let `feedback` steer routing: a contextual bandit (kept in IndexedDB per policy version)
   * replaces the fixed score once it has feedback on both routes; rules (privacy, offline)
   * still decide first. Default false.
   */
  learn?: boolean;
  /**
   * Report edge answers' usage to the worker (default true): counts, timings and versions,
   * never text, in batches, so the tenant's usage covers both tiers.
   */
  reportUsage?: boolean;
  /**
   * Let the router choose speculative decoding (this device drafts, the cloud verifies) when
   * the worker's cloud verifies drafts with the same tokenizer. Default true.
   */
  speculative?: boolean;
  /** Where the .wasm is, when not next to the package. */
  wasmUrl?: string | URL;
}

/** A part of a message's content; only text parts are supported. */
export interface TextPart {
  type: "text";
  text: string;
}

export interface ChatMessage {
  role: "system" | "user" | "assistant" | "tool";
  /** Text, or an array of text parts (joined); null for an assistant turn that only called tools. */
  content: string | TextPart[] | null;
  /** The calls an assistant turn made. */
  tool_calls?: ToolCall[];
  /** The call a `tool` turn answers. */
  tool_call_id?: string;
}

/** A function the model may call. */
export interface Tool {
  type: "function";
  function: {
    /** 1 to 64 letters, digits, underscores or dashes. */
    name: string;
    description?: string;
    /** The arguments' JSON Schema. */
    parameters?: Record<string, unknown>;
    strict?: boolean;
  };
}

/** A call the assistant made; `arguments` is a JSON string. */
export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/** A streamed tool call (Straddle streams each call whole, once complete). */
export interface ToolCallDelta {
  index: number;
  id?: string;
  type?: "function";
  function?: { name?: string; arguments?: string };
}

/** Whether the model may (`auto`, the default), must, or must not call a tool, or which one. */
export type ToolChoice = "none" | "auto" | "required" | { type: "function"; function: { name: string } };

/** How an answer ended. */
export type FinishReason = "stop" | "length" | "tool_calls";

/** What the answer must be; the same on the device and in the cloud. */
export type ResponseFormat =
  | { type: "text" }
  | { type: "json_object" }
  | {
      type: "json_schema";
      json_schema: {
        name: string;
        description?: string;
        /** A JSON Schema; absent means any JSON value. */
        schema?: Record<string, unknown> | boolean;
        /** Refuse keywords that cannot be enforced, and close objects to their listed properties. */
        strict?: boolean;
      };
    };

export interface ChatRequest {
  messages: ChatMessage[];
  stream?: boolean;
  max_tokens?: number;
  temperature?: number;
  top_p?: number;
  seed?: number;
  stop?: string | string[];
  /** −2..2: subtracted once from every token already in the context. */
  presence_penalty?: number;
  /** −2..2: subtracted once per occurrence of a token in the context. */
  frequency_penalty?: number;
  /** Token id → bias in −100..100 added to its logit (−100 bans it). */
  logit_bias?: Record<string, number>;
  /** JSON answers: constrained decoding on the device, and passed to the cloud as is. */
  response_format?: ResponseFormat;
  /** Functions the model may call; a call is generated under the function's schema. */
  tools?: Tool[];
  tool_choice?: ToolChoice;
  /** Accepted; an answer makes at most one call either way. */
  parallel_tool_calls?: boolean;
  signal?: AbortSignal;
  /** Straddle's extension: insist on a route (the privacy rule still wins). */
  straddle?: { route?: "auto" | "edge" | "cloud" | "speculative" };
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/** What every response and final chunk says about how it was answered. */
export interface StraddleMeta {
  /** "speculative": the edge drafted, the cloud verified; the text is the cloud's. */
  route: "edge" | "cloud" | "speculative";
  reasons: string[];
  /** For edge answers, exp(mean log-probability) of the generated tokens. */
  confidence: number | null;
  /** Set when the preferred route failed and the other answered: why. */
  degraded: string | null;
  cost: { usd: number; prompt_tokens: number; completion_tokens: number };
  latency_ms: number;
  ttft_ms: number | null;
  model_versions: string[];
  /** Personal data was replaced before upload and restored here. */
  redacted: boolean;
  redacted_entities?: string[];
  /** The edge started, the cascade (or the check at its first token) handed the answer to the cloud. */
  escalated_mid_stream: boolean;
  /** What happened to the edge tokens of a mid-stream escalation. */
  edge_tokens: "discarded" | null;
  edge_tokens_discarded?: number;
  /** An escalated edge answer: the milliseconds the device spent prefilling the prompt before it went up. */
  edge_prefill_ms?: number | null;
  /** Prompt tokens the cloud processed again because the history was re-sent. */
  resent_history_tokens?: number;
  /** Edge answers: the device's timings; `grammar_ms` is the share of `decode_ms` spent on constrained decoding's masks. */
  edge?: {
    backend: "webgpu" | "cpu"; prefill_ms: number; decode_ms: number; grammar_ms: number; decode_tokens_per_s: number;
    /** The engine failed mid-answer and a fresh one went on from the text shown (the timings are its). */
    resumed?: { from: "webgpu" | "cpu"; to: "cpu"; after_tokens: number; after_chars: number; error: StraddleErrorCode };
  };
  /** Speculative answers: what drafting and verification did. */
  speculative?: {
    verify_calls: number; drafted: number; accepted: number; acceptance: number;
    /** Tokens the edge wrote alone after a verify call failed (see `degraded`). */
    edge_alone_tokens: number;
    /** Times the cloud had lost the session and the prefix was sent again. */
    session_restarts: number;
    /** Tokens shown when drafts kept being rejected and the cloud streamed the rest (else null). */
    handed_off_after_tokens: number | null;
  };
}

export interface ChatCompletion {
  id: string;
  object: "chat.completion";
  created: number;
  model: string;
  choices: [{ index: 0; message: { role: "assistant"; content: string | null; tool_calls?: ToolCall[] }; finish_reason: FinishReason }];
  usage: Usage;
  straddle: StraddleMeta;
}

export interface ChatCompletionChunk {
  id: string;
  object: "chat.completion.chunk";
  created: number;
  model: string;
  choices: [{ index: 0; delta: { role?: "assistant"; content?: string | null; tool_calls?: ToolCallDelta[] }; finish_reason: FinishReason | null }];
  /** On the final chunk. */
  usage?: Usage;
  /** On the final chunk. */
  straddle?: StraddleMeta;
}

export interface RouteDecision {
  target: "edge" | "cloud" | "speculative";
  reasons: string[];
  pii: string[];
  estimated_latency_ms: number;
  estimated_cost_usd: number;
  cascade: { window: number; min_mean_logprob: number; max_mean_entropy: number; detect_refusals: boolean } | null;
  /** The quality model's estimate and what the first-token check needs; null when the task priors decided. */
  quality: { model_version: string; estimate: { p_edge_ok: number; edge_signals: boolean; drivers: [string, number][] }; edge_signals: boolean; bar: number; text_features: number[] } | null;
  trace: { signals: { name: string; value: unknown }[]; rule: string | null; scores: [string, number][]; policy_version: string };
}

export interface RouteStats {
  requests: number;
  completion_tokens: number;
  cost_usd: number;
  latency_ms: { mean: number; p50: number; max: number };
}

export interface SessionStats {
  requests: number;
  cost_usd: number;
  routes: Partial<Record<"edge" | "cloud" | "speculative", RouteStats>>;
  degraded: number;
  escalated_mid_stream: number;
  redacted: number;
  /** Feedback kept in this browser (all sessions), per route. */
  feedback: Partial<Record<"edge" | "cloud", { count: number; mean_reward: number }>>;
}

export interface DeviceReport {
  backend: "webgpu" | "cpu" | null;
  model?: string | null;
  sha256?: string;
  bytes?: number;
  /** Every byte came from the store: nothing was downloaded. */
  fromCache?: boolean;
  /** A download cut short earlier was resumed: the bytes that came from the store. */
  resumedFrom?: number | null;
  loadMs?: number;
  tokensPerS?: number;
  gpuError?: string | null;
  /** Threads the CPU backend runs on (1 on WebGPU, or without cross-origin isolation). */
  threads?: number;
  /**
   * Why the CPU backend runs on one thread where more were asked for (or "auto" on a
   * multi-core machine): the page is not cross-origin isolated, or the threaded build failed.
   */
  threadsError?: string | null;
  /** Tokens of conversation the engine holds: the option, or less where memory is short. */
  contextTokens?: number;
  /** What the model's header said it needs at that context, in bytes (null if its size was unknown). */
  memory?: MemoryNeed | null;
  webgpu?: boolean;
  software?: boolean;
  maxStorageBufferBytes?: number;
  maxInvocationsPerWorkgroup?: number;
  error?: string | null;
}

/** What a model needs in memory, read from its header before any download, in bytes. */
export interface MemoryNeed {
  /** The file, held while the weights are laid out from it. */
  file: number;
  /** The weights as the engine keeps them. */
  weights: number;
  kvCache: number;
  /** One pass over the whole context. */
  scratch: number;
  /** The largest single GPU buffer. */
  largestBuffer: number;
  total: number;
}

/** A model kept in this site's storage (OPFS, or the Cache API where a browser has none). */
export interface StoredModel {
  id: string;
  url: string;
  /** Bytes kept; less than `total` for a download that was cut short (it resumes from here). */
  bytes: number;
  total: number;
  complete: boolean;
  /** The file's SHA-256 once a load has hashed it whole (later loads then skip hashing). */
  sha256: string | null;
}

export class Straddle {
  static create(options: StraddleOptions): Promise<Straddle>;
  /** The models this site keeps: list them, and delete one by id (`model_not_found` if none). */
  static readonly models: {
    list(): Promise<StoredModel[]>;
    delete(id: string): Promise<void>;
  };
  /** Resolves when the model has loaded (or failed to, with the cloud to answer). */
  readonly ready: Promise<void>;
  readonly session: string;
  readonly chat: {
    completions: {
      create(req: ChatRequest & { stream: true }): Promise<AsyncIterable<ChatCompletionChunk>>;
      create(req: ChatRequest & { stream?: false }): Promise<ChatCompletion>;
    };
  };
  /** Where a request would run, and why, without running it. */
  route(req: ChatRequest): RouteDecision;
  /** How good an answer was, 0–1; kept in IndexedDB, and learned from with `learn: true`. */
  feedback(id: string, reward: number): Promise<void>;
  stats(): Promise<SessionStats>;
  device(): DeviceReport;
  /** Switches the routing policy for the requests that follow. */
  setPolicy(policy: PolicyPreset | PolicyOverrides): void | Promise<void>;
  /** Treat the network as down (never use the cloud) until set back. */
  setOffline(offline: boolean): void;
  unload(): Promise<void>;
}

export default Straddle;
