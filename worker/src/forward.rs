//! Reaching the upstreams: which are configured, the body each one gets (the caller's model
//! under the upstream's own name, without Straddle's envelope), its API key, and failover.
//!
//! Upstreams are tried in `upstreams::order`; a connect error, a 5xx, a 429 or a first-byte
//! timeout moves on to the next — always before a byte has reached the client.

use std::borrow::Cow;

use straddle_protocol::{ApiError, ErrorKind, LoadReport};
use worker::{
    AbortController, Delay, Env, Fetch, Headers, Method, Request, RequestInit, Response, Result,
};

use crate::clock::now_ms;
use crate::error::error_response;
use crate::health;
use crate::upstreams::{self, Upstream};

/// USD per 1,000 tokens from a var, 0 when unset.
fn price(env: &Env, name: &str) -> f64 {
    env.var(name)
        .ok()
        .and_then(|v| v.to_string().parse().ok())
        .filter(|p: &f64| p.is_finite() && *p >= 0.0)
        .unwrap_or(0.0)
}

/// The configured upstreams. A single `UPSTREAM_URL` serves `/v1/verify` when
/// `UPSTREAM_SUPPORTS_VERIFY` is `true` (Straddle's cloud server does).
pub(crate) fn upstream_list(env: &Env) -> std::result::Result<Vec<Upstream>, String> {
    let var = |name: &str| env.var(name).map(|v| v.to_string()).ok();
    let mut list = upstreams::configured(
        var("UPSTREAMS").as_deref(),
        var("UPSTREAM_URL").as_deref(),
        price(env, "PRICE_IN_PER_1K"),
        price(env, "PRICE_OUT_PER_1K"),
    )?;
    if var("UPSTREAMS").is_none_or(|u| u.trim().is_empty())
        && var("UPSTREAM_SUPPORTS_VERIFY").as_deref() == Some("true")
    {
        for u in &mut list {
            u.supports_verify = true;
        }
    }
    Ok(list)
}

/// What to answer for an upstream's non-200: its own 4xx (a request it refused) is the
/// caller's to see; its 5xx and 429 are ours to report as a bad gateway.
pub(crate) async fn relay_failure(resp: Response) -> Result<Response> {
    let status = resp.status_code();
    if (400..500).contains(&status) && status != 429 {
        return passthrough(resp).await;
    }
    error_response(&ApiError::new(
        ErrorKind::UpstreamError,
        format!("upstream answered {status}"),
    ))
}

/// An upstream's answer re-made as the worker's own: a fetched response's headers are
/// immutable, and CORS must still be added to it.
async fn passthrough(mut resp: Response) -> Result<Response> {
    let status = resp.status_code();
    let content_type = resp.headers().get("content-type")?;
    let mut out = Response::from_bytes(resp.bytes().await?)?.with_status(status);
    if let Some(ct) = content_type {
        out.headers_mut().set("content-type", &ct)?;
    }
    Ok(out)
}

/// The error for an answer `up` did not finish within its total timeout.
pub(crate) fn total_timeout(up: &Upstream) -> ApiError {
    ApiError::new(
        ErrorKind::UpstreamTimeout,
        format!(
            "{} did not finish its answer within {} ms",
            up.name, up.total_timeout_ms
        ),
    )
}

/// A whole (not streamed) answer's text, or `None` when it is not complete by `up`'s total
/// timeout counted from `started_ms`.
pub(crate) async fn text_within(
    resp: &mut Response,
    up: &Upstream,
    started_ms: i64,
) -> Result<Option<String>> {
    let reading = Box::pin(resp.text());
    let timer = Box::pin(Delay::from(remaining(up, started_ms)));
    match futures_util::future::select(reading, timer).await {
        futures_util::future::Either::Left((text, _)) => text.map(Some),
        futures_util::future::Either::Right(_) => Ok(None),
    }
}

/// What is left of `up`'s total timeout for a request that started at `started_ms`.
pub(crate) fn remaining(up: &Upstream, started_ms: i64) -> std::time::Duration {
    let spent = u64::try_from(now_ms() - started_ms).unwrap_or(0);
    std::time::Duration::from_millis(up.total_timeout_ms.saturating_sub(spent))
}

/// Why no upstream answered.
pub(crate) struct Failure {
    attempts: Vec<String>,
    all_timed_out: bool,
}

impl Failure {
    pub(crate) fn outcome(&self) -> &'static str {
        if self.all_timed_out {
            "upstream_timeout"
        } else {
            "upstream_failed"
        }
    }

    pub(crate) fn into_api_error(self) -> ApiError {
        let kind = if self.all_timed_out {
            ErrorKind::UpstreamTimeout
        } else {
            ErrorKind::UpstreamError
        };
        let tried = if self.attempts.is_empty() {
            "every upstream's circuit breaker is open".to_owned()
        } else {
            self.attempts.join("; ")
        };
        ApiError::new(kind, format!("no upstream answered: {tried}"))
    }
}

