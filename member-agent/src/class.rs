//! The failure class the agent attaches to every Unhealthy condition, for the hub to decide
//! between resetting in place and moving the workload: a failure of the application would fail
//! the same way elsewhere; one of the infrastructure or of capacity is worth a move.
//!
//! Wire format: the Unhealthy condition's message starts with `[<Class>] ` (the built-in
//! AppWrapper Lua interpreter parses it; absent means Unknown).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// Terminal exit codes, a failed Job with application errors, an invalid template.
    Application,
    /// Node lost or NotReady, NoExecute GPU health, spot reclamation.
    Infrastructure,
    /// Pods unschedulable beyond the admission grace, quota exceeded, preemption.
    Capacity,
    Unknown,
}

impl FailureClass {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Application => "Application",
            FailureClass::Infrastructure => "Infrastructure",
            FailureClass::Capacity => "Capacity",
            FailureClass::Unknown => "Unknown",
        }
    }

    /// A condition message carrying this class.
    pub fn message(self, text: impl fmt::Display) -> String {
        format!("[{}] {text}", self.as_str())
    }

    /// The class at the start of a condition message (Unknown when absent).
    pub fn parse_message(message: &str) -> FailureClass {
        let tag = message
            .strip_prefix('[')
            .and_then(|rest| rest.split_once(']'))
            .map(|(tag, _)| tag);
        match tag {
            Some("Application") => FailureClass::Application,
            Some("Infrastructure") => FailureClass::Infrastructure,
            Some("Capacity") => FailureClass::Capacity,
            _ => FailureClass::Unknown,
        }
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
        for class in [
            FailureClass::Application,
            FailureClass::Infrastructure,
            FailureClass::Capacity,
            FailureClass::Unknown,
        ] {
            let m = class.message("pod a (exit code 3)");
            assert!(m.ends_with("pod a (exit code 3)"));
            assert_eq!(FailureClass::parse_message(&m), class);
        }
        assert_eq!(FailureClass::parse_message("no tag"), FailureClass::Unknown);
        assert_eq!(
            FailureClass::parse_message("[Bogus] x"),
            FailureClass::Unknown
        );
    }
}
