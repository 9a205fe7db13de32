//! `POST /v1/verify`: an edge-drafted continuation checked by an upstream that supports it
//! (speculative decoding), under the same tenant auth and budget as chat: the prefix and the
//! draft are billed as input tokens, the accepted tokens and the verifier's own as output.

use straddle_protocol::{ApiError, ErrorKind, VerifyRequest, VerifyResponse};
use worker::{Env, Request, Response, Result};

use crate::admission::{Bill, caller, dearest_prices, json_body, prompt_tokens_bound};
use crate::budget::Record;
use crate::clock::now_ms;
use crate::error::{Refusal, respond};
use crate::forward::{Outgoing, forward, relay_failure, text_within, total_timeout, upstream_list};
use crate::upstreams::Upstream;

/// Drafts longer than this are refused: adaptive drafting stays within 16.
const MAX_DRAFT: usize = 64;

/// What the request asks the verifier to read, as a token bound: the prefix's ids when given
/// (exact), else the messages' [`prompt_tokens_bound`], or on a continuing session call the
/// one pending token; plus the draft.
fn input_tokens_bound(req: &VerifyRequest) -> i64 {
    if req.continues_session() {
        return 1 + req.draft_tokens.len() as i64;
    }
    let prefix = match &req.prefix_tokens {
        Some(ids) => ids.len() as i64,
        None => prompt_tokens_bound(&req.messages, None),
    };
    prefix + req.draft_tokens.len() as i64
}

fn check(req: &VerifyRequest) -> std::result::Result<(), ApiError> {
    if req.draft_tokens.is_empty() || req.draft_tokens.len() > MAX_DRAFT {
        return Err(ApiError::invalid(
            "draft_tokens",
            format!("between 1 and {MAX_DRAFT} drafted tokens are verified per call"),
        ));
    }
    let has_prefix = req.prefix_tokens.as_ref().is_some_and(|p| !p.is_empty());
    if req.continues_session() {
        if req.session_length.is_none() {
            return Err(ApiError::invalid(
                "session_length",
                "a call that continues a session must say how many tokens it holds",
            ));
        }
    } else if !has_prefix && req.messages.is_empty() {
        return Err(ApiError::invalid(
            "prefix_tokens",
            "give the prefix as prefix_tokens or messages, or continue a session",
        ));
    }
    if !req.draft_probs.is_empty() && req.draft_probs.len() != req.draft_tokens.len() {
        return Err(ApiError::invalid(
            "draft_probs",
            "one probability per drafted token, or none",
        ));
    }
    Ok(())
}

/// `POST /v1/verify`.
pub async fn verify(req: Request, env: &Env) -> Result<Response> {
    respond(serve(req, env).await)
}

/// Admits the call, holds its worst case, forwards it and bills what the verifier used.
async fn serve(mut req: Request, env: &Env) -> std::result::Result<Response, Refusal> {
    let caller = caller(&req, env).await?;
    let (body, parsed) = json_body::<VerifyRequest>(&mut req).await?;
    // Token ids cannot be scanned here; messages can, and are.
    check(&parsed).and_then(|()| caller.permits(&parsed.model, &parsed.messages))?;
    let list = verifiers_of(env, &parsed.model)?;
    let tokens_in = input_tokens_bound(&parsed);
    // At most every drafted token accepted plus the verifier's own.
    let tokens_out = parsed.draft_tokens.len() as i64 + 1;
    let hold = caller.hold(env, &list, tokens_in, tokens_out).await?;
    let bill = Bill {
        held: (tokens_in, tokens_out),
        held_prices: dearest_prices(&list),
        started: hold.now_ms,
        template: Record {
            id: hold.id.clone(),
            ts_ms: hold.now_ms,
            user: caller.claims.sub.clone(),
            session: caller.claims.sid.clone(),
            feature: caller.claims.feat.clone().unwrap_or_default(),
            model: parsed.model.clone(),
            route_reason: "speculative".into(),
            draft_tokens: parsed.draft_tokens.len() as i64,
            ..Record::default()
        }
        .claimed_by(parsed.straddle.as_ref()),
        hold,
        stub: caller.stub,
    };
    let since = |bill: &Bill| now_ms() - bill.started;
    let outgoing = Outgoing {
        path: "/v1/verify",
        body: &body,
        model: &parsed.model,
        strip_envelope: true,
        affinity: parsed.session.as_deref(),
    };
    let mut answered = match forward(env, &list, &outgoing).await {
        Ok(answered) => answered,
        Err(failure) => {
            let r = bill.record(None, failure.outcome(), 0, 0, since(&bill));
            bill.settle(r).await;
            return Err(failure.into_api_error().into());
        }
    };
    if answered.response.status_code() != 200 {
        let r = bill.record(Some(&answered), "upstream_status", 0, 0, since(&bill));
        bill.settle(r).await;
        // A 409 (the tokenizers differ) or a 400 reaches the caller as the upstream said it.
        let resp = std::mem::replace(&mut answered.response, Response::empty()?);
        return Ok(relay_failure(resp).await?);
    }
    let text = text_within(&mut answered.response, &answered.upstream, bill.started).await?;
    let Some(text) = text else {
        let r = bill.record(
            Some(&answered),
            "upstream_timeout",
            tokens_in,
            0,
            since(&bill),
        );
        bill.settle(r).await;
        return Err(total_timeout(&answered.upstream).into());
    };
    let (t_in, t_out, accepted) = used_by(&text, (tokens_in, tokens_out));
    let r = Record {
        accepted_tokens: accepted,
        ..bill.record(Some(&answered), "ok", t_in, t_out, since(&bill))
    };
    bill.settle(r).await;
    let mut out = Response::ok(text)?;
    out.headers_mut().set("content-type", "application/json")?;
    Ok(out)
}