/// An upstream that answered with headers that are not a 5xx or 429.
pub(crate) struct Answered {
    pub upstream: Upstream,
    pub response: Response,
    /// An earlier choice failed first: the cost record says `degraded`.
    pub failed_over: bool,
}

/// What goes to each upstream.
pub(crate) struct Outgoing<'a> {
    pub path: &'a str,
    /// The caller's body as it came.
    pub body: &'a [u8],
    /// The caller's model; an upstream that knows it by another name gets that name.
    pub model: &'a str,
    /// Drops Straddle's `straddle` envelope: third-party servers refuse unknown fields.
    pub strip_envelope: bool,
    /// Requests with the same key (a verify session) try the upstreams in the same order, so
    /// they reach the one that holds their state while it is healthy.
    pub affinity: Option<&'a str>,
}

impl Outgoing<'_> {
    /// The body for `up`: the caller's bytes unchanged unless a rename or the envelope
    /// requires rewriting them.
    fn body_for(&self, up: &Upstream) -> Cow<'_, [u8]> {
        let rename = up.renamed(self.model);
        if rename.is_none() && !self.strip_envelope {
            return Cow::Borrowed(self.body);
        }
        let Ok(serde_json::Value::Object(mut fields)) = serde_json::from_slice(self.body) else {
            return Cow::Borrowed(self.body);
        };
        let stripped = self.strip_envelope && fields.remove("straddle").is_some();
        if !stripped && rename.is_none() {
            return Cow::Borrowed(self.body);
        }
        if let Some(name) = rename {
            fields.insert("model".into(), name.into());
        }
        serde_json::to_vec(&fields).map_or(Cow::Borrowed(self.body), Cow::Owned)
    }
}

/// Tries the upstreams in order until one answers.
pub(crate) async fn forward(
    env: &Env,
    list: &[Upstream],
    out: &Outgoing<'_>,
) -> std::result::Result<Answered, Failure> {
    let mut failure = Failure {
        attempts: Vec::new(),
        all_timed_out: true,
    };
    let order = match out.affinity {
        Some(key) => upstreams::order(list, upstreams::keyed_random(key)),
        None => upstreams::order(list, js_sys::Math::random),
    };
    for i in order {
        let up = &list[i];
        let admitted = health::admit(env, up).await;
        if !admitted.allowed {
            continue;
        }
        let problem = match send(env, up, &out.body_for(up), out.path).await {
            Ok(resp) if resp.status_code() >= 500 || resp.status_code() == 429 => {
                failure.all_timed_out = false;
                format!("{} answered {}", up.name, resp.status_code())
            }
            Ok(response) => {
                health::report(env, up, admitted, true).await;
                return Ok(Answered {
                    upstream: up.clone(),
                    response,
                    failed_over: !failure.attempts.is_empty(),
                });
            }
            Err(Sent::TimedOut) => format!(
                "{} sent no headers within {} ms",
                up.name, up.first_byte_timeout_ms
            ),
            Err(Sent::Error(e)) => {
                failure.all_timed_out = false;
                format!("{} unreachable ({e})", up.name)
            }
        };
        health::report(env, up, admitted, false).await;
        failure.attempts.push(problem);
    }
    if failure.attempts.is_empty() {
        failure.all_timed_out = false;
    }
    Err(failure)
}

enum Sent {
    TimedOut,
    Error(String),
}

/// Adds `up`'s API key, when it has one, from its secret binding.
fn authorize(env: &Env, up: &Upstream, headers: &Headers) -> std::result::Result<(), String> {
    let Some(name) = &up.api_key_secret else {
        return Ok(());
    };
    let key = crate::auth::secret(env, name)
        .ok_or_else(|| format!("its API key secret {name} is not set"))?;
    headers
        .set("authorization", &format!("Bearer {key}"))
        .map_err(|e| e.to_string())
}

/// One attempt, abandoned (and aborted) when the headers take too long.
async fn send(
    env: &Env,
    up: &Upstream,
    body: &[u8],
    path: &str,
) -> std::result::Result<Response, Sent> {
    let build = || -> std::result::Result<Request, String> {
        let headers = Headers::new();
        headers
            .set("content-type", "application/json")
            .map_err(|e| e.to_string())?;
        authorize(env, up, &headers)?;
        let mut init = RequestInit::new();
        init.with_method(Method::Post)
            .with_headers(headers)
            .with_body(Some(js_sys::Uint8Array::from(body).into()));
        Request::new_with_init(&format!("{}{path}", up.url.trim_end_matches('/')), &init)
            .map_err(|e| e.to_string())
    };
    let request = build().map_err(Sent::Error)?;
    fetch_within(request, up.first_byte_timeout_ms).await
}

