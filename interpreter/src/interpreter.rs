//! Customizations by target kind, and the eight operations with Karmada's argument and result
//! handling.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use mlua::{Lua, MultiValue, Value as LuaValue};
use serde_json::Value;

use crate::customization::{CustomizationTarget, ResourceInterpreterCustomization};
use crate::empty::repair_empty_tables;
use crate::error::{CustomizationError, InterpretError, RunError};
use crate::operation::Operation;
use crate::results::{
    AggregatedStatusItem, Component, DependentObjectReference, Health, ReplicaInterpretation,
    ReplicaRequirements, sort_dependencies,
};
use crate::runtime::Runtime;
use crate::sandbox::{Arg, Outputs, Script};

struct Registered {
    customization: String,
    script: Arc<Script>,
}

/// Interprets objects with the customizations loaded for their kind.
pub struct Interpreter {
    runtime: Arc<Runtime>,
    targets: HashMap<CustomizationTarget, BTreeMap<Operation, Vec<Registered>>>,
}

fn target_of(object: &Value) -> Result<CustomizationTarget, InterpretError> {
    let map = object
        .as_object()
        .ok_or_else(|| InterpretError::Input("the object must be a JSON object".to_string()))?;
    let field = |name: &str| match map.get(name) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(InterpretError::Input(format!("the object has no {name}"))),
    };
    Ok(CustomizationTarget {
        api_version: field("apiVersion")?,
        kind: field("kind")?,
    })
}

fn result_error(message: impl Into<String>) -> RunError {
    RunError::Result(message.into())
}

fn first(results: &MultiValue) -> LuaValue {
    results.iter().next().cloned().unwrap_or(LuaValue::Nil)
}

/// A table result that must be a Kubernetes object (Karmada decodes it as Unstructured).
fn object_result(
    out: &Outputs<'_, '_>,
    function: &str,
    value: &LuaValue,
    references: &[&Value],
) -> Result<Value, RunError> {
    if !value.is_table() {
        return Err(result_error(format!(
            "{function} must return a table, got {}",
            value.type_name()
        )));
    }
    let json = repair_empty_tables(out.to_json(value)?, true, references);
    match json.get("kind") {
        Some(Value::String(kind)) if !kind.is_empty() => Ok(json),
        _ => Err(result_error(format!(
            "the object returned by {function} has no kind"
        ))),
    }
}

