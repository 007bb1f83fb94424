//! The status processor: agents' reports → interpreted health and reflected status → each
//! binding's per-cluster items ([`crate::status::aggregate::next_item`]) → the binding's status (written
//! only when something changed) and the template's status (the kind's AggregateStatus).
//!
//! [`StatusState`] is the decision core, IO-free: it checks each report against the cluster's
//! assigned work, refuses replays (a report older than the last one taken for that binding and
//! cluster), runs the interpreters and folds the result in. An observed object identical to the
//! one last interpreted for that binding and cluster, under the same interpreters, is not
//! interpreted again (same input, same verdict): agents report every object periodically and
//! most reports repeat the last. [`run`] is the IO around it: a thread that takes batches from
//! the intake (Lua is CPU work, kept off the async executor), interprets what the cache does not
//! hold on up to one thread per core outside the state's lock, and folds the batch in order; and
//! a writer task that applies dirty bindings' status with server-side apply.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use lifeboat_api::binding::{
    AggregatedStatusItem, GoneConfirmedBy, ResourceBinding, ResourceHealth,
};
use lifeboat_api::health::FailureClass;
use lifeboat_api::protocol::{ObservedObject, RejectedItem, StatusResponse, WorkKey, WorkStatus};
use lifeboat_api::stages;
use lifeboat_interpreter::{HealthState, Limit, Operation};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::interpreters::events::FailureNotice;
use crate::interpreters::lanes::{LaneKey, Pool, Priority};
use crate::interpreters::{Evaluated, Failure, InterpreterHandle, Interpreters, Kind};
use crate::status::aggregate::{self as status, HealthVerdict, Observation};
use crate::status::intake::{StatusBatch, StatusReceiver};
use crate::work::store::WorkStore;

mod engine;
mod interpret;
mod parallel;
mod state;
mod write;

pub use engine::*;
use interpret::*;
pub use parallel::*;
pub use state::*;
pub use write::*;

/// Field manager of everything the processor writes.
pub const FIELD_MANAGER: &str = "lifeboat-hub/status";

/// A change of health of one binding in one cluster (for the ledger and metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthTransition {
    pub key: WorkKey,
    pub cluster: String,
    pub from: ResourceHealth,
    pub to: ResourceHealth,
    pub class: Option<FailureClass>,
    pub reason: Option<String>,
    pub at: Time,
}

/// What one batch did.
#[derive(Debug, Default)]
pub struct Processed {
    pub response: StatusResponse,
    /// Bindings whose items changed.
    pub dirty: Vec<WorkKey>,
    pub transitions: Vec<HealthTransition>,
    /// The statuses the batch replaced (items and cached interpretations), for the caller to
    /// free off its critical path ([`free_in_parallel`]).
    pub displaced: Vec<serde_json::Value>,
    /// Scripts that failed in the interpretations folded in (for the bindings' Events).
    pub failures: Vec<FailureNotice>,
    /// What the interpretations folded in cost, per customization and operation.
    pub costs: Vec<Cost>,
    /// Items whose interpretation was left to come after the batch.
    pub deferred: usize,
    /// Interpretations that came after their report (folded in, or dropped as superseded).
    pub late: usize,
    /// Of those, re-evaluations after a change of customizations.
    pub reevaluated: usize,
}

#[derive(Debug, Default)]
struct Tracked {
    uid: String,
    items: BTreeMap<String, AggregatedStatusItem>,
    /// The agent's `observedAt` of the last report taken, per cluster (replay protection).
    last_report: HashMap<String, Time>,
    /// The last interpretation per cluster (the interpretation cache).
    interpreted: HashMap<String, Interpreted>,
    /// The last report with an object per cluster: re-interpreted when the customizations of
    /// its kind change, and folded in with an interpretation that comes late.
    observed: HashMap<String, WorkStatus>,
    /// Per cluster, the object (fingerprint) whose interpretation is on its way: a report of
    /// it waits for that interpretation instead of starting another.
    pending: HashMap<String, Fingerprint>,
}

impl Tracked {
    /// Takes the cluster's new item from `report`: `Some` when it changed, with the health
    /// transition if any.
    fn record(
        &mut self,
        cluster: &str,
        report: &WorkStatus,
        update: status::ItemUpdate,
        now: &Time,
        displaced: &mut Vec<serde_json::Value>,
    ) -> Option<Option<HealthTransition>> {
        self.last_report
            .insert(cluster.to_string(), report.observed_at.clone());
        let transition = update.health_transition.map(|(from, to)| HealthTransition {
            key: report.key.clone(),
            cluster: cluster.to_string(),
            from,
            to,
            class: update.item.failure_class,
            reason: update.item.health_reason.clone(),
            at: now.clone(),
        });
        let changed = update.changed;
        if let Some(old) = self.items.insert(cluster.to_string(), update.item) {
            displaced.extend(old.status);
        }
        changed.then_some(transition)
    }
}

/// Identifies an observed object under one set of interpreters: equal fingerprints mean the
/// same object text (128 bits: two independently seeded foldhash hashes of the JSON text as the
/// agent sent it) and the same scripts. Not a cryptographic digest: an agent that forged a
/// collision would only keep its own cluster's item from being interpreted again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    generation: u64,
    object: u128,
}

/// What the interpreters made of one observed object.
#[derive(Debug, Clone, PartialEq)]
pub struct Interpreted {
    fingerprint: Fingerprint,
    verdict: HealthVerdict,
    reflected: Option<serde_json::Value>,
    /// The object's kind, `apiVersion/kind` (re-interpreted when its customizations change).
    kind: Option<LaneKey>,
    /// The scripts that failed on it.
    failures: Vec<Failure>,
    /// What each operation cost (recorded in the metrics once, when it is folded in).
    costs: Vec<Cost>,
}