/// Sends `request`, abandoning (and aborting) it when no headers came within `timeout_ms`.
async fn fetch_within(request: Request, timeout_ms: u64) -> std::result::Result<Response, Sent> {
    let controller = AbortController::default();
    let signal = controller.signal();
    let fetch = Fetch::Request(request);
    let sending = Box::pin(fetch.send_with_signal(&signal));
    let timer = Box::pin(Delay::from(std::time::Duration::from_millis(timeout_ms)));
    match futures_util::future::select(sending, timer).await {
        futures_util::future::Either::Left((result, _)) => {
            result.map_err(|e| Sent::Error(e.to_string()))
        }
        futures_util::future::Either::Right(_) => {
            controller.abort();
            Err(Sent::TimedOut)
        }
    }
}

/// `GET /v1/models`: the models the upstreams serve (first the deployment's default,
/// `UPSTREAM_MODEL`, when an upstream takes any model), and for each whether it can verify
/// edge drafts: when an upstream that serves it supports `/v1/verify`, that upstream's own
/// `/v1/models` supplies the tokenizer hash a browser compares with its edge model's before
/// it speculates.
pub async fn models(env: &Env) -> Result<Response> {
    let default = env
        .var("UPSTREAM_MODEL")
        .map(|v| v.to_string())
        .unwrap_or_else(|_| "default".into());
    let list = upstream_list(env).unwrap_or_default();
    let mut ids: Vec<String> = Vec::new();
    if list.iter().any(|u| u.models.is_empty()) {
        ids.push(default);
    }
    for up in &list {
        for name in up.models.keys() {
            if !ids.contains(name) {
                ids.push(name.clone());
            }
        }
    }
    let mut hashes: Vec<(String, Option<String>)> = Vec::new();
    let mut data = Vec::new();
    for id in ids {
        let verifier = list.iter().find(|u| u.supports_verify && u.serves(&id));
        let mut tokenizer_hash = None;
        if let Some(up) = verifier {
            if let Some((_, known)) = hashes.iter().find(|(name, _)| *name == up.name) {
                tokenizer_hash = known.clone();
            } else {
                match get_json::<straddle_protocol::ModelList>(env, up, "/v1/models").await {
                    Ok(models) => {
                        tokenizer_hash = models.data.into_iter().find_map(|m| m.tokenizer_hash)
                    }
                    Err(e) => {
                        worker::console_warn!("verify upstream {} has no model list: {e}", up.name)
                    }
                }
                hashes.push((up.name.clone(), tokenizer_hash.clone()));
            }
        }
        data.push(serde_json::json!({
            "id": id, "object": "model", "owned_by": "straddle",
            // Speculation needs both: a verifier, and its tokenizer to compare.
            "supports_verify": verifier.is_some() && tokenizer_hash.is_some(),
            "tokenizer_hash": tokenizer_hash,
        }));
    }
    Response::from_json(&serde_json::json!({"object": "list", "data": data}))
}

/// `GET /v1/load`: how loaded the upstreams that would answer next are (the first priority
/// tier), summed over those that report it (`straddle-cloud` does; vLLM and llama.cpp's
/// server do not, and the page then falls back on its measured time to first token).
/// `204` when none reports.
pub async fn load(env: &Env) -> Result<Response> {
    let list = upstream_list(env).unwrap_or_default();
    let Some(first) = list.iter().map(|u| u.priority).min() else {
        return Response::empty().map(|r| r.with_status(204));
    };
    let mut total: Option<LoadReport> = None;
    for up in list.iter().filter(|u| u.priority == first) {
        match get_json::<LoadReport>(env, up, "/v1/load").await {
            Ok(load) => total = Some(total.map_or(load, |t| t.plus(load))),
            Err(e) => worker::console_log!("upstream {} reports no load: {e}", up.name),
        }
    }
    match total {
        Some(load) => Response::from_json(&load),
        None => Response::empty().map(|r| r.with_status(204)),
    }
}

/// GETs `path` from `up` as JSON, within the upstream's first-byte timeout.
async fn get_json<T: serde::de::DeserializeOwned>(
    env: &Env,
    up: &Upstream,
    path: &str,
) -> std::result::Result<T, String> {
    let url = format!("{}{path}", up.url.trim_end_matches('/'));
    let request = Request::new(&url, Method::Get).map_err(|e| e.to_string())?;
    authorize(env, up, request.headers())?;
    let mut resp = match fetch_within(request, up.first_byte_timeout_ms).await {
        Ok(resp) => resp,
        Err(Sent::Error(e)) => return Err(e),
        Err(Sent::TimedOut) => {
            return Err(format!("no answer within {} ms", up.first_byte_timeout_ms));
        }
    };
    if resp.status_code() != 200 {
        return Err(format!("answered {}", resp.status_code()));
    }
    resp.json::<T>().await.map_err(|e| e.to_string())
}
