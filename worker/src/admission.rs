//! What every spending route does before it forwards: read the body within its limit, find
//! the caller's tenant (token, record, origin), check what the tenant allows (model, private
//! data), hold the worst case in the tenant's budget — and afterwards settle it.

use straddle_protocol::token::Claims;
use straddle_protocol::{ApiError, ErrorKind, Message, StraddleEnvelope, Tool};
use straddle_router::price::Price;
use worker::{Env, Request, Stub};

use crate::budget::{self, BudgetCall, Hold, HoldAnswer, Record};
use crate::clock::now_ms;
use crate::error::Refusal;
use crate::forward::Answered;
use crate::tenant::{Tenant, deployment_origins};
use crate::upstreams::Upstream;

/// Largest request body accepted.
const MAX_BODY: usize = 1 << 20;
/// An unsettled hold (of a worker that died mid-request) is reclaimed this long after its
/// upstreams' longest total timeout, unless the deployment's `HOLD_TTL_MS` says otherwise.
const HOLD_MARGIN_MS: i64 = 60_000;

/// The longest a growing-hold request waits for holds in flight to settle, and how often it
/// asks again meanwhile.
const WAIT_FOR_HOLDS_MS: i64 = 10_000;
const WAIT_STEP_MS: u64 = 100;

/// A caller let in: whose token it is, its tenant's record and budget.
pub(crate) struct Caller {
    pub claims: Claims,
    pub tenant: Tenant,
    pub stub: Stub,
}

/// The request's caller, or the response refusing it: a bad token or one that lives longer
/// than its tenant allows (401), or a page origin its tenant does not allow (403).
pub(crate) async fn caller(req: &Request, env: &Env) -> std::result::Result<Caller, Refusal> {
    let claims = crate::auth::tenant(req, env)?;
    let stub = budget::stub(env, &claims.ten)?;
    let tenant: Tenant = budget::call(&stub, &BudgetCall::Tenant).await?;
    crate::auth::lifetime(&claims, tenant.max_token_lifetime_s())?;
    // Requests without an `Origin` come from servers, not pages: the token alone decides.
    if let Some(origin) = req.headers().get("origin")? {
        let deployment = deployment_origins(
            env.var("ALLOWED_ORIGINS")
                .ok()
                .map(|v| v.to_string())
                .as_deref(),
        );
        if !tenant.allows_origin(&origin, &deployment) {
            let e = ApiError::new(
                ErrorKind::Forbidden,
                format!("this tenant does not allow pages at {origin}"),
            );
            return Err(e.with_code("origin_not_allowed").into());
        }
    }
    Ok(Caller {
        claims,
        tenant,
        stub,
    })
}

impl Caller {
    /// Refuses too many messages (400), a model the tenant does not allow (403) and data its
    /// policy keeps on the device (451).
    pub(crate) fn permits(
        &self,
        model: &str,
        messages: &[Message],
    ) -> std::result::Result<(), ApiError> {
        let most = self.tenant.max_messages();
        if messages.len() > most {
            return Err(ApiError::invalid(
                "messages",
                format!("this tenant allows at most {most} messages a request"),
            ));
        }
        if !self.tenant.allows_model(model) {
            return Err(ApiError::new(
                ErrorKind::Forbidden,
                format!("this tenant does not allow the model {model:?}"),
            )
            .with_code("model_not_allowed"));
        }
        match crate::privacy::recheck(messages, self.tenant.keep_on_device_at()) {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }

    /// Holds `tokens_in` and `tokens_out` (a request's worst case, or a growing hold's first
    /// chunk) in the tenant's budget, priced at the dearest upstream the request might end up
    /// on: the hold, or the refusal to send.
    pub(crate) async fn hold(
        &self,
        env: &Env,
        list: &[Upstream],
        tokens_in: i64,
        tokens_out: i64,
    ) -> std::result::Result<Hold, Refusal> {
        let prices = dearest_prices(list);
        // A hold outlives its request, whose stream is cut at its upstream's total timeout;
        // a deployment's `HOLD_TTL_MS` overrides (tests use a short one).
        let longest = list.iter().map(|u| u.total_timeout_ms).max().unwrap_or(0);
        let ttl = env
            .var("HOLD_TTL_MS")
            .ok()
            .and_then(|v| v.to_string().parse().ok())
            .filter(|t: &i64| *t > 0)
            .unwrap_or_else(|| i64::try_from(longest).unwrap_or(i64::MAX / 2) + HOLD_MARGIN_MS);
        let started = now_ms();
        let mut hold = Hold {
            id: format!(
                "{started}-{:016x}",
                (js_sys::Math::random() * 2f64.powi(53)) as u64
            ),
            usd: cost_usd(prices, tokens_in, tokens_out),
            tokens: tokens_in + tokens_out,
            expires_ms: started + ttl,
            now_ms: started,
            user: self.claims.sub.clone(),
            feature: self.claims.feat.clone().unwrap_or_default(),
        };
        let mut answer: HoldAnswer =
            budget::call(&self.stub, &BudgetCall::Hold(hold.clone())).await?;
        // A growing hold is small, and the holds in its way are mostly answers about to
        // settle for less than they hold: it waits for them rather than refuse.
        while !answer.admitted
            && answer.holds_in_flight_block
            && self.tenant.growing_holds()
            && now_ms() - started < WAIT_FOR_HOLDS_MS
        {
            worker::Delay::from(std::time::Duration::from_millis(WAIT_STEP_MS)).await;
            hold.now_ms = now_ms();
            answer = budget::call(&self.stub, &BudgetCall::Hold(hold.clone())).await?;
        }
        if !answer.admitted {
            return Err(refused(&answer));
        }
        Ok(hold)
    }
}

/// The highest input and output prices per 1,000 tokens among `list`: a request is held at
/// the dearest upstream it might end up on.
pub(crate) fn dearest_prices(list: &[Upstream]) -> Price {
    Price {
        in_per_1k: list.iter().map(|u| u.price_in_per_1k).fold(0.0, f64::max),
        out_per_1k: list.iter().map(|u| u.price_out_per_1k).fold(0.0, f64::max),
    }
}

/// What `tokens_in` and `tokens_out` cost at `prices`.
pub(crate) fn cost_usd(prices: Price, tokens_in: i64, tokens_out: i64) -> f64 {
    prices.cost(tokens_in as f64, tokens_out as f64)
}

/// What a request is billed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Billed {
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub usd: f64,
    /// Used but past the hold, and so not billed.
    pub unbilled_tokens: i64,
}

