//! What the detector finds: the classes of personal data, how sensitive each is, and a
//! span of one.

use serde::{Deserialize, Serialize};

/// A class of personal or secret data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntityKind {
    Email,
    Phone,
    PaymentCard,
    Iban,
    UsSsn,
    CnResidentId,
    IpAddress,
    Secret,
    /// A person's name, found after a context cue.
    PersonName,
    /// A date of birth, found after a context cue.
    DateOfBirth,
    /// A first-person medical disclosure.
    MedicalContext,
    /// A network card's hardware address.
    MacAddress,
    /// A passport number, found after a context cue.
    Passport,
    /// A driver's licence number, found after a context cue.
    DriverLicense,
    /// A city, region or country, found by the tagger.
    Location,
    /// A company or other organisation, found by the tagger.
    Organization,
    /// A street address: a house number with a street name (en, de, fr, es, it, zh, ja, ko,
    /// ru).
    StreetAddress,
    /// A national identity number with its check or date validated: South Korea's resident
    /// registration number, Russia's SNILS, Japan's My Number (after its cue).
    NationalId,
}

/// How much harm a leak of an entity class does; the policy compares it with its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sensitivity {
    Low,
    Medium,
    High,
    Critical,
}

impl EntityKind {
    /// The class's wire name (as serde writes it), for messages that must never carry values.
    pub fn as_str(self) -> &'static str {
        match self {
            EntityKind::Email => "email",
            EntityKind::Phone => "phone",
            EntityKind::PaymentCard => "payment_card",
            EntityKind::Iban => "iban",
            EntityKind::UsSsn => "us_ssn",
            EntityKind::CnResidentId => "cn_resident_id",
            EntityKind::IpAddress => "ip_address",
            EntityKind::Secret => "secret",
            EntityKind::PersonName => "person_name",
            EntityKind::DateOfBirth => "date_of_birth",
            EntityKind::MedicalContext => "medical_context",
            EntityKind::MacAddress => "mac_address",
            EntityKind::Passport => "passport",
            EntityKind::DriverLicense => "driver_license",
            EntityKind::Location => "location",
            EntityKind::Organization => "organization",
            EntityKind::StreetAddress => "street_address",
            EntityKind::NationalId => "national_id",
        }
    }

    /// Whether the class identifies no one by itself (a place, an organisation).
    pub fn is_context(self) -> bool {
        matches!(self, EntityKind::Location | EntityKind::Organization)
    }

    /// The sensitivity of this class.
    pub fn sensitivity(self) -> Sensitivity {
        match self {
            EntityKind::IpAddress
            | EntityKind::MacAddress
            | EntityKind::Location
            | EntityKind::Organization => Sensitivity::Low,
            EntityKind::Email
            | EntityKind::Phone
            | EntityKind::PersonName
            | EntityKind::StreetAddress => Sensitivity::Medium,
            EntityKind::PaymentCard
            | EntityKind::DateOfBirth
            | EntityKind::Passport
            | EntityKind::DriverLicense
            | EntityKind::MedicalContext
            | EntityKind::Iban
            | EntityKind::UsSsn
            | EntityKind::CnResidentId
            | EntityKind::NationalId => Sensitivity::High,
            EntityKind::Secret => Sensitivity::Critical,
        }
    }
}

/// One detected entity: its class and byte range in the scanned text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub kind: EntityKind,
    pub start: usize,
    pub end: usize,
    pub confidence: f32,
}
