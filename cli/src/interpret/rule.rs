//! Runs one operation with Karmada's argument rules and names its results (`retained`,
//! `replica` + `requires`, `components`, `revised`, `status`, `aggregatedStatus`, `healthy`,
//! `dependencies`; Lifeboat adds `health` with reason and class).

use lifeboat_interpreter::{AggregatedStatusItem, Interpreter, Operation};
use serde_json::Value;

use super::compare::Actual;

/// Inputs of one operation.
#[derive(Debug, Default, Clone)]
pub struct RuleArgs {
    pub desired: Option<Value>,
    pub observed: Option<Value>,
    pub status_items: Option<Vec<AggregatedStatusItem>>,
    pub replicas: i64,
}

impl RuleArgs {
    fn desired(&self) -> Result<&Value, String> {
        self.desired
            .as_ref()
            .ok_or_else(|| "desired object (desiredObj / --desired-file) is not set".to_string())
    }

    fn observed(&self) -> Result<&Value, String> {
        self.observed
            .as_ref()
            .ok_or_else(|| "observed object (observedObj / --observed-file) is not set".to_string())
    }

    /// Every operation but Retain takes exactly one object.
    fn object(&self) -> Result<&Value, String> {
        match (&self.desired, &self.observed) {
            (Some(_), Some(_)) => {
                Err("set either the desired or the observed object, not both".to_string())
            }
            (Some(d), None) => Ok(d),
            (None, Some(o)) => Ok(o),
            (None, None) => Err("neither a desired nor an observed object is set".to_string()),
        }
    }
}

fn not_enabled<T>(found: Option<T>, operation: Operation) -> Result<T, String> {
    found.ok_or_else(|| {
        format!("rule is not enabled: no {operation} script for this object's apiVersion and kind")
    })
}

/// Runs the operation and returns its named results.
pub fn run(
    interpreter: &Interpreter,
    operation: Operation,
    args: &RuleArgs,
) -> Result<Vec<(&'static str, Actual)>, String> {
    let err = |e: lifeboat_interpreter::InterpretError| e.to_string();
    Ok(match operation {
        Operation::Retain => {
            let retained = interpreter
                .retain(args.desired()?, args.observed()?)
                .map_err(err)?;
            vec![(
                "retained",
                Actual::Object(not_enabled(retained, operation)?),
            )]
        }
        Operation::InterpretReplica => {
            let result = not_enabled(
                interpreter.get_replicas(args.object()?).map_err(err)?,
                operation,
            )?;
            vec![
                ("replica", Actual::Exact(Value::from(result.replica))),
                ("requires", Actual::Requires(result.requires)),
            ]
        }
        Operation::InterpretComponent => {
            let components = not_enabled(
                interpreter.get_components(args.object()?).map_err(err)?,
                operation,
            )?;
            vec![("components", Actual::Components(components))]
        }
        Operation::ReviseReplica => {
            let revised = interpreter
                .revise_replica(args.object()?, args.replicas)
                .map_err(err)?;
            vec![("revised", Actual::Object(not_enabled(revised, operation)?))]
        }
        Operation::InterpretStatus => {
            let status = not_enabled(
                interpreter.reflect_status(args.object()?).map_err(err)?,
                operation,
            )?;
            vec![("status", Actual::Exact(status))]
        }
        Operation::AggregateStatus => {
            let aggregated = interpreter
                .aggregate_status(args.object()?, args.status_items.as_deref())
                .map_err(err)?;
            vec![(
                "aggregatedStatus",
                Actual::Object(not_enabled(aggregated, operation)?),
            )]
        }
        Operation::InterpretHealth => {
            let health = not_enabled(
                interpreter.interpret_health(args.object()?).map_err(err)?,
                operation,
            )?;
            vec![
                (
                    "healthy",
                    Actual::Exact(health.healthy().map(Value::Bool).unwrap_or(Value::Null)),
                ),
                ("health", Actual::Health(health)),
            ]
        }
        Operation::InterpretDependency => {
            let dependencies = not_enabled(
                interpreter.get_dependencies(args.object()?).map_err(err)?,
                operation,
            )?;
            vec![("dependencies", Actual::Dependencies(dependencies))]
        }
    })
}
