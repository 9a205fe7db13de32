//! Continuous batching: one thread owns the decode loop; sequences join between steps and
//! leave when finished or when their client goes away. Each step samples every sequence that
//! has logits, then runs one batched forward pass: the decoding sequences' next tokens plus
//! a chunk of the new requests' prompts (chunked prefill), so a new request neither waits
//! for the running ones to finish nor stalls them for its whole prompt.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, TryRecvError, TrySendError};
use std::time::Instant;

use straddle_chat::Conversation;
use straddle_engine::{
    Constraint, Finish, GenerateParams, GrammarError, ModelCache, OutputFormat, Sequence,
};
use straddle_protocol::{ApiError, ErrorKind, LoadReport};
use tokio::sync::mpsc::UnboundedSender;

use crate::backend::{Served, ServedModel};

/// What a request's stream receives.
#[derive(Debug)]
pub enum SeqEvent {
    Token(String),
    Done {
        text: String,
        finish: Finish,
        prompt_tokens: u32,
        completion_tokens: u32,
    },
    Error(ApiError),
}

/// A request waiting for a slot.
pub struct Job {
    pub conversation: Conversation,
    pub params: GenerateParams,
    pub events: UnboundedSender<SeqEvent>,
}

/// Counters exported at `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub rejected: AtomicU64,
    pub tokens: AtomicU64,
    pub queue_depth: AtomicU64,
    pub active: AtomicU64,
    pub batch_size_max: AtomicU64,
    pub steps: AtomicU64,
    pub batched_tokens: AtomicU64,
    pub ttft_ms_sum: AtomicU64,
    pub decode_ns: AtomicU64,
    pub prefill_tokens: AtomicU64,
    pub prefix_reused_tokens: AtomicU64,
}

impl Metrics {
    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let decode_s = g(&self.decode_ns) as f64 / 1e9;
        let tps = if decode_s > 0.0 {
            g(&self.batched_tokens) as f64 / decode_s
        } else {
            0.0
        };
        let mean_batch = if g(&self.steps) > 0 {
            g(&self.batched_tokens) as f64 / g(&self.steps) as f64
        } else {
            0.0
        };
        format!(
            "# TYPE straddle_requests_total counter\nstraddle_requests_total {}\n\
             # TYPE straddle_rejected_total counter\nstraddle_rejected_total {}\n\
             # TYPE straddle_generated_tokens_total counter\nstraddle_generated_tokens_total {}\n\
             # TYPE straddle_queue_depth gauge\nstraddle_queue_depth {}\n\
             # TYPE straddle_active_sequences gauge\nstraddle_active_sequences {}\n\
             # TYPE straddle_batch_size_max gauge\nstraddle_batch_size_max {}\n\
             # TYPE straddle_batch_size_mean gauge\nstraddle_batch_size_mean {mean_batch:.3}\n\
             # TYPE straddle_time_to_first_token_ms_sum counter\nstraddle_time_to_first_token_ms_sum {}\n\
             # TYPE straddle_prefill_tokens_total counter\nstraddle_prefill_tokens_total {}\n\
             # TYPE straddle_prefix_reused_tokens_total counter\nstraddle_prefix_reused_tokens_total {}\n\
             # TYPE straddle_decode_tokens_per_second gauge\nstraddle_decode_tokens_per_second {tps:.2}\n",
            g(&self.requests),
            g(&self.rejected),
            g(&self.tokens),
            g(&self.queue_depth),
            g(&self.active),
            g(&self.batch_size_max),
            g(&self.ttft_ms_sum),
            g(&self.prefill_tokens),
            g(&self.prefix_reused_tokens),
        )
    }
}

/// Compiles an answer's output format for the served model's vocabulary.
type Constrain = dyn Fn(&OutputFormat) -> Result<Constraint, GrammarError> + Send + Sync;