/// The (prompt, completion) tokens a verifier's answer used, and the drafted tokens it
/// accepted; an answer without usage is billed at the worst case `held`.
fn used_by(answer: &str, held: (i64, i64)) -> (i64, i64, i64) {
    match serde_json::from_str::<VerifyResponse>(answer) {
        Ok(v) => (
            i64::from(v.usage.prompt_tokens),
            i64::from(v.usage.completion_tokens),
            i64::from(v.accepted),
        ),
        Err(_) => (held.0, held.1, 0),
    }
}

/// The configured upstreams that verify drafts of `model`.
fn verifiers_of(env: &Env, model: &str) -> std::result::Result<Vec<Upstream>, Refusal> {
    let list: Vec<Upstream> = upstream_list(env)
        .map_err(|message| ApiError::new(ErrorKind::Unavailable, message))?
        .into_iter()
        .filter(|u| u.supports_verify && u.serves(model))
        .collect();
    if list.is_empty() {
        let e = ApiError::new(
            ErrorKind::Unavailable,
            format!("no configured upstream verifies drafts of the model {model:?}"),
        );
        return Err(e.with_code("verify_unsupported").into());
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use straddle_protocol::{Message, Role};

    #[test]
    fn drafts_and_prefixes_are_checked_before_anything_is_held() {
        let ok = VerifyRequest {
            prefix_tokens: Some(vec![1, 2, 3]),
            draft_tokens: vec![4, 5],
            ..Default::default()
        };
        assert!(check(&ok).is_ok());
        assert_eq!(input_tokens_bound(&ok), 5);
        let empty = VerifyRequest {
            draft_tokens: vec![],
            ..ok.clone()
        };
        assert!(check(&empty).is_err());
        let no_prefix = VerifyRequest {
            prefix_tokens: None,
            ..ok.clone()
        };
        assert!(check(&no_prefix).is_err());
        let bad_probs = VerifyRequest {
            draft_probs: vec![0.5],
            ..ok.clone()
        };
        assert!(check(&bad_probs).is_err());
        let by_messages = VerifyRequest {
            prefix_tokens: None,
            messages: vec![Message::new(Role::User, "abcd")],
            ..ok
        };
        assert!(check(&by_messages).is_ok());
        assert_eq!(input_tokens_bound(&by_messages), 2 + 8 + 2);
        let continuing = VerifyRequest {
            prefix_tokens: None,
            session: Some("s".into()),
            session_length: Some(40),
            ..by_messages.clone()
        };
        let continuing = VerifyRequest {
            messages: vec![],
            ..continuing
        };
        assert!(check(&continuing).is_ok());
        assert_eq!(input_tokens_bound(&continuing), 1 + 2);
        let without_length = VerifyRequest {
            session_length: None,
            ..continuing
        };
        assert!(check(&without_length).is_err());
    }
}