/// The cost of one operation of one customization on one object.
#[derive(Debug, Clone, PartialEq)]
pub struct Cost {
    pub customization: String,
    pub operation: Operation,
    pub seconds: f64,
    pub outcome: Outcome,
}

/// How an operation ended, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Error,
    /// Stopped by the wall clock or the instruction budget.
    Timeout,
}

impl Outcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
        }
    }
}

/// A fresh interpretation and a second copy of its reflected status for the cluster's item,
/// made on the interpreting thread: the fold, on one thread, then only moves values.
#[derive(Debug, Clone, PartialEq)]
pub struct Fresh {
    interpreted: Interpreted,
    item_status: Option<serde_json::Value>,
}

impl Fresh {
    fn new(interpreted: Interpreted) -> Fresh {
        let item_status = interpreted.reflected.clone();
        Fresh {
            interpreted,
            item_status,
        }
    }
}

/// Per-binding status as the processor knows it.
#[derive(Debug, Default)]
pub struct StatusState {
    bindings: HashMap<WorkKey, Tracked>,
}

/// Threads that interpret a batch: one per core.
fn interpret_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How [`StatusState::take`] gets an item's interpretation.
struct Interpretation<'a> {
    print: Option<Fingerprint>,
    fresh: Option<Fresh>,
    /// Interpreted off the batch: the item waits for it.
    deferred: bool,
    interpreters: &'a Interpreters,
}

/// An interpretation that comes after its report was taken.
#[derive(Debug)]
pub struct Late {
    pub key: WorkKey,
    pub binding_uid: String,
    pub cluster: String,
    pub fresh: Fresh,
}

/// A last observed object to interpret again (its kind's customizations changed).
#[derive(Debug, Clone)]
pub struct Reinterpretation {
    pub key: WorkKey,
    pub binding_uid: String,
    pub cluster: String,
    pub observed: ObservedObject,
    pub print: Fingerprint,
    pub lane: LaneKey,
}

/// What the processor's IO needs.
pub struct ProcessorDeps {
    pub client: kube::Client,
    pub bindings: Store<ResourceBinding>,
    pub work: Arc<WorkStore>,
    pub interpreters: InterpreterHandle,
    pub metrics: ProcessorMetrics,
    /// Health transitions go here (the ledger), if set.
    pub transitions: Option<mpsc::UnboundedSender<HealthTransition>>,
    /// Bindings whose status was written (the template status aggregation follows them).
    pub written: Option<mpsc::UnboundedSender<WorkKey>>,
    /// The cluster of each full report once it is folded in (a recovering hub waits for them).
    pub full_reports: Option<mpsc::UnboundedSender<String>>,
    /// Parallel status writes.
    pub write_concurrency: usize,
    /// Hands each binding's new items to the binder before they are written, and holds the
    /// write while the binder decides on them ([`crate::status::handoff`]).
    pub handoff: Option<Arc<crate::status::handoff::Handoff>>,
}

/// The processor's metrics.
#[derive(Clone)]
pub struct ProcessorMetrics {
    pub items: prometheus::IntCounterVec,
    pub batch_seconds: prometheus::Histogram,
    pub status_writes: prometheus::IntCounterVec,
    pub health_transitions: prometheus::IntCounterVec,
    /// `{customization, operation}`: seconds spent in each customization's scripts.
    pub interpreter_seconds: prometheus::CounterVec,
    /// `{customization, operation, result}` (ok, error, timeout).
    pub interpreter_evaluations: prometheus::IntCounterVec,
    /// Items whose interpretation was folded in after their batch (slow lanes).
    pub deferred: prometheus::IntCounter,
    /// Objects re-interpreted because their kind's customizations changed.
    pub reinterpretations: prometheus::IntCounter,
    /// InterpreterError Events not posted for the rate limit.
    pub events_dropped: prometheus::IntCounter,
}

/// Shared between the processing thread and the writer.
pub type SharedState = Arc<Mutex<StatusState>>;

/// A finished interpretation job: of an item of batch `batch` (by index), or a re-evaluation
/// (`batch: None`).
#[derive(Debug)]
pub struct Done {
    batch: Option<u64>,
    index: usize,
    late: Late,
}

/// The processor's engine: folds batches in with their interpretations done on the lanes'
/// threads ([`crate::interpreters::lanes`]), without waiting for the slow ones (they are folded in when they
/// come, [`Engine::late`]), and re-interprets what a change of customizations affects. IO-free
/// but for the threads; [`run`] drives it.
pub struct Engine {
    state: SharedState,
    pool: Arc<Pool>,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    batches: u64,
    /// The layering the state's cached interpretations were last reconciled with.
    known: Arc<Interpreters>,
    slow_after: Duration,
    epoch: Instant,
}

/// What the processor loop waits for.
enum Wake {
    Batch(Option<crate::status::intake::Submission>),
    Done(Box<Done>),
    Changed,
}

/// Where what the processor folded in goes.
struct Outputs {
    metrics: ProcessorMetrics,
    transitions: Option<mpsc::UnboundedSender<HealthTransition>>,
    dirty: mpsc::UnboundedSender<WorkKey>,
    notices: mpsc::UnboundedSender<FailureNotice>,
    handoff: Option<Arc<crate::status::handoff::Handoff>>,
}

#[cfg(test)]
mod tests;