/// Handle to the decode thread.
#[derive(Clone)]
pub struct Scheduler {
    tx: mpsc::SyncSender<(Job, Instant)>,
    pub metrics: Arc<Metrics>,
    constrain: Arc<Constrain>,
    /// Sequences decoded at once.
    slots: usize,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("metrics", &self.metrics)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// Starts the decode thread with a queue of `queue` waiting requests, at most `max_batch`
    /// sequences in a step and at most `prefill_chunk` prompt tokens prefilled per step.
    pub fn spawn<M: ServedModel>(
        engine: Arc<Served<M>>,
        queue: usize,
        max_batch: usize,
        prefill_chunk: usize,
    ) -> Self {
        let (tx, rx) = mpsc::sync_channel::<(Job, Instant)>(queue);
        let metrics = Arc::new(Metrics::default());
        let m = metrics.clone();
        let served = engine.clone();
        let constrain = Arc::new(move |f: &OutputFormat| served.engine.constrain(f));
        std::thread::Builder::new()
            .name("straddle-decode".into())
            .spawn(move || decode_loop(&*engine, &rx, &m, max_batch.max(1), prefill_chunk.max(1)))
            .map(drop)
            .unwrap_or_else(|e| tracing::error!(error = %e, "could not start the decode thread"));
        Self {
            tx,
            metrics,
            constrain,
            slots: max_batch.max(1),
        }
    }

    /// The load now: what waits, what runs, and the decode rate per sequence so far.
    pub fn load(&self) -> LoadReport {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let decode_s = g(&self.metrics.decode_ns) as f64 / 1e9;
        // Each step decodes one token of every live sequence: steps a second is the rate one
        // sequence sees.
        let tokens_per_s =
            (decode_s > 0.0).then(|| (g(&self.metrics.steps) as f64 / decode_s) as f32);
        LoadReport {
            queued: u32::try_from(g(&self.metrics.queue_depth)).unwrap_or(u32::MAX),
            active: u32::try_from(g(&self.metrics.active)).unwrap_or(u32::MAX),
            slots: u32::try_from(self.slots).unwrap_or(u32::MAX),
            tokens_per_s,
        }
    }

    /// The grammar state for an answer in `format`: compiled here, in the handler, so an
    /// invalid schema is a 400 before a stream starts.
    pub fn constrain(&self, format: &OutputFormat) -> Result<Constraint, GrammarError> {
        (self.constrain)(format)
    }

    /// Queues a request; a full queue is a 503 the client may retry.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.metrics.requests.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send((job, Instant::now())) {
            Ok(()) => {
                self.metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(TrySendError::Full(_)) => {
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                Err(ApiError::new(
                    ErrorKind::Unavailable,
                    "server busy: queue full, retry shortly",
                )
                .with_code("queue_full"))
            }
            Err(TrySendError::Disconnected(_)) => {
                Err(ApiError::new(ErrorKind::Unavailable, "decode loop stopped"))
            }
        }
    }
}

struct Live<C> {
    seq: Sequence<C>,
    events: UnboundedSender<SeqEvent>,
    queued_at: Instant,
    first_token: bool,
    /// Its prompt's keys and values were offered to later prompts.
    prefix_offered: bool,
}

fn decode_loop<M: ServedModel>(
    engine: &Served<M>,
    rx: &mpsc::Receiver<(Job, Instant)>,
    m: &Metrics,
    max_batch: usize,
    prefill_chunk: usize,
) {
    let mut live: Vec<Live<M::Cache>> = Vec::new();
    while admit_waiting(engine, rx, &mut live, m, max_batch) {
        let step_started = Instant::now();
        sample_all(engine, &mut live, m);
        step_all(engine, &mut live, m, prefill_chunk, step_started);
        retire_finished(&mut live);
        m.active.store(live.len() as u64, Ordering::Relaxed);
    }
}

/// Admits what waits, up to the batch limit, blocking when nothing is live. `false` once
/// the queue is closed and nothing is live: the loop ends.
fn admit_waiting<M: ServedModel>(
    engine: &Served<M>,
    rx: &mpsc::Receiver<(Job, Instant)>,
    live: &mut Vec<Live<M::Cache>>,
    m: &Metrics,
    max_batch: usize,
) -> bool {
    if live.is_empty() {
        match rx.recv() {
            Ok(job) => admit(engine, job, live, m),
            Err(_) => return false,
        }
    }
    while live.len() < max_batch {
        match rx.try_recv() {
            Ok(job) => admit(engine, job, live, m),
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) if live.is_empty() => return false,
            Err(TryRecvError::Disconnected) => break,
        }
    }
    true
}

