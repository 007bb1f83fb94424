//! The failure class: what kind of failure made a workload unhealthy, which decides whether
//! moving it to another cluster can help. The member agent attaches it to every Unhealthy
//! condition it sets; Lua health interpreters may return it; the hub's failover policy reads it.
//!
//! Wire format in a condition message: `[<Class>] <text>` (absent means Unknown).

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FailureClass {
    /// The application itself fails (terminal exit codes, a failed Job, an invalid template):
    /// it would fail the same way elsewhere.
    Application,
    /// Node lost or NotReady, NoExecute GPU health, spot reclamation, unreachable cluster:
    /// worth a move.
    Infrastructure,
    /// No capacity to run it here: pods unschedulable, quota exceeded, preemption.
    Capacity,
    Unknown,
}

impl FailureClass {
    pub const ALL: [FailureClass; 4] = [
        FailureClass::Application,
        FailureClass::Infrastructure,
        FailureClass::Capacity,
        FailureClass::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Application => "Application",
            FailureClass::Infrastructure => "Infrastructure",
            FailureClass::Capacity => "Capacity",
            FailureClass::Unknown => "Unknown",
        }
    }

    /// The class of that name, if it is one.
    pub fn parse(text: &str) -> Option<FailureClass> {
        Self::ALL.into_iter().find(|c| c.as_str() == text)
    }

    /// A condition message carrying this class.
    pub fn message(self, text: impl fmt::Display) -> String {
        format!("[{}] {text}", self.as_str())
    }

    /// The class at the start of a condition message (Unknown when there is none).
    pub fn of_message(message: &str) -> FailureClass {
        message
            .strip_prefix('[')
            .and_then(|rest| rest.split_once(']'))
            .and_then(|(tag, _)| Self::parse(tag))
            .unwrap_or(FailureClass::Unknown)
    }
}

// A plain string enum: schemars would make the documented variants a `oneOf`, which is not a
// structural schema.
impl schemars::JsonSchema for FailureClass {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "FailureClass".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "enum": ["Application", "Infrastructure", "Capacity", "Unknown"],
            "description": "What kind of failure made the workload unhealthy: Application (would fail the same way elsewhere), Infrastructure (node, GPU, spot reclamation, cluster lost: worth a move), Capacity (no room here: worth a move), Unknown."
        })
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_round_trip() {
        for class in FailureClass::ALL {
            let m = class.message("pod a (exit code 3)");
            assert!(m.ends_with("pod a (exit code 3)"));
            assert_eq!(FailureClass::of_message(&m), class);
            assert_eq!(FailureClass::parse(class.as_str()), Some(class));
        }
        assert_eq!(FailureClass::of_message("no tag"), FailureClass::Unknown);
        assert_eq!(FailureClass::of_message("[Bogus] x"), FailureClass::Unknown);
        assert_eq!(FailureClass::parse("bogus"), None);
    }
}
