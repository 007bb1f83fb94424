//! The hub's resource interpreters, in layers as Karmada has them: the users'
//! `ResourceInterpreterCustomization` objects on the hub first, then Lifeboat's built-ins. An
//! operation a customization defines for a kind replaces the built-in one for that kind; the
//! other operations of the kind keep the built-ins.
//!
//! The layers are rebuilt when customizations change and swapped in whole ([`InterpreterHandle`]),
//! so an evaluation never sees half an update. A customization that does not compile is left out
//! (with its error reported), never blocking the others.

pub mod events;
pub mod lanes;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use lifeboat_api::config::ResourceInterpreterCustomization as CustomizationObject;
use lifeboat_interpreter::results::{AggregatedStatusItem, Component, ReplicaInterpretation};
use lifeboat_interpreter::{
    Health, InterpretError, Interpreter, Limit, Operation, ResourceInterpreterCustomization,
    Runtime,
};
use serde_json::Value;

/// The layered interpreters.
pub struct Interpreters {
    user: Interpreter,
    builtin: Arc<Interpreter>,
    generation: u64,
    /// What the loaded customizations say for each kind (their names and specs): two layerings
    /// interpret a kind alike when they hold the same here.
    kinds: BTreeMap<Kind, String>,
}

/// `(apiVersion, kind)`.
pub type Kind = (String, String);

/// Metric label of the built-in interpreters (not a valid object name, so no customization
/// can take it).
pub const BUILTIN: &str = "(builtin)";

/// A script that failed on an object: which customization, which operation, and the error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The customization's name, or [`BUILTIN`].
    pub customization: String,
    pub operation: Operation,
    /// One line naming the customization, the operation, the script's field and the error.
    pub message: String,
    /// The limit that stopped the script, if that is what happened.
    pub limit: Option<Limit>,
}

impl Failure {
    fn of(layer: Layer, operation: Operation, error: &InterpretError) -> Failure {
        let customization = match (layer, error.customization()) {
            (Layer::User, Some(name)) => name.to_string(),
            _ => BUILTIN.to_string(),
        };
        let message = match error {
            InterpretError::Evaluation { error, .. } if layer == Layer::User => format!(
                "customization {customization} failed in {operation} \
                 (spec.customizations.{}.luaScript): {error}",
                operation.customization_field()
            ),
            other => format!("{customization} {operation}: {other}"),
        };
        Failure {
            customization,
            operation,
            message,
            limit: error.limit(),
        }
    }
}

/// Which layer ran an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layer {
    User,
    Builtin,
}

/// What one operation on one object did: the customization that ran (or [`BUILTIN`]), how
/// long it took, and its result.
pub struct Evaluated<T> {
    pub customization: String,
    pub seconds: f64,
    pub result: Result<Option<T>, Failure>,
}

/// Source of [`Interpreters::generation`]: every layering gets a new one.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// A customization that could not be loaded, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub name: String,
    pub uid: Option<String>,
    pub reason: String,
}

/// Posts a Warning Event `CustomizationRejected` on each customization the hub leaves out (its
/// scripts do not compile, or it defines an operation another already defines): what the
/// admission webhook refuses, seen at runtime when the webhook was not called (its
/// failurePolicy Ignore while no hub answered, or a customization older than the webhook).
/// Once per customization and reason.
pub struct RejectedEvents {
    client: kube::Client,
    posted: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
}

impl RejectedEvents {
    pub fn new(client: kube::Client) -> RejectedEvents {
        RejectedEvents {
            client,
            posted: Default::default(),
        }
    }

