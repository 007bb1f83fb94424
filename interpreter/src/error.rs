//! Errors of the interpreter.

use crate::operation::Operation;

/// Which per-evaluation limit stopped a script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Instructions,
    Memory,
    WallClock,
}

impl Limit {
    pub fn message(&self) -> &'static str {
        match self {
            Limit::Instructions => "instruction limit exceeded",
            Limit::Memory => "memory limit exceeded",
            Limit::WallClock => "wall-clock limit exceeded",
        }
    }
}

/// A failure inside one evaluation on a sandbox, before it is tied to a script and operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    #[error("cannot set up the Lua state: {0}")]
    Setup(String),
    #[error("script does not compile: {0}")]
    Compile(String),
    #[error("cannot pass the arguments to Lua: {0}")]
    Input(String),
    #[error("{0}")]
    Script(String),
    #[error("{}", .0.message())]
    Limit(Limit),
    #[error("unexpected result: {0}")]
    Result(String),
}

/// An error of an interpreter operation, naming the customization script and the operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InterpretError {
    /// The object given to the operation is unusable (not an object, no apiVersion/kind, ...).
    #[error("invalid input: {0}")]
    Input(String),
    /// The script failed, hit a limit, or returned something the operation cannot use.
    #[error("{script} ({operation}): {error}")]
    Evaluation {
        script: String,
        operation: Operation,
        error: RunError,
    },
}

impl InterpretError {
    /// The limit that stopped the script, if that is what happened.
    pub fn limit(&self) -> Option<Limit> {
        match self {
            InterpretError::Evaluation {
                error: RunError::Limit(limit),
                ..
            } => Some(*limit),
            _ => None,
        }
    }
}

/// A customization that cannot be loaded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CustomizationError {
    #[error("cannot parse customization YAML: {0}")]
    Parse(String),
    #[error("customization {name:?}: {reason}")]
    Invalid { name: String, reason: String },
    #[error("customization {name:?}: {operation} script does not compile: {message}")]
    Compile {
        name: String,
        operation: Operation,
        message: String,
    },
    #[error(
        "customization {name:?}: {operation} for {api_version}/{kind} is already defined by customization {existing:?}"
    )]
    Duplicate {
        name: String,
        existing: String,
        operation: Operation,
        api_version: String,
        kind: String,
    },
}