/// What was `used` (prompt, completion tokens) at the answering upstream's `prices`, but
/// never more than was `held` at `held_prices`, in tokens or in money, so no settlement can
/// overshoot a limit: the worker's prompt bound cannot see the tokens an upstream's chat
/// template adds, and a growing hold holds output only as far as it streamed.
pub(crate) fn within_hold(
    used: (i64, i64),
    held: (i64, i64),
    prices: Price,
    held_prices: Price,
) -> Billed {
    let tokens_out = used.1.min(held.1);
    let tokens_in = used.0.min(held.0 + held.1 - tokens_out);
    let usd = cost_usd(prices, tokens_in, tokens_out);
    Billed {
        tokens_in,
        tokens_out,
        usd: usd.min(cost_usd(held_prices, held.0, held.1)),
        unbilled_tokens: used.0 + used.1 - tokens_in - tokens_out,
    }
}

/// Replaces the hold with what was spent and writes the record.
/// One request's hold and what settling it needs: the hold's size and prices (no bill
/// passes them) and the request's record.
pub(crate) struct Bill {
    pub stub: Stub,
    pub hold: Hold,
    /// (prompt, completion) tokens held; a growing hold's completion part grows.
    pub held: (i64, i64),
    pub held_prices: Price,
    pub started: i64,
    pub template: Record,
}

impl Bill {
    /// The record of `tokens_in` and `tokens_out` used at the answering upstream (`None`:
    /// none answered).
    pub(crate) fn record(
        &self,
        answered: Option<&Answered>,
        outcome: &str,
        tokens_in: i64,
        tokens_out: i64,
        ttfb_ms: i64,
    ) -> Record {
        let (upstream, prices, degraded) = match answered {
            Some(a) => (a.upstream.name.clone(), a.upstream.price(), a.failed_over),
            None => ("none".to_string(), Price::default(), false),
        };
        Record {
            upstream,
            degraded,
            tokens_in,
            tokens_out,
            usd: cost_usd(prices, tokens_in, tokens_out),
            ttfb_ms,
            total_ms: now_ms() - self.started,
            outcome: outcome.into(),
            ..self.template.clone()
        }
    }

    /// `r` billed for `used` (prompt, completion) tokens at `prices`, never past what was
    /// held (`held_out` completion tokens).
    pub(crate) fn billed(
        &self,
        r: Record,
        used: (i64, i64),
        prices: Price,
        held_out: i64,
    ) -> Record {
        let billed = within_hold(used, (self.held.0, held_out), prices, self.held_prices);
        billed_record(r, billed)
    }

    /// Settles the hold with `r`.
    pub(crate) async fn settle(&self, r: Record) {
        settle(&self.stub, &self.hold.id, r).await;
    }
}

/// `r` with what its request is billed.
fn billed_record(r: Record, billed: Billed) -> Record {
    Record {
        tokens_in: billed.tokens_in,
        tokens_out: billed.tokens_out,
        usd: billed.usd,
        unbilled_tokens: billed.unbilled_tokens,
        ..r
    }
}

/// Settles hold `hold_id` with `record` in the tenant's budget object.
pub(crate) async fn settle(stub: &Stub, hold_id: &str, record: Record) {
    let call = BudgetCall::Settle {
        hold_id: hold_id.to_owned(),
        record,
    };
    // One retry: the record must not be lost to a transient error.
    for _ in 0..2 {
        if budget::call::<serde_json::Value>(stub, &call).await.is_ok() {
            return;
        }
    }
}