impl Interpreter {
    pub fn new(runtime: Arc<Runtime>) -> Interpreter {
        Interpreter {
            runtime,
            targets: HashMap::new(),
        }
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// Loads a customization: every script must compile, and no operation other than
    /// InterpretDependency may already be defined for the target.
    pub fn add(
        &mut self,
        customization: &ResourceInterpreterCustomization,
    ) -> Result<(), CustomizationError> {
        customization.validate()?;
        let name = &customization.metadata.name;
        let target = &customization.spec.target;
        let existing = self.targets.get(target);
        let mut staged = Vec::new();
        for operation in customization.spec.customizations.operations() {
            if operation != Operation::InterpretDependency
                && let Some(previous) = existing
                    .and_then(|ops| ops.get(&operation))
                    .and_then(|v| v.first())
            {
                return Err(CustomizationError::Duplicate {
                    name: name.clone(),
                    existing: previous.customization.clone(),
                    operation,
                    api_version: target.api_version.clone(),
                    kind: target.kind.clone(),
                });
            }
            let source = customization
                .spec
                .customizations
                .script(operation)
                .unwrap_or_default();
            let script = Arc::new(Script::new(
                format!("{name}/{}", operation.customization_field()),
                source,
            ));
            self.runtime
                .check_compiles(&script)
                .map_err(|e| CustomizationError::Compile {
                    name: name.clone(),
                    operation,
                    message: match e {
                        RunError::Compile(message) => message,
                        other => other.to_string(),
                    },
                })?;
            staged.push((operation, script));
        }
        let ops = self.targets.entry(target.clone()).or_default();
        for (operation, script) in staged {
            ops.entry(operation).or_default().push(Registered {
                customization: name.clone(),
                script,
            });
        }
        Ok(())
    }

    /// Parses and loads every customization document of a YAML text.
    pub fn add_yaml(&mut self, text: &str) -> Result<usize, CustomizationError> {
        let docs = ResourceInterpreterCustomization::parse_documents(text)?;
        for doc in &docs {
            self.add(doc)?;
        }
        Ok(docs.len())
    }

    /// Whether an operation is defined for a kind.
    pub fn has(&self, api_version: &str, kind: &str, operation: Operation) -> bool {
        let target = CustomizationTarget {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        };
        self.targets
            .get(&target)
            .is_some_and(|ops| ops.get(&operation).is_some_and(|v| !v.is_empty()))
    }

    /// The customization whose script runs `operation` for a kind (the first loaded, for the
    /// operations that run one script).
    pub fn customization_name(
        &self,
        api_version: &str,
        kind: &str,
        operation: Operation,
    ) -> Option<&str> {
        let target = CustomizationTarget {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        };
        self.targets
            .get(&target)
            .and_then(|ops| ops.get(&operation))
            .and_then(|v| v.first())
            .map(|r| r.customization.as_str())
    }

    fn scripts(
        &self,
        object: &Value,
        operation: Operation,
    ) -> Result<&[Registered], InterpretError> {
        let target = target_of(object)?;
        Ok(self
            .targets
            .get(&target)
            .and_then(|ops| ops.get(&operation))
            .map(Vec::as_slice)
            .unwrap_or(&[]))
    }

    fn evaluate<R>(
        &self,
        registered: &Registered,
        operation: Operation,
        args: &[Arg<'_>],
        take_results: impl FnOnce(&Lua, MultiValue, &Outputs<'_, '_>) -> Result<R, RunError>,
    ) -> Result<R, InterpretError> {
        self.runtime
            .with_sandbox(|sandbox| {
                sandbox.evaluate(
                    &registered.script,
                    operation.function_name(),
                    args,
                    take_results,
                )
            })
            .map_err(|error| InterpretError::Evaluation {
                script: registered.script.name().to_string(),
                operation,
                error,
            })
    }

    fn single(
        &self,
        object: &Value,
        operation: Operation,
    ) -> Result<Option<&Registered>, InterpretError> {
        Ok(self.scripts(object, operation)?.first())
    }

    /// InterpretHealth on a member-cluster object. `None`: no health rule for this kind.
    pub fn interpret_health(&self, observed: &Value) -> Result<Option<Health>, InterpretError> {
        let Some(registered) = self.single(observed, Operation::InterpretHealth)? else {
            return Ok(None);
        };
        self.evaluate(
            registered,
            Operation::InterpretHealth,
            &[Arg::Object(observed)],
            |_, results, out| match first(&results) {
                LuaValue::Boolean(b) => Ok(Health::from_bool(b)),
                value @ LuaValue::Table(_) => {
                    Health::from_table(&out.to_json(&value)?).map_err(result_error)
                }
                other => Err(result_error(format!(
                    "InterpretHealth must return a boolean or a health table, got {}",
                    other.type_name()
                ))),
            },
        )
        .map(Some)
    }

    /// InterpretReplica (`GetReplicas`) on a resource template.
    pub fn get_replicas(
        &self,
        desired: &Value,
    ) -> Result<Option<ReplicaInterpretation>, InterpretError> {
        let Some(registered) = self.single(desired, Operation::InterpretReplica)? else {
            return Ok(None);
        };
        self.evaluate(
            registered,
            Operation::InterpretReplica,
            &[Arg::Object(desired)],
            |_, results, out| {
                let mut iter = results.into_iter();
                let replica = match iter.next().unwrap_or(LuaValue::Nil) {
                    // Karmada converts a float64 to int32: truncation.
                    LuaValue::Integer(i) => {
                        i.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
                    }
                    LuaValue::Number(f) => f as i32,
                    other => {
                        return Err(result_error(format!(
                            "GetReplicas must return a number first, got {}",
                            other.type_name()
                        )));
                    }
                };
                let requires = match iter.next().unwrap_or(LuaValue::Nil) {
                    LuaValue::Nil => None,
                    value @ LuaValue::Table(_) => {
                        let json = repair_empty_tables(out.to_json(&value)?, true, &[]);
                        Some(
                            serde_json::from_value::<ReplicaRequirements>(json)
                                .map_err(|e| result_error(format!("replica requirements: {e}")))?,
                        )
                    }
                    other => {
                        return Err(result_error(format!(
                            "GetReplicas must return a table or nil second, got {}",
                            other.type_name()
                        )));
                    }
                };
                Ok(ReplicaInterpretation { replica, requires })
            },
        )
        .map(Some)
    }

    /// InterpretComponent (`GetComponents`). `Some(None)`: the script returned nil.
    pub fn get_components(
        &self,
        desired: &Value,
    ) -> Result<Option<Option<Vec<Component>>>, InterpretError> {
        let Some(registered) = self.single(desired, Operation::InterpretComponent)? else {
            return Ok(None);
        };
        self.evaluate(
            registered,
            Operation::InterpretComponent,
            &[Arg::Object(desired)],
            |_, results, out| match first(&results) {
                LuaValue::Nil => Ok(None),
                value @ LuaValue::Table(_) => {
                    let json = repair_empty_tables(out.to_json(&value)?, false, &[]);
                    serde_json::from_value::<Vec<Component>>(json)
                        .map(Some)
                        .map_err(|e| result_error(format!("components: {e}")))
                }
                other => Err(result_error(format!(
                    "GetComponents must return a table or nil, got {}",
                    other.type_name()
                ))),
            },
        )
        .map(Some)
    }

    /// ReviseReplica: the template with `replicas` applied.
    pub fn revise_replica(
        &self,
        desired: &Value,
        replicas: i64,
    ) -> Result<Option<Value>, InterpretError> {
        let Some(registered) = self.single(desired, Operation::ReviseReplica)? else {
            return Ok(None);
        };
        self.evaluate(
            registered,
            Operation::ReviseReplica,
            &[Arg::Object(desired), Arg::Integer(replicas)],
            |_, results, out| object_result(out, "ReviseReplica", &first(&results), &[desired]),
        )
        .map(Some)
    }

    /// Retain: the desired object with runtime values kept from the observed one.
    pub fn retain(
        &self,
        desired: &Value,
        observed: &Value,
    ) -> Result<Option<Value>, InterpretError> {
        let Some(registered) = self.single(desired, Operation::Retain)? else {
            return Ok(None);
        };
        self.evaluate(
            registered,
            Operation::Retain,
            &[Arg::Object(desired), Arg::Object(observed)],
            |_, results, out| object_result(out, "Retain", &first(&results), &[desired, observed]),
        )
        .map(Some)
    }

    /// InterpretStatus (`ReflectStatus`): the status to report from a member object.
    pub fn reflect_status(&self, observed: &Value) -> Result<Option<Value>, InterpretError> {
        let Some(registered) = self.single(observed, Operation::InterpretStatus)? else {
            return Ok(None);
        };
        self.evaluate(
            registered,
            Operation::InterpretStatus,
            &[Arg::Object(observed)],
            |_, results, out| match first(&results) {
                value @ LuaValue::Table(_) => {
                    Ok(repair_empty_tables(out.to_json(&value)?, true, &[]))
                }
                other => Err(result_error(format!(
                    "ReflectStatus must return a table, got {}",
                    other.type_name()
                ))),
            },
        )
        .map(Some)
    }

    /// AggregateStatus: the template with the member statuses aggregated. `items: None` is
    /// Karmada's nil list (no member reported yet).
    pub fn aggregate_status(
        &self,
        desired: &Value,
        items: Option<&[AggregatedStatusItem]>,
    ) -> Result<Option<Value>, InterpretError> {
        let Some(registered) = self.single(desired, Operation::AggregateStatus)? else {
            return Ok(None);
        };
        let items_json = match items {
            Some(items) => {
                serde_json::to_value(items).map_err(|e| InterpretError::Input(e.to_string()))?
            }
            None => Value::Null,
        };
        self.evaluate(
            registered,
            Operation::AggregateStatus,
            &[Arg::Object(desired), Arg::Object(&items_json)],
            |_, results, out| object_result(out, "AggregateStatus", &first(&results), &[]),
        )
        .map(Some)
    }

    /// InterpretDependency (`GetDependencies`): every customization's script runs; results are
    /// validated, merged and sorted.
    pub fn get_dependencies(
        &self,
        desired: &Value,
    ) -> Result<Option<Vec<DependentObjectReference>>, InterpretError> {
        let scripts = self.scripts(desired, Operation::InterpretDependency)?;
        if scripts.is_empty() {
            return Ok(None);
        }
        let mut merged: Vec<DependentObjectReference> = Vec::new();
        for registered in scripts {
            let found = self.evaluate(
                registered,
                Operation::InterpretDependency,
                &[Arg::Object(desired)],
                |_, results, out| match first(&results) {
                    value @ LuaValue::Table(_) => {
                        let json = repair_empty_tables(out.to_json(&value)?, false, &[]);
                        let refs: Vec<DependentObjectReference> = serde_json::from_value(json)
                            .map_err(|e| result_error(format!("dependencies: {e}")))?;
                        for r in &refs {
                            r.validate().map_err(result_error)?;
                        }
                        Ok(refs)
                    }
                    other => Err(result_error(format!(
                        "GetDependencies must return a table, got {}",
                        other.type_name()
                    ))),
                },
            )?;
            for reference in found {
                if !merged.contains(&reference) {
                    merged.push(reference);
                }
            }
        }
        sort_dependencies(&mut merged);
        Ok(Some(merged))
    }
}
