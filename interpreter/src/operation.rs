//! The eight interpreter operations and their Karmada names.

use std::fmt;

/// An interpreter operation (Karmada's `InterpreterOperation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    Retain,
    InterpretReplica,
    InterpretComponent,
    ReviseReplica,
    InterpretStatus,
    AggregateStatus,
    InterpretHealth,
    InterpretDependency,
}

impl Operation {
    pub const ALL: [Operation; 8] = [
        Operation::Retain,
        Operation::InterpretReplica,
        Operation::InterpretComponent,
        Operation::ReviseReplica,
        Operation::InterpretStatus,
        Operation::AggregateStatus,
        Operation::InterpretHealth,
        Operation::InterpretDependency,
    ];

    /// The operation name (`InterpretHealth`).
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Retain => "Retain",
            Operation::InterpretReplica => "InterpretReplica",
            Operation::InterpretComponent => "InterpretComponent",
            Operation::ReviseReplica => "ReviseReplica",
            Operation::InterpretStatus => "InterpretStatus",
            Operation::AggregateStatus => "AggregateStatus",
            Operation::InterpretHealth => "InterpretHealth",
            Operation::InterpretDependency => "InterpretDependency",
        }
    }

    /// The global Lua function the script must define.
    pub fn function_name(&self) -> &'static str {
        match self {
            Operation::Retain => "Retain",
            Operation::InterpretReplica => "GetReplicas",
            Operation::InterpretComponent => "GetComponents",
            Operation::ReviseReplica => "ReviseReplica",
            Operation::InterpretStatus => "ReflectStatus",
            Operation::AggregateStatus => "AggregateStatus",
            Operation::InterpretHealth => "InterpretHealth",
            Operation::InterpretDependency => "GetDependencies",
        }
    }

    /// The field under `spec.customizations` that holds the script.
    pub fn customization_field(&self) -> &'static str {
        match self {
            Operation::Retain => "retention",
            Operation::InterpretReplica => "replicaResource",
            Operation::InterpretComponent => "componentResource",
            Operation::ReviseReplica => "replicaRevision",
            Operation::InterpretStatus => "statusReflection",
            Operation::AggregateStatus => "statusAggregation",
            Operation::InterpretHealth => "healthInterpretation",
            Operation::InterpretDependency => "dependencyInterpretation",
        }
    }

    /// Looks an operation up by name, ignoring case (as Karmada's test runner does).
    pub fn from_name(name: &str) -> Option<Operation> {
        Operation::ALL
            .into_iter()
            .find(|op| op.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_karmada() {
        assert_eq!(
            Operation::from_name("interprethealth"),
            Some(Operation::InterpretHealth)
        );
        assert_eq!(
            Operation::from_name("INTERPRETREPLICA"),
            Some(Operation::InterpretReplica)
        );
        assert_eq!(Operation::from_name("Prune"), None);
        assert_eq!(Operation::InterpretStatus.function_name(), "ReflectStatus");
        assert_eq!(
            Operation::InterpretDependency.function_name(),
            "GetDependencies"
        );
        assert_eq!(
            Operation::InterpretComponent.customization_field(),
            "componentResource"
        );
    }
}