/// A JSON body of at most `MAX_BODY` bytes: the raw bytes (forwarded unchanged) with the
/// parsed value, or the error response to send.
pub(crate) async fn json_body<T: serde::de::DeserializeOwned>(
    req: &mut Request,
) -> std::result::Result<(Vec<u8>, T), Refusal> {
    let body = req.bytes().await?;
    if body.len() > MAX_BODY {
        let e = ApiError::new(ErrorKind::TooLarge, format!("body over {MAX_BODY} bytes"));
        return Err(e.into());
    }
    match serde_json::from_slice(&body) {
        Ok(parsed) => Ok((body, parsed)),
        Err(e) => Err(ApiError::from_json_error(&e).into()),
    }
}

/// The refusal of a hold the budget object did not admit: 429 with a `retry-after` for
/// rates and concurrency, 402 with what is left for the budget.
fn refused(answer: &HoldAnswer) -> Refusal {
    let scope = match answer.scope.as_deref() {
        Some("user") => "this user's",
        Some("feature") => "this feature's",
        _ => "this tenant's",
    };
    match answer.refused_for.as_deref() {
        Some("rate") => Refusal::Client(
            ApiError::new(
                ErrorKind::RateLimited,
                format!("{scope} requests or tokens per minute are used up"),
            ),
            Some(answer.retry_after_s.unwrap_or(60)),
        ),
        Some("concurrency") => Refusal::Client(
            ApiError::new(
                ErrorKind::RateLimited,
                format!("too many of {scope} requests are in flight"),
            ),
            Some(1),
        ),
        _ => {
            let window = match answer.window.as_deref() {
                Some("month") => "monthly",
                _ => "daily",
            };
            let left = if window == "monthly" {
                "this month"
            } else {
                "today"
            };
            let remaining = format!(
                "remaining {left}: {} USD, {} tokens",
                answer
                    .remaining_usd
                    .map_or("unlimited".into(), |v| format!("{v:.6}")),
                answer
                    .remaining_tokens
                    .map_or("unlimited".into(), |v| v.to_string())
            );
            ApiError::new(
                ErrorKind::BudgetExceeded,
                format!("this request's worst case exceeds {scope} {window} budget; {remaining}"),
            )
            .into()
        }
    }
}

/// A conservative prompt size: two bytes a token (real tokenizers average three to four on
/// English, about one a character on Chinese — which is three bytes) plus framing per message,
/// and the tool definitions the template writes into the prompt. What an upstream's template
/// adds on its own (a default system turn) is not seen here: billing, capped at the hold so
/// that no limit is overshot, records it as `unbilled_tokens`.
pub(crate) fn prompt_tokens_bound(messages: &[Message], tools: Option<&[Tool]>) -> i64 {
    let half = |bytes: usize| bytes.div_ceil(2) as i64;
    let messages: i64 = messages.iter().map(|m| half(m.content.len()) + 8).sum();
    let tools = tools.map_or(0, |t| serde_json::to_string(t).map_or(0, |j| half(j.len())));
    messages + tools
}

impl Record {
    /// This record with what the page's envelope claims: the router's reasons, the versions
    /// and the answer's id. The claims are for the tenant's usage report; none of the
    /// worker's own checks depend on them.
    pub(crate) fn claimed_by(self, envelope: Option<&StraddleEnvelope>) -> Record {
        let Some(e) = envelope else {
            return self;
        };
        let claim = |v: &Option<String>| v.clone().unwrap_or_default();
        Record {
            route_reason: if e.reasons.is_empty() {
                self.route_reason.clone()
            } else {
                e.reasons.join("; ")
            },
            router_version: claim(&e.router_version),
            policy_version: claim(&e.policy_version),
            quality_model_version: claim(&e.quality_model_version),
            edge_model_sha256: claim(&e.edge_model_sha256),
            answer_id: claim(&e.answer_id),
            escalated_mid_stream: e.escalated_mid_stream,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price(in_per_1k: f64, out_per_1k: f64) -> Price {
        Price {
            in_per_1k,
            out_per_1k,
        }
    }

    #[test]
    fn billing_never_passes_the_hold() {
        // Within the hold: what was used.
        let b = within_hold((20, 50), (26, 64), price(1.0, 2.0), price(1.0, 2.0));
        assert_eq!((b.tokens_in, b.tokens_out, b.unbilled_tokens), (20, 50, 0));
        assert!((b.usd - 0.12).abs() < 1e-12);
        // A prompt longer than its bound is covered by unused output hold first...
        let b = within_hold((40, 50), (26, 64), price(1.0, 1.0), price(1.0, 1.0));
        assert_eq!((b.tokens_in, b.tokens_out, b.unbilled_tokens), (40, 50, 0));
        // ...and past the whole hold it is not billed, in tokens or in money.
        let b = within_hold((40, 64), (26, 64), price(1.0, 1.0), price(0.5, 0.5));
        assert_eq!((b.tokens_in, b.tokens_out, b.unbilled_tokens), (26, 64, 14));
        assert!((b.usd - 0.045).abs() < 1e-12);
    }
}
