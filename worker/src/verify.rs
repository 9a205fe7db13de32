//! `POST /v1/verify`: an edge-drafted continuation checked by an upstream that supports it
//! (speculative decoding), under the same tenant auth and budget as chat: the prefix and the
//! draft are billed as input tokens, the accepted tokens and the verifier's own as output.

use straddle_protocol::{ApiError, ErrorKind, VerifyRequest, VerifyResponse};
use straddle_router::price::Price;
use worker::{Env, Request, Response, Result};

use crate::admission::{Caller, caller, cost_usd, json_body, now_ms, settle};
use crate::budget::Record;
use crate::error::error_response;
use crate::forward::{
    Answered, Outgoing, forward, relay_failure, text_within, total_timeout, upstream_list,
};

/// Drafts longer than this are refused: adaptive drafting stays within 16.
const MAX_DRAFT: usize = 64;

/// What the request asks the verifier to read, as a token bound: the prefix's ids when given
/// (exact), else two bytes a token of the messages, or on a continuing session call the one
/// pending token; plus the draft.
fn input_tokens_bound(req: &VerifyRequest) -> i64 {
    if req.continues_session() {
        return 1 + req.draft_tokens.len() as i64;
    }
    let prefix = match &req.prefix_tokens {
        Some(ids) => ids.len() as i64,
        None => req
            .messages
            .iter()
            .map(|m| m.content.len().div_ceil(2) as i64 + 8)
            .sum(),
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
pub async fn verify(mut req: Request, env: &Env) -> Result<Response> {
    let caller = match caller(&req, env).await? {
        Ok(c) => c,
        Err(refusal) => return Ok(refusal),
    };
    let (body, parsed) = match json_body::<VerifyRequest>(&mut req).await? {
        Ok(got) => got,
        Err(refusal) => return Ok(refusal),
    };
    // Token ids cannot be scanned here; messages can, and are.
    if let Err(e) = check(&parsed).and_then(|()| caller.permits(&parsed.model, &parsed.messages)) {
        return error_response(&e);
    }
    let list: Vec<_> = match upstream_list(env) {
        Ok(l) => l
            .into_iter()
            .filter(|u| u.supports_verify && u.serves(&parsed.model))
            .collect(),
        Err(message) => return error_response(&ApiError::new(ErrorKind::Unavailable, message)),
    };
    if list.is_empty() {
        return error_response(
            &ApiError::new(
                ErrorKind::Unavailable,
                format!(
                    "no configured upstream verifies drafts of the model {:?}",
                    parsed.model
                ),
            )
            .with_code("verify_unsupported"),
        );
    }

    let tokens_in = input_tokens_bound(&parsed);
    // At most every drafted token accepted plus the verifier's own.
    let tokens_out = parsed.draft_tokens.len() as i64 + 1;
    let hold = match caller.hold(env, &list, tokens_in, tokens_out).await? {
        Ok(h) => h,
        Err(refusal) => return Ok(refusal),
    };
    let Caller { claims, stub, .. } = caller;
    let started = hold.now_ms;

    let record = |upstream: &str, outcome: &str, t_in: i64, t_out: i64, p: Price| Record {
        id: hold.id.clone(),
        ts_ms: started,
        user: claims.sub.clone(),
        session: claims.sid.clone(),
        feature: claims.feat.clone().unwrap_or_default(),
        model: parsed.model.clone(),
        upstream: upstream.into(),
        route_reason: "speculative".into(),
        router_version: String::new(),
        policy_version: String::new(),
        quality_model_version: String::new(),
        edge_model_sha256: String::new(),
        upstream_model: String::new(),
        unbilled_tokens: 0,
        tokens_in: t_in,
        tokens_out: t_out,
        usd: cost_usd(p, t_in, t_out),
        ttfb_ms: now_ms() - started,
        total_ms: now_ms() - started,
        outcome: outcome.into(),
        degraded: false,
    };
    let outgoing = Outgoing {
        path: "/v1/verify",
        body: &body,
        model: &parsed.model,
        strip_envelope: false,
        affinity: parsed.session.as_deref(),
    };
    let Answered {
        upstream,
        response: mut resp,
        failed_over,
    } = match forward(env, &list, &outgoing).await {
        Ok(answered) => answered,
        Err(failure) => {
            settle(
                stub,
                hold.id.clone(),
                record("none", failure.outcome(), 0, 0, Price::default()),
            )
            .await;
            return error_response(&failure.into_api_error());
        }
    };
    let record = |outcome: &str, t_in: i64, t_out: i64, p: Price| Record {
        degraded: failed_over,
        ..record(&upstream.name, outcome, t_in, t_out, p)
    };
    let prices = upstream.price();
    let status = resp.status_code();
    if status != 200 {
        settle(
            stub,
            hold.id.clone(),
            record("upstream_status", 0, 0, prices),
        )
        .await;
        // A 409 (the tokenizers differ) or a 400 reaches the caller as the upstream said it.
        return relay_failure(resp).await;
    }
    let Some(text) = text_within(&mut resp, &upstream, started).await? else {
        settle(
            stub,
            hold.id.clone(),
            record("upstream_timeout", tokens_in, 0, prices),
        )
        .await;
        return error_response(&total_timeout(&upstream));
    };
    let (t_in, t_out) = match serde_json::from_str::<VerifyResponse>(&text) {
        Ok(v) => (
            i64::from(v.usage.prompt_tokens),
            i64::from(v.usage.completion_tokens),
        ),
        // An answer without usage is billed at the worst case held.
        Err(_) => (tokens_in, tokens_out),
    };
    settle(stub, hold.id.clone(), record("ok", t_in, t_out, prices)).await;
    let mut out = Response::ok(text)?;
    out.headers_mut().set("content-type", "application/json")?;
    Ok(out)
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