/// Samples every live sequence's next token and streams its text; a sequence whose client
/// went away is cancelled.
fn sample_all<M: ServedModel>(engine: &Served<M>, live: &mut [Live<M::Cache>], m: &Metrics) {
    for l in live.iter_mut() {
        if l.events.is_closed() {
            l.seq.cancel();
            continue;
        }
        match engine.next_token(&mut l.seq) {
            Ok(Some(ev)) => {
                m.tokens.fetch_add(1, Ordering::Relaxed);
                if l.first_token {
                    l.first_token = false;
                    m.ttft_ms_sum
                        .fetch_add(l.queued_at.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                if !ev.text.is_empty() && l.events.send(SeqEvent::Token(ev.text)).is_err() {
                    l.seq.cancel();
                }
            }
            Ok(None) => {}
            Err(e) => {
                let _ = l.events.send(SeqEvent::Error(ApiError::new(
                    ErrorKind::Internal,
                    e.to_string(),
                )));
                l.seq.cancel();
            }
        }
    }
}

/// One batched forward pass over every live sequence (chunked prefill included), then the
/// prompts now in their caches are offered for reuse and the step's metrics recorded.
fn step_all<M: ServedModel>(
    engine: &Served<M>,
    live: &mut [Live<M::Cache>],
    m: &Metrics,
    prefill_chunk: usize,
    step_started: Instant,
) {
    let batch = live
        .iter()
        .filter(|l| !l.seq.is_finished() && l.seq.prompt_unfed() == 0)
        .count() as u64;
    let unfed_before: usize = live.iter().map(|l| l.seq.prompt_unfed()).sum();
    let mut refs: Vec<&mut Sequence<M::Cache>> = live.iter_mut().map(|l| &mut l.seq).collect();
    if let Err(e) = engine.step(&mut refs, prefill_chunk) {
        for l in live.iter_mut() {
            let _ = l.events.send(SeqEvent::Error(ApiError::new(
                ErrorKind::Internal,
                e.to_string(),
            )));
            l.seq.cancel();
        }
    }
    let unfed_after: usize = live.iter().map(|l| l.seq.prompt_unfed()).sum();
    for l in live.iter_mut() {
        if !l.prefix_offered && l.seq.prompt_unfed() == 0 {
            l.prefix_offered = true;
            engine.offer_prefix(&l.seq);
        }
    }
    m.prefill_tokens.fetch_add(
        unfed_before.saturating_sub(unfed_after) as u64,
        Ordering::Relaxed,
    );
    if batch > 0 {
        m.steps.fetch_add(1, Ordering::Relaxed);
        m.batched_tokens.fetch_add(batch, Ordering::Relaxed);
        m.batch_size_max.fetch_max(batch, Ordering::Relaxed);
        m.decode_ns
            .fetch_add(step_started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// Retires finished sequences with their answer; their slots go to the next waiting
/// requests.
fn retire_finished<C: ModelCache>(live: &mut Vec<Live<C>>) {
    let mut i = 0;
    while i < live.len() {
        if live[i].seq.is_finished() {
            let l = live.swap_remove(i);
            let (prompt_tokens, completion_tokens) = l.seq.usage();
            let c = l.seq.into_completion();
            let _ = l.events.send(SeqEvent::Done {
                text: c.text,
                finish: c.finish,
                prompt_tokens: prompt_tokens as u32,
                completion_tokens: completion_tokens as u32,
            });
        } else {
            i += 1;
        }
    }
}

fn admit<M: ServedModel>(
    engine: &Served<M>,
    (job, queued_at): (Job, Instant),
    live: &mut Vec<Live<M::Cache>>,
    m: &Metrics,
) {
    m.queue_depth.fetch_sub(1, Ordering::Relaxed);
    if job.events.is_closed() {
        return;
    }
    // Only tokenized here: the prompt is prefilled by the next steps, batched.
    match engine.queue(job.conversation.prompt(), &job.params) {
        Ok(seq) => {
            m.prefix_reused_tokens
                .fetch_add(seq.prompt_reused() as u64, Ordering::Relaxed);
            live.push(Live {
                seq,
                events: job.events,
                queued_at,
                first_token: true,
                prefix_offered: false,
            });
        }
        Err(e) => {
            let _ = job
                .events
                .send(SeqEvent::Error(crate::error::engine_error(e)));
        }
    }
    m.active.store(live.len() as u64, Ordering::Relaxed);
}