    /// Posts the Events of `rejected` not posted yet (in the background).
    pub fn post(&self, rejected: &[Rejected]) {
        use kube::runtime::events::{Event, EventType, Recorder, Reporter};
        let mut posted = self.posted.lock().unwrap_or_else(|e| e.into_inner());
        for r in rejected {
            if !posted.insert((r.name.clone(), r.reason.clone())) {
                continue;
            }
            let reference = k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("config.lifeboat.dev/v1alpha1".into()),
                kind: Some("ResourceInterpreterCustomization".into()),
                name: Some(r.name.clone()),
                uid: r.uid.clone(),
                ..Default::default()
            };
            let mut note = format!("left out by the hub: {}", r.reason);
            if note.len() > 1000 {
                let mut end = 1000;
                while !note.is_char_boundary(end) {
                    end -= 1;
                }
                note.truncate(end);
            }
            let event = Event {
                type_: EventType::Warning,
                reason: "CustomizationRejected".into(),
                note: Some(note),
                action: "Load".into(),
                secondary: None,
            };
            let recorder = Recorder::new(
                self.client.clone(),
                Reporter {
                    controller: "lifeboat-hub".into(),
                    instance: std::env::var("POD_NAME").ok(),
                },
            );
            tokio::spawn(async move {
                if let Err(error) = recorder.publish(&event, &reference).await {
                    tracing::warn!(%error, "publishing a CustomizationRejected Event failed");
                }
            });
        }
    }
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
        let mut kinds: BTreeMap<Kind, String> = BTreeMap::new();
        let mut sorted: Vec<&CustomizationObject> = customizations.iter().collect();
        sorted.sort_by_key(|c| c.metadata.name.clone());
        for object in sorted {
            let name = object.metadata.name.clone().unwrap_or_default();
            let uid = object.metadata.uid.clone();
            let loaded = to_interpreter_type(object)
                .and_then(|c| user.add(&c).map_err(|e| e.to_string()).map(|()| c));
            match loaded {
                Ok(c) => {
                    let target = (c.spec.target.api_version, c.spec.target.kind);
                    let said = kinds.entry(target).or_default();
                    said.push_str(&name);
                    said.push_str(&serde_json::to_string(&object.spec).unwrap_or_default());
                }
                Err(reason) => rejected.push(Rejected { name, uid, reason }),
            }
        }
        let generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
        (
            Interpreters {
                user,
                builtin,
                generation,
                kinds,
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

    /// The kinds that `self` interprets differently from `previous`: a customization for them
    /// was added, changed or removed.
    pub fn changed_kinds(&self, previous: &Interpreters) -> BTreeSet<Kind> {
        let mut changed = BTreeSet::new();
        for (kind, said) in &self.kinds {
            if previous.kinds.get(kind) != Some(said) {
                changed.insert(kind.clone());
            }
        }
        for kind in previous.kinds.keys() {
            if !self.kinds.contains_key(kind) {
                changed.insert(kind.clone());
            }
        }
        changed
    }

    /// Whether a customization is loaded for the kind `apiVersion/kind`.
    pub fn customizes(&self, kind: &str) -> bool {
        kind.rsplit_once('/').is_some_and(|(api_version, kind)| {
            self.kinds
                .contains_key(&(api_version.to_string(), kind.to_string()))
        })
    }

    fn pick(&self, object: &Value, operation: Operation) -> &Interpreter {
        self.pick_layer(object, operation).1
    }

    fn pick_layer(&self, object: &Value, operation: Operation) -> (Layer, &Interpreter) {
        let field = |name: &str| object.get(name).and_then(Value::as_str).unwrap_or("");
        if self.user.has(field("apiVersion"), field("kind"), operation) {
            (Layer::User, &self.user)
        } else {
            (Layer::Builtin, &self.builtin)
        }
    }

    /// The customization that runs `operation` for a kind, or [`BUILTIN`].
    pub fn customization_of(&self, api_version: &str, kind: &str, operation: Operation) -> &str {
        self.user
            .customization_name(api_version, kind, operation)
            .unwrap_or(BUILTIN)
    }

    /// Runs `operation` on `object` with `run`, timed, its failure tied to the customization.
    fn evaluated<T>(
        &self,
        object: &Value,
        operation: Operation,
        run: impl FnOnce(&Interpreter) -> Result<Option<T>, InterpretError>,
    ) -> Evaluated<T> {
        let (layer, interpreter) = self.pick_layer(object, operation);
        let customization = match layer {
            Layer::User => {
                let field = |name: &str| object.get(name).and_then(Value::as_str).unwrap_or("");
                self.customization_of(field("apiVersion"), field("kind"), operation)
            }
            Layer::Builtin => BUILTIN,
        }
        .to_string();
        let started = std::time::Instant::now();
        let result = run(interpreter).map_err(|e| Failure::of(layer, operation, &e));
        Evaluated {
            customization,
            seconds: started.elapsed().as_secs_f64(),
            result,
        }
    }

    /// InterpretHealth, timed, a failure naming its customization.
    pub fn evaluate_health(&self, observed: &Value) -> Evaluated<Health> {
        self.evaluated(observed, Operation::InterpretHealth, |i| {
            i.interpret_health(observed)
        })
    }

    /// ReflectStatus, timed, a failure naming its customization.
    pub fn evaluate_status(&self, observed: &Value) -> Evaluated<Value> {
        self.evaluated(observed, Operation::InterpretStatus, |i| {
            i.reflect_status(observed)
        })
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
    /// The generation of the current layers, for those who act on a change (the status
    /// processor re-interprets what a change affects).
    changes: Arc<tokio::sync::watch::Sender<u64>>,
}

impl InterpreterHandle {
    pub fn new(interpreters: Interpreters) -> InterpreterHandle {
        let (changes, _) = tokio::sync::watch::channel(interpreters.generation());
        InterpreterHandle {
            current: Arc::new(RwLock::new(Arc::new(interpreters))),
            changes: Arc::new(changes),
        }
    }

    /// Told the generation of every new layering.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub fn current(&self) -> Arc<Interpreters> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn replace(&self, interpreters: Interpreters) {
        let generation = interpreters.generation();
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(interpreters);
        self.changes.send_replace(generation);
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
