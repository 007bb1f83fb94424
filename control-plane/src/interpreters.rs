//! The hub's resource interpreters, in layers as Karmada has them: the users'
//! `ResourceInterpreterCustomization` objects on the hub first, then Lifeboat's built-ins. An
//! operation a customization defines for a kind replaces the built-in one for that kind; the
//! other operations of the kind keep the built-ins.
//!
//! The layers are rebuilt when customizations change and swapped in whole ([`InterpreterHandle`]),
//! so an evaluation never sees half an update. A customization that does not compile is left out
//! (with its error reported), never blocking the others.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use lifeboat_api::config::ResourceInterpreterCustomization as CustomizationObject;
use lifeboat_interpreter::results::{AggregatedStatusItem, Component, ReplicaInterpretation};
use lifeboat_interpreter::{
    Health, InterpretError, Interpreter, Operation, ResourceInterpreterCustomization, Runtime,
};
use serde_json::Value;

/// The layered interpreters.
pub struct Interpreters {
    user: Interpreter,
    builtin: Arc<Interpreter>,
    generation: u64,
}

/// Source of [`Interpreters::generation`]: every layering gets a new one.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// A customization that could not be loaded, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub name: String,
    pub reason: String,
}

impl Interpreters {
    /// The built-ins alone.
    pub fn builtin(runtime: Arc<Runtime>) -> Result<Arc<Interpreter>, InterpretError> {
        let mut builtin = Interpreter::new(runtime);
        lifeboat_interpreter::builtin::load(&mut builtin)
            .map_err(|e| InterpretError::Input(format!("built-in interpreters: {e}")))?;
        Ok(Arc::new(builtin))
    }

    /// The customizations (in name order, as Karmada merges them) over the built-ins.
    pub fn layered(
        builtin: Arc<Interpreter>,
        customizations: &[CustomizationObject],
    ) -> (Interpreters, Vec<Rejected>) {
        let mut user = Interpreter::new(builtin.runtime().clone());
        let mut rejected = Vec::new();
        let mut sorted: Vec<&CustomizationObject> = customizations.iter().collect();
        sorted.sort_by_key(|c| c.metadata.name.clone());
        for object in sorted {
            let name = object.metadata.name.clone().unwrap_or_default();
            let loaded =
                to_interpreter_type(object).and_then(|c| user.add(&c).map_err(|e| e.to_string()));
            if let Err(reason) = loaded {
                rejected.push(Rejected { name, reason });
            }
        }
        let generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
        (
            Interpreters {
                user,
                builtin,
                generation,
            },
            rejected,
        )
    }

    /// Identifies this layering: two `Interpreters` with the same generation are the same
    /// scripts, so a result remembered under one generation holds only for that generation
    /// (the status processor's interpretation cache is keyed by it).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn pick(&self, object: &Value, operation: Operation) -> &Interpreter {
        let field = |name: &str| object.get(name).and_then(Value::as_str).unwrap_or("");
        if self.user.has(field("apiVersion"), field("kind"), operation) {
            &self.user
        } else {
            &self.builtin
        }
    }

    /// Whether any layer has the operation for the kind.
    pub fn has(&self, api_version: &str, kind: &str, operation: Operation) -> bool {
        self.user.has(api_version, kind, operation)
            || self.builtin.has(api_version, kind, operation)
    }

    pub fn interpret_health(&self, observed: &Value) -> Result<Option<Health>, InterpretError> {
        self.pick(observed, Operation::InterpretHealth)
            .interpret_health(observed)
    }

    pub fn reflect_status(&self, observed: &Value) -> Result<Option<Value>, InterpretError> {
        self.pick(observed, Operation::InterpretStatus)
            .reflect_status(observed)
    }

    pub fn get_replicas(
        &self,
        desired: &Value,
    ) -> Result<Option<ReplicaInterpretation>, InterpretError> {
        self.pick(desired, Operation::InterpretReplica)
            .get_replicas(desired)
    }

    pub fn get_components(
        &self,
        desired: &Value,
    ) -> Result<Option<Option<Vec<Component>>>, InterpretError> {
        self.pick(desired, Operation::InterpretComponent)
            .get_components(desired)
    }

    pub fn revise_replica(
        &self,
        desired: &Value,
        replicas: i64,
    ) -> Result<Option<Value>, InterpretError> {
        self.pick(desired, Operation::ReviseReplica)
            .revise_replica(desired, replicas)
    }

    pub fn aggregate_status(
        &self,
        desired: &Value,
        items: Option<&[AggregatedStatusItem]>,
    ) -> Result<Option<Value>, InterpretError> {
        self.pick(desired, Operation::AggregateStatus)
            .aggregate_status(desired, items)
    }
}

/// The CRD object as the interpreter's customization document (same schema).
fn to_interpreter_type(
    object: &CustomizationObject,
) -> Result<ResourceInterpreterCustomization, String> {
    let json = serde_json::json!({
        "apiVersion": "config.lifeboat.dev/v1alpha1",
        "kind": "ResourceInterpreterCustomization",
        "metadata": {"name": object.metadata.name.clone().unwrap_or_default()},
        "spec": object.spec,
    });
    serde_json::from_value(json).map_err(|e| format!("spec: {e}"))
}

/// The current layers, swapped whole when customizations change.
#[derive(Clone)]
pub struct InterpreterHandle {
    current: Arc<RwLock<Arc<Interpreters>>>,
}

impl InterpreterHandle {
    pub fn new(interpreters: Interpreters) -> InterpreterHandle {
        InterpreterHandle {
            current: Arc::new(RwLock::new(Arc::new(interpreters))),
        }
    }

    pub fn current(&self) -> Arc<Interpreters> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn replace(&self, interpreters: Interpreters) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(interpreters);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeboat_interpreter::{HealthState, RuntimeConfig};
    use serde_json::json;

    fn customization(name: &str, script: &str) -> CustomizationObject {
        serde_json::from_value(json!({
            "apiVersion": "config.lifeboat.dev/v1alpha1",
            "kind": "ResourceInterpreterCustomization",
            "metadata": {"name": name},
            "spec": {
                "target": {"apiVersion": "apps/v1", "kind": "Deployment"},
                "customizations": {"healthInterpretation": {"luaScript": script}}
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_customization_replaces_only_its_operation_and_bad_ones_are_left_out() {
        let builtin =
            Interpreters::builtin(Arc::new(Runtime::new(RuntimeConfig::default()))).unwrap();
        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"generation": 1},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}},
            "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2, "readyReplicas": 2}
        });
        let (plain, rejected) = Interpreters::layered(builtin.clone(), &[]);
        assert!(rejected.is_empty());
        assert_eq!(
            plain.interpret_health(&deployment).unwrap().unwrap().state,
            HealthState::Healthy
        );
        let (custom, rejected) = Interpreters::layered(
            builtin.clone(),
            &[
                customization(
                    "never-healthy",
                    "function InterpretHealth(obj) return false end",
                ),
                customization("broken", "function InterpretHealth(obj) return ( end"),
            ],
        );
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].name, "broken");
        assert_eq!(
            custom.interpret_health(&deployment).unwrap().unwrap().state,
            HealthState::Unhealthy
        );
        // the kind's other operations still come from the built-ins
        assert!(custom.get_replicas(&deployment).unwrap().is_some());
        let handle = InterpreterHandle::new(plain);
        handle.replace(custom);
        assert!(
            handle
                .current()
                .has("apps/v1", "Deployment", Operation::InterpretHealth)
        );
    }
}
