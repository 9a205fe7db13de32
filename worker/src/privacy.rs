//! The worker's privacy re-check: the browser's router already kept private data on the
//! device, but a page can be modified, so the same detector runs again here and anything
//! the policy keeps on device is refused before a byte goes upstream.

use straddle_protocol::{ApiError, ErrorKind, Message};
use straddle_router::pii::{self, EntityKind, Sensitivity};

/// A 451 naming the entity classes (never their values) at or above `keep_on_device_at`
/// (the tenant's policy), or `None` when the request may go.
pub fn recheck(messages: &[Message], keep_on_device_at: Sensitivity) -> Option<ApiError> {
    let mut kinds: Vec<EntityKind> = messages
        .iter()
        .flat_map(|m| pii::detect_personal(&m.content))
        .map(|s| s.kind)
        .filter(|k| k.sensitivity() >= keep_on_device_at)
        .collect();
    kinds.sort();
    kinds.dedup();
    if kinds.is_empty() {
        return None;
    }
    let names: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
    Some(
        ApiError::new(
            ErrorKind::PrivacyRefused,
            format!(
                "request contains data that must stay on the device: {}",
                names.join(", ")
            ),
        )
        .with_code("privacy_refused"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use straddle_protocol::Role;

    fn req(text: &str) -> Vec<Message> {
        vec![Message::new(Role::User, text)]
    }

    #[test]
    fn card_is_refused_by_class_without_echoing_the_value() {
        let err =
            recheck(&req("my card is 4111 1111 1111 1111"), Sensitivity::High).expect("refused");
        assert_eq!(err.status(), 451);
        assert!(err.message.contains("payment_card"));
        assert!(!err.message.contains("4111"));
        assert!(recheck(&req("what is 2+2?"), Sensitivity::High).is_none());
    }

    #[test]
    fn the_tenant_policy_sets_the_threshold() {
        let email = req("write to jane.doe@example.com about the launch");
        // An e-mail is medium: a tenant at `medium` keeps it, the default (`high`) sends it.
        assert!(recheck(&email, Sensitivity::Medium).is_some());
        assert!(recheck(&email, Sensitivity::High).is_none());
    }
}
