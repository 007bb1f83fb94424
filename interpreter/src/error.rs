//! Errors of the interpreter.

use crate::operation::Operation;

/// Which per-evaluation limit stopped a script (the names are the fields of [`Limits`]).
///
/// [`Limits`]: crate::Limits
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    Instructions,
    Memory,
    WallClock,
    /// JSON values produced when a result (or a `kube` helper argument) crosses into Rust.
    ResultNodes,
    /// String bytes (keys and values) produced by that conversion.
    ResultBytes,
    /// Nesting of that conversion (a table that contains itself ends here).
    ResultDepth,
}

impl Limit {
    /// The field of `Limits` that sets this bound (also a low-cardinality metric label).
    pub fn name(&self) -> &'static str {
        match self {
            Limit::Instructions => "instructions",
            Limit::Memory => "memory_bytes",
            Limit::WallClock => "wall_clock",
            Limit::ResultNodes => "result_nodes",
            Limit::ResultBytes => "result_bytes",
            Limit::ResultDepth => "result_depth",
        }
    }

    /// A short message without the bound (raised inside Lua to unwind the script).
    pub fn message(&self) -> &'static str {
        match self {
            Limit::Instructions => "instruction limit exceeded",
            Limit::Memory => "memory limit exceeded",
            Limit::WallClock => "wall-clock limit exceeded",
            Limit::ResultNodes => "result node limit exceeded",
            Limit::ResultBytes => "result byte limit exceeded",
            Limit::ResultDepth => "result depth limit exceeded",
        }
    }
}

/// A limit that stopped an evaluation, with the bound that was in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceeded {
    pub limit: Limit,
    /// The configured bound (instructions, bytes, milliseconds, nodes or levels).
    pub bound: u64,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bound = group_digits(self.bound);
        let name = self.limit.name();
        match self.limit {
            Limit::Instructions => write!(f, "script exceeds {bound} instructions (limit {name})"),
            Limit::Memory => write!(f, "script exceeds {bound} bytes of memory (limit {name})"),
            Limit::WallClock => write!(f, "evaluation exceeds {bound} ms (limit {name})"),
            Limit::ResultNodes => write!(f, "result exceeds {bound} nodes (limit {name})"),
            Limit::ResultBytes => write!(f, "result exceeds {bound} bytes (limit {name})"),
            Limit::ResultDepth => {
                write!(f, "result nests deeper than {bound} levels (limit {name})")
            }
        }
    }
}

/// `1000000` as `1,000,000`.
pub(crate) fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
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
    #[error("{0}")]
    Limit(Exceeded),
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
    /// The customization whose script failed (its `metadata.name`), if a script ran.
    pub fn customization(&self) -> Option<&str> {
        match self {
            InterpretError::Evaluation { script, .. } => Some(
                script
                    .split_once('/')
                    .map_or(script.as_str(), |(name, _)| name),
            ),
            InterpretError::Input(_) => None,
        }
    }

    /// The limit that stopped the script, if that is what happened.
    pub fn limit(&self) -> Option<Limit> {
        match self {
            InterpretError::Evaluation {
                error: RunError::Limit(exceeded),
                ..
            } => Some(exceeded.limit),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_errors_name_the_bound_and_the_limit() {
        let exceeded = Exceeded {
            limit: Limit::ResultNodes,
            bound: 1_000_000,
        };
        assert_eq!(
            RunError::Limit(exceeded).to_string(),
            "result exceeds 1,000,000 nodes (limit result_nodes)"
        );
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(33_554_432), "33,554,432");
    }
}
