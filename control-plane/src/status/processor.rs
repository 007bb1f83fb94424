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

use crate::interpreters::lanes::{LaneKey, Pool, Priority};
use crate::interpreters::{Evaluated, Failure, InterpreterHandle, Interpreters, Kind};
use crate::status::aggregate::{self as status, HealthVerdict, Observation};
use crate::status::intake::{StatusBatch, StatusReceiver};
use crate::work::store::WorkStore;

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

/// A script that failed on a binding's object in one cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureNotice {
    pub key: WorkKey,
    pub binding_uid: String,
    pub cluster: String,
    pub failure: Failure,
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

impl Fingerprint {
    /// The fingerprint of `observed` under `interpreters`.
    pub fn of(observed: &ObservedObject, interpreters: &Interpreters) -> Fingerprint {
        // Two independently seeded hashers, shared by every thread of the process.
        static SEEDS: OnceLock<(
            foldhash::quality::RandomState,
            foldhash::quality::RandomState,
        )> = OnceLock::new();
        let (s1, s2) = SEEDS.get_or_init(Default::default);
        let text = observed.json().as_bytes();
        Fingerprint {
            generation: interpreters.generation(),
            object: (u128::from(s1.hash_one(text)) << 64) | u128::from(s2.hash_one(text)),
        }
    }
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

impl Interpreted {
    /// Runs InterpretHealth and ReflectStatus on `observed` (whose fingerprint is `fingerprint`).
    /// The object is parsed here, on the interpreting thread, and freed there.
    pub fn run(
        observed: &ObservedObject,
        fingerprint: Fingerprint,
        interpreters: &Interpreters,
    ) -> Interpreted {
        match observed.to_value() {
            Ok(object) => {
                let mut interpreted = interpret(interpreters, &object);
                interpreted.fingerprint = fingerprint;
                interpreted
            }
            // The API took it as JSON, so this is not expected; the item says why if it happens.
            Err(e) => Interpreted {
                fingerprint,
                verdict: HealthVerdict::Failed(format!(
                    "the observed object cannot be parsed: {e}"
                )),
                reflected: None,
                kind: None,
                failures: Vec::new(),
                costs: Vec::new(),
            },
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

/// Fewest items per thread worth a thread of its own.
const MIN_ITEMS_PER_THREAD: usize = 32;

/// How many of up to `threads` threads `items` items are worth.
fn threads_for(items: usize, threads: usize) -> usize {
    threads.min(items / MIN_ITEMS_PER_THREAD).max(1)
}

/// `one` of every element of `items`, in order, computed on up to `threads` threads (the calling
/// one included). Pure CPU work over shared read-only input. The elements of a chunk whose
/// thread panicked are `None` (the caller does them itself or goes without).
fn map_in_parallel<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    one: impl Fn(&T) -> Option<R> + Sync,
) -> Vec<Option<R>> {
    let threads = threads_for(items.len(), threads);
    if threads == 1 {
        return items.iter().map(one).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let one = &one;
    std::thread::scope(|scope| {
        let mut chunks = items.chunks(chunk);
        let first = chunks.next().unwrap_or_default();
        let others: Vec<_> = chunks
            .map(|c| {
                (
                    c.len(),
                    scope.spawn(move || c.iter().map(one).collect::<Vec<_>>()),
                )
            })
            .collect();
        let mut all: Vec<Option<R>> = first.iter().map(one).collect();
        for (len, handle) in others {
            match handle.join() {
                Ok(results) => all.extend(results),
                Err(_) => {
                    tracing::error!("a status processing thread panicked");
                    all.extend(std::iter::repeat_with(|| None).take(len));
                }
            }
        }
        all
    })
}

/// Frees `values` on up to `threads` threads (the calling one included): a status is a tree of
/// small allocations, and a batch replaces hundreds of them.
pub fn free_in_parallel<T: Send>(mut values: Vec<T>, threads: usize) {
    let threads = threads_for(values.len(), threads);
    if threads == 1 {
        return;
    }
    let chunk = values.len().div_ceil(threads);
    let mut parts = Vec::with_capacity(threads - 1);
    while values.len() > chunk {
        parts.push(values.split_off(values.len() - chunk));
    }
    std::thread::scope(|scope| {
        for part in parts {
            scope.spawn(move || drop(part));
        }
        drop(values);
    });
}

/// Interprets the items of `batch` at `misses` (index and fingerprint, from
/// [`StatusState::misses`]) on up to `threads` threads (the calling one included). Each item's
/// result is its own, so the fold that follows keeps the batch's order whatever thread
/// interpreted what; an item missing here (its thread panicked) is interpreted by the fold.
pub fn interpret_items(
    batch: &StatusBatch,
    misses: &[(usize, Fingerprint)],
    interpreters: &Interpreters,
    threads: usize,
) -> HashMap<usize, Fresh> {
    map_in_parallel(misses, threads, |(i, print)| {
        let observed = batch.report.items.get(*i)?.observed.as_ref()?;
        Some((
            *i,
            Fresh::new(Interpreted::run(observed, *print, interpreters)),
        ))
    })
    .into_iter()
    .flatten()
    .collect()
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

impl StatusState {
    /// Folds a batch in. `binding` finds the binding of a key (the processor seeds a binding it
    /// has not seen yet from the binding's own status, so timers survive a hub restart).
    /// [`run`] does the same in steps, interpreting outside the state's lock.
    pub fn process(
        &mut self,
        batch: &StatusBatch,
        work: &WorkStore,
        binding: impl Fn(&WorkKey) -> Option<Arc<ResourceBinding>>,
        interpreters: &Interpreters,
        now: &Time,
    ) -> Processed {
        let prints = fingerprints(batch, interpreters);
        let misses = self.misses(batch, &prints);
        let fresh = interpret_items(batch, &misses, interpreters, interpret_threads());
        self.fold(
            batch,
            work,
            binding,
            interpreters,
            &prints,
            fresh,
            &HashSet::new(),
            now,
        )
    }

    /// The items of `batch` (index and fingerprint) whose observed object is not the one last
    /// interpreted for that binding and cluster, nor one whose interpretation is on its way
    /// (`prints` from [`fingerprints`]).
    pub fn misses(
        &self,
        batch: &StatusBatch,
        prints: &[Option<Fingerprint>],
    ) -> Vec<(usize, Fingerprint)> {
        batch
            .report
            .items
            .iter()
            .zip(prints)
            .enumerate()
            .filter_map(|(i, (report, print))| {
                let print = (*print)?;
                let tracked = self
                    .bindings
                    .get(&report.key)
                    .filter(|t| t.uid == report.binding_uid);
                let known = tracked.is_some_and(|t| {
                    t.interpreted
                        .get(&batch.cluster)
                        .is_some_and(|c| c.fingerprint == print)
                        || t.pending.get(&batch.cluster) == Some(&print)
                });
                (!known).then_some((i, print))
            })
            .collect()
    }

    /// Folds a batch in, in order, with `fresh` interpretations of (some of) its items by index;
    /// an item with neither a fresh nor a cached interpretation is interpreted here, except the
    /// `deferred` ones (their interpretation is on its way: [`StatusState::fold_late`]).
    #[allow(clippy::too_many_arguments)]
    pub fn fold(
        &mut self,
        batch: &StatusBatch,
        work: &WorkStore,
        binding: impl Fn(&WorkKey) -> Option<Arc<ResourceBinding>>,
        interpreters: &Interpreters,
        prints: &[Option<Fingerprint>],
        mut fresh: HashMap<usize, Fresh>,
        deferred: &HashSet<usize>,
        now: &Time,
    ) -> Processed {
        let mut processed = Processed::default();
        let mut dirty = HashSet::new();
        for (i, report) in batch.report.items.iter().enumerate() {
            let interpretation = Interpretation {
                print: prints.get(i).copied().flatten(),
                fresh: fresh.remove(&i),
                deferred: deferred.contains(&i),
                interpreters,
            };
            match self.take(
                &batch.cluster,
                batch.gone_confirmed_by,
                report,
                work,
                &binding,
                interpretation,
                now,
                &mut processed,
            ) {
                Ok(update) => {
                    processed.response.accepted += 1;
                    if let Some(transition) = update {
                        dirty.insert(report.key.clone());
                        if let Some(t) = transition {
                            processed.transitions.push(t);
                        }
                    }
                }
                Err(reason) => processed.response.rejected.push(RejectedItem {
                    key: report.key.clone(),
                    reason,
                }),
            }
        }
        processed.dirty = dirty.into_iter().collect();
        processed.dirty.sort();
        processed
    }

    /// Folds in an interpretation that came after its report was taken (a deferred item, or a
    /// re-evaluation after the customizations changed), if it is still the one awaited for
    /// that binding and cluster; the cluster's item is made from the last report as if it came
    /// now.
    pub fn fold_late(&mut self, late: Late, now: &Time, out: &mut Processed) {
        let Some(tracked) = self
            .bindings
            .get_mut(&late.key)
            .filter(|t| t.uid == late.binding_uid)
        else {
            out.costs.extend(late.fresh.interpreted.costs);
            return;
        };
        out.costs
            .extend(late.fresh.interpreted.costs.iter().cloned());
        let print = late.fresh.interpreted.fingerprint;
        if tracked.pending.get(&late.cluster) != Some(&print) {
            return; // a newer report, or a newer layering, made another one
        }
        let Some(report) = tracked.observed.remove(&late.cluster) else {
            return;
        };
        tracked.pending.remove(&late.cluster);
        let Fresh {
            interpreted,
            item_status,
        } = late.fresh;
        notice_failures(&mut out.failures, &report, &late.cluster, &interpreted);
        let verdict = interpreted.verdict.clone();
        if let Some(old) = tracked
            .interpreted
            .insert(late.cluster.clone(), interpreted)
        {
            out.displaced.extend(old.reflected);
        }
        let update = status::next_item(
            tracked.items.get(&late.cluster),
            Observation {
                cluster: &late.cluster,
                report: &report,
                verdict,
                reflected: item_status,
            },
            now,
        );
        let changed = tracked.record(&late.cluster, &report, update, now, &mut out.displaced);
        tracked.observed.insert(late.cluster.clone(), report);
        if let Some(transition) = changed {
            if !out.dirty.contains(&late.key) {
                out.dirty.push(late.key.clone());
            }
            out.transitions.extend(transition);
        }
    }

    /// After the customizations changed from generation `previous` to `current`: the cached
    /// interpretations of kinds not in `changed` hold under `current` too (their fingerprints
    /// take its generation); the last objects of the kinds in `changed` are to be interpreted
    /// again, now (returned, and awaited as pending).
    pub fn reinterpretations(
        &mut self,
        previous: u64,
        current: &Interpreters,
        changed: &HashSet<LaneKey>,
    ) -> Vec<Reinterpretation> {
        let mut jobs = Vec::new();
        for (key, tracked) in &mut self.bindings {
            for (cluster, report) in &tracked.observed {
                let Some(observed) = &report.observed else {
                    continue;
                };
                let entry = tracked.interpreted.get_mut(cluster);
                let kind = entry
                    .as_ref()
                    .and_then(|e| e.kind.clone())
                    .unwrap_or_else(|| lane_of(observed));
                if !changed.contains(&kind) {
                    if let Some(entry) = entry
                        && entry.fingerprint.generation == previous
                    {
                        entry.fingerprint.generation = current.generation();
                    }
                    continue;
                }
                let print = Fingerprint::of(observed, current);
                tracked.pending.insert(cluster.clone(), print);
                jobs.push(Reinterpretation {
                    key: key.clone(),
                    binding_uid: tracked.uid.clone(),
                    cluster: cluster.clone(),
                    observed: observed.clone(),
                    print,
                    lane: kind,
                });
            }
        }
        jobs
    }

    /// `Ok(None)`: taken, nothing changed; `Ok(Some(t))`: changed, with a health transition
    /// if any; `Err(why)`: refused. What it replaces goes to `displaced`.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn take(
        &mut self,
        cluster: &str,
        gone_confirmed_by: GoneConfirmedBy,
        report: &WorkStatus,
        work: &WorkStore,
        binding: &impl Fn(&WorkKey) -> Option<Arc<ResourceBinding>>,
        interpretation: Interpretation<'_>,
        now: &Time,
        out: &mut Processed,
    ) -> Result<Option<Option<HealthTransition>>, String> {
        let displaced = &mut out.displaced;
        check_assignment(cluster, report, work)?;
        if self
            .bindings
            .get(&report.key)
            .is_none_or(|t| t.uid != report.binding_uid)
        {
            let mut tracked = Tracked {
                uid: report.binding_uid.clone(),
                ..Default::default()
            };
            if let Some(b) = binding(&report.key)
                && b.metadata.uid.as_deref() == Some(report.binding_uid.as_str())
                && let Some(status) = &b.status
            {
                for item in &status.aggregated_status {
                    tracked
                        .items
                        .insert(item.cluster_name.clone(), item.clone());
                }
            }
            self.bindings.insert(report.key.clone(), tracked);
        }
        let Some(tracked) = self.bindings.get_mut(&report.key) else {
            return Err("internal: binding not tracked".into());
        };
        if let Some(last) = tracked.last_report.get(cluster) {
            if report.observed_at.0 < last.0 {
                return Err(format!(
                    "stale: observed at {} but a report observed at {} was already taken",
                    report.observed_at.0, last.0
                ));
            }
            // The same report again (a retried or replayed request): nothing new. A gone
            // report is the copy's last word, taken even in the second of the last report (an
            // agent sees a copy gone a few tenths of a second after its last status, and a
            // `Directly` failover waits for it); taken twice, it changes nothing.
            if report.observed_at.0 == last.0 && !report.gone {
                return Ok(None);
            }
        }
        if report.gone {
            tracked.interpreted.remove(cluster);
            tracked.observed.remove(cluster);
            tracked.pending.remove(cluster);
            let update =
                status::gone_item(tracked.items.get(cluster), cluster, gone_confirmed_by, now);
            return Ok(tracked.record(cluster, report, update, now, displaced));
        }
        let (verdict, reflected) = match &report.observed {
            Some(observed) => {
                let interpreters = interpretation.interpreters;
                let print = interpretation
                    .print
                    .unwrap_or_else(|| Fingerprint::of(observed, interpreters));
                remember(&mut tracked.observed, cluster, report);
                match tracked.interpreted.get(cluster) {
                    Some(cached) if cached.fingerprint == print => {
                        tracked.pending.remove(cluster);
                        (cached.verdict.clone(), cached.reflected.clone())
                    }
                    _ if interpretation.deferred
                        || (interpretation.fresh.is_none()
                            && tracked.pending.get(cluster) == Some(&print)) =>
                    {
                        // Its interpretation is on its way: the item waits for it.
                        tracked.pending.insert(cluster.to_string(), print);
                        tracked
                            .last_report
                            .insert(cluster.to_string(), report.observed_at.clone());
                        return Ok(None);
                    }
                    _ => {
                        tracked.pending.remove(cluster);
                        let fresh = interpretation
                            .fresh
                            .filter(|f| f.interpreted.fingerprint == print)
                            .unwrap_or_else(|| {
                                Fresh::new(Interpreted::run(observed, print, interpreters))
                            });
                        notice_failures(&mut out.failures, report, cluster, &fresh.interpreted);
                        out.costs.extend(fresh.interpreted.costs.iter().cloned());
                        let verdict = fresh.interpreted.verdict.clone();
                        if let Some(old) = tracked
                            .interpreted
                            .insert(cluster.to_string(), fresh.interpreted)
                        {
                            displaced.extend(old.reflected);
                        }
                        (verdict, fresh.item_status)
                    }
                }
            }
            None => {
                tracked.interpreted.remove(cluster);
                tracked.observed.remove(cluster);
                tracked.pending.remove(cluster);
                (HealthVerdict::NoRule, None)
            }
        };
        let update = status::next_item(
            tracked.items.get(cluster),
            Observation {
                cluster,
                report,
                verdict,
                reflected,
            },
            now,
        );
        Ok(tracked.record(cluster, report, update, now, displaced))
    }

    /// The items of a binding, by cluster name.
    pub fn items(&self, key: &WorkKey) -> Vec<AggregatedStatusItem> {
        self.bindings
            .get(key)
            .map(|t| t.items.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether this state holds per-cluster items of `binding` that the binding's status (as
    /// the caller's copy shows it) does not have yet: a write on its way, or a write the
    /// caller's cache has not seen. Only the clusters the status is written for count.
    pub fn ahead_of(&self, binding: &ResourceBinding) -> bool {
        let key = crate::work::dispatch::work_key(binding);
        let Some(tracked) = self
            .bindings
            .get(&key)
            .filter(|t| Some(t.uid.as_str()) == binding.metadata.uid.as_deref())
        else {
            return false;
        };
        let current = binding
            .status
            .as_ref()
            .map(|s| s.aggregated_status.as_slice())
            .unwrap_or_default();
        written_for(binding).into_iter().any(|cluster| {
            tracked.items.get(cluster).is_some_and(|mine| {
                current
                    .iter()
                    .find(|i| i.cluster_name == cluster)
                    .is_none_or(|theirs| {
                        !same_as_written(std::slice::from_ref(theirs), std::slice::from_ref(mine))
                    })
            })
        })
    }

    /// The per-cluster items of `binding` as decisions must see them: the binding's own, with
    /// this state's newer ones in their place (`None`: the binding shows them all already).
    /// The binder decides on these at once ([`crate::status::handoff`]) instead of waiting for the
    /// status write to come back through the binding watch.
    pub fn newest_items(&self, binding: &ResourceBinding) -> Option<Vec<AggregatedStatusItem>> {
        if !self.ahead_of(binding) {
            return None;
        }
        let tracked = self
            .bindings
            .get(&crate::work::dispatch::work_key(binding))?;
        let mut items: Vec<AggregatedStatusItem> = binding
            .status
            .as_ref()
            .map(|s| s.aggregated_status.clone())
            .unwrap_or_default();
        for cluster in written_for(binding) {
            let Some(mine) = tracked.items.get(cluster) else {
                continue;
            };
            match items.iter_mut().find(|i| i.cluster_name == cluster) {
                Some(theirs) => *theirs = mine.clone(),
                None => items.push(mine.clone()),
            }
        }
        Some(items)
    }

    /// Whether an interpretation of `key` in some cluster is on its way.
    pub fn pending(&self, key: &WorkKey) -> bool {
        self.bindings
            .get(key)
            .is_some_and(|t| !t.pending.is_empty())
    }

    /// The UID the state of `key` belongs to.
    pub fn uid(&self, key: &WorkKey) -> Option<&str> {
        self.bindings.get(key).map(|t| t.uid.as_str())
    }

    /// Drops a binding (deleted, or re-created with another UID).
    pub fn forget(&mut self, key: &WorkKey) {
        self.bindings.remove(key);
    }

    /// How many bindings are tracked.
    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }
}

/// Whether `report` may be taken from `cluster`: a copy's report needs its work assigned to the
/// cluster under the same binding UID; a gone report needs the hub to await that copy's purge
/// there (the work withdrawn from that cluster, under that binding UID). `Err` says why not.
pub fn check_assignment(
    cluster: &str,
    report: &WorkStatus,
    work: &WorkStore,
) -> Result<(), String> {
    if report.gone {
        let awaited = work.awaited_purge(cluster, &report.key).ok_or_else(|| {
            format!(
                "gone: {} was not withdrawn from cluster {cluster} awaiting its purge",
                report.key
            )
        })?;
        if awaited != report.binding_uid {
            return Err(format!(
                "gone: binding UID {} is not the one withdrawn from cluster {cluster} ({awaited})",
                report.binding_uid
            ));
        }
        return Ok(());
    }
    let assigned = work
        .get(cluster, &report.key)
        .ok_or_else(|| format!("{} is not assigned to cluster {cluster}", report.key))?;
    if assigned.binding_uid != report.binding_uid {
        return Err(format!(
            "binding UID {} is not the one assigned to cluster {cluster} ({})",
            report.binding_uid, assigned.binding_uid
        ));
    }
    Ok(())
}

/// The fingerprints of a batch's observed objects, by index (`None`: no object). One thread:
/// hashing the objects' text costs less than starting another.
pub fn fingerprints(batch: &StatusBatch, interpreters: &Interpreters) -> Vec<Option<Fingerprint>> {
    batch
        .report
        .items
        .iter()
        .map(|r| {
            r.observed
                .as_ref()
                .map(|o| Fingerprint::of(o, interpreters))
        })
        .collect()
}

/// How [`StatusState::take`] gets an item's interpretation.
struct Interpretation<'a> {
    print: Option<Fingerprint>,
    fresh: Option<Fresh>,
    /// Interpreted off the batch: the item waits for it.
    deferred: bool,
    interpreters: &'a Interpreters,
}

/// Keeps `report` as the cluster's last report with an object: its object is copied only when
/// it is not the one kept already (most reports repeat it).
fn remember(observed: &mut HashMap<String, WorkStatus>, cluster: &str, report: &WorkStatus) {
    match observed.get_mut(cluster) {
        Some(kept)
            if kept.observed.as_ref().map(ObservedObject::json)
                == report.observed.as_ref().map(ObservedObject::json) =>
        {
            kept.revision = report.revision;
            kept.applied = report.applied;
            kept.applied_message.clone_from(&report.applied_message);
            kept.observed_at = report.observed_at.clone();
            kept.reset_generation = report.reset_generation;
            kept.fenced = report.fenced;
        }
        _ => {
            observed.insert(cluster.to_string(), report.clone());
        }
    }
}

/// The failures of a fresh interpretation, for the binding's Events.
fn notice_failures(
    out: &mut Vec<FailureNotice>,
    report: &WorkStatus,
    cluster: &str,
    interpreted: &Interpreted,
) {
    out.extend(interpreted.failures.iter().map(|failure| FailureNotice {
        key: report.key.clone(),
        binding_uid: report.binding_uid.clone(),
        cluster: cluster.to_string(),
        failure: failure.clone(),
    }));
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

/// Health and reflected status of an observed object. A kind without a ReflectStatus rule
/// reflects its whole `status`, as Karmada's fallback does. The fingerprint is the caller's to
/// set.
fn interpret(interpreters: &Interpreters, observed: &serde_json::Value) -> Interpreted {
    let mut failures = Vec::new();
    let mut costs = Vec::new();
    let health = interpreters.evaluate_health(observed);
    costs.push(cost_of(&health, Operation::InterpretHealth));
    let verdict = match health.result {
        Ok(None) => HealthVerdict::NoRule,
        Ok(Some(health)) => HealthVerdict::Judged {
            health: match health.state {
                HealthState::Healthy => ResourceHealth::Healthy,
                HealthState::Unhealthy => ResourceHealth::Unhealthy,
                HealthState::Unknown => ResourceHealth::Unknown,
            },
            reason: health.reason,
            class: health.class,
        },
        Err(failure) => {
            let verdict = HealthVerdict::Failed(failure.message.clone());
            failures.push(failure);
            verdict
        }
    };
    let status = interpreters.evaluate_status(observed);
    costs.push(cost_of(&status, Operation::InterpretStatus));
    let reflected = match status.result {
        Ok(Some(status)) => Some(status),
        Ok(None) => observed.get("status").cloned(),
        Err(failure) => {
            tracing::debug!(error = %failure.message, "ReflectStatus failed; reflecting nothing");
            failures.push(failure);
            None
        }
    };
    Interpreted {
        fingerprint: Fingerprint {
            generation: interpreters.generation(),
            object: 0,
        },
        verdict,
        reflected,
        kind: kind_of_value(observed),
        failures,
        costs,
    }
}

/// What an operation cost, for the metrics.
fn cost_of<T>(evaluated: &Evaluated<T>, operation: Operation) -> Cost {
    let outcome = match &evaluated.result {
        Ok(_) => Outcome::Ok,
        Err(f) if matches!(f.limit, Some(Limit::WallClock | Limit::Instructions)) => {
            Outcome::Timeout
        }
        Err(_) => Outcome::Error,
    };
    Cost {
        customization: evaluated.customization.clone(),
        operation,
        seconds: evaluated.seconds,
        outcome,
    }
}

/// `apiVersion/kind` of an object.
fn kind_of_value(object: &serde_json::Value) -> Option<LaneKey> {
    let field = |name: &str| object.get(name).and_then(serde_json::Value::as_str);
    Some(Arc::from(format!(
        "{}/{}",
        field("apiVersion")?,
        field("kind")?
    )))
}

/// The lane of an observed object: its kind, read from the text without building the object.
fn lane_of(observed: &ObservedObject) -> LaneKey {
    #[derive(serde::Deserialize)]
    struct Kinded<'a> {
        #[serde(rename = "apiVersion", borrow, default)]
        api_version: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default)]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    match serde_json::from_str::<Kinded<'_>>(observed.json()) {
        Ok(k) => Arc::from(format!(
            "{}/{}",
            k.api_version.as_deref().unwrap_or(""),
            k.kind.as_deref().unwrap_or("")
        )),
        Err(_) => Arc::from("/"),
    }
}

fn lane_of_kind(kind: &Kind) -> LaneKey {
    Arc::from(format!("{}/{}", kind.0, kind.1))
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

impl ProcessorMetrics {
    pub fn new(registry: &prometheus::Registry) -> Result<ProcessorMetrics, prometheus::Error> {
        let items = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_status_items_processed_total",
                "Status items reported by agents, by result (accepted, rejected)",
            ),
            &["result"],
        )?;
        let batch_seconds = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "lifeboat_hub_status_batch_duration_seconds",
                "Time to interpret and fold one batch of status reports",
            )
            .buckets(vec![
                0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ]),
        )?;
        let status_writes = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_binding_status_writes_total",
                "Binding status writes by result",
            ),
            &["result"],
        )?;
        let health_transitions = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_health_transitions_total",
                "Per-cluster health changes of bindings, by new health",
            ),
            &["health"],
        )?;
        let interpreter_seconds = prometheus::CounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_interpreter_seconds_total",
                "Seconds spent interpreting agents' reports, by customization ((builtin) for the \
                 built-in interpreters) and operation",
            ),
            &["customization", "operation"],
        )?;
        let interpreter_evaluations = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_interpreter_evaluations_total",
                "Script evaluations on agents' reports, by customization, operation and result \
                 (ok, error, timeout: stopped by the wall clock or the instruction budget)",
            ),
            &["customization", "operation", "result"],
        )?;
        let deferred = prometheus::IntCounter::new(
            "lifeboat_hub_interpretations_deferred_total",
            "Status items whose interpretation was slow or waited in a slow lane, folded in \
             after their batch",
        )?;
        let reinterpretations = prometheus::IntCounter::new(
            "lifeboat_hub_reinterpretations_total",
            "Last observed objects interpreted again because their kind's customizations changed",
        )?;
        let events_dropped = prometheus::IntCounter::new(
            "lifeboat_hub_interpreter_events_dropped_total",
            "InterpreterError Events not posted for the rate limit",
        )?;
        registry.register(Box::new(items.clone()))?;
        registry.register(Box::new(batch_seconds.clone()))?;
        registry.register(Box::new(status_writes.clone()))?;
        registry.register(Box::new(health_transitions.clone()))?;
        registry.register(Box::new(interpreter_seconds.clone()))?;
        registry.register(Box::new(interpreter_evaluations.clone()))?;
        registry.register(Box::new(deferred.clone()))?;
        registry.register(Box::new(reinterpretations.clone()))?;
        registry.register(Box::new(events_dropped.clone()))?;
        Ok(ProcessorMetrics {
            items,
            batch_seconds,
            status_writes,
            health_transitions,
            interpreter_seconds,
            interpreter_evaluations,
            deferred,
            reinterpretations,
            events_dropped,
        })
    }
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

impl Engine {
    pub fn new(
        state: SharedState,
        pool: Arc<Pool>,
        known: Arc<Interpreters>,
        slow_after: Duration,
    ) -> Engine {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Engine {
            state,
            pool,
            done_tx,
            done_rx,
            batches: 0,
            known,
            slow_after,
            epoch: Instant::now(),
        }
    }

    pub fn state(&self) -> &SharedState {
        &self.state
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StatusState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Folds `batch` in. Its items that need interpreting are jobs in their kind's lane; the
    /// batch waits for them, except for a job that has run `slow_after` or waits in a lane that
    /// is not trusted: that item is folded in when its interpretation comes. Interpretations of
    /// earlier batches that come meanwhile are folded in too.
    pub async fn batch(
        &mut self,
        batch: Arc<StatusBatch>,
        work: &WorkStore,
        binding: impl Fn(&WorkKey) -> Option<Arc<ResourceBinding>>,
        interpreters: &Arc<Interpreters>,
        now: &Time,
    ) -> Processed {
        let prints = fingerprints(&batch, interpreters);
        let misses = self.lock().misses(&batch, &prints);
        let id = self.batches;
        self.batches += 1;
        let mut waiting: HashMap<usize, (LaneKey, Arc<AtomicU64>)> = HashMap::new();
        for (i, print) in misses {
            let Some(observed) = batch.report.items.get(i).and_then(|r| r.observed.as_ref()) else {
                continue;
            };
            let lane = lane_of(observed);
            // When the job started (nanoseconds after the epoch, plus one); 0: not yet.
            let started = Arc::new(AtomicU64::new(0));
            let (batch, interpreters, tx, epoch) = (
                batch.clone(),
                interpreters.clone(),
                self.done_tx.clone(),
                self.epoch,
            );
            let job_started = started.clone();
            let vouched = !interpreters.customizes(&lane);
            self.pool
                .submit(lane.clone(), Priority::Live, vouched, move || {
                    job_started.store(nanos_since(epoch) + 1, AtomicOrdering::Relaxed);
                    let Some(item) = batch.report.items.get(i) else {
                        return;
                    };
                    let Some(observed) = &item.observed else {
                        return;
                    };
                    let fresh = Fresh::new(Interpreted::run(observed, print, &interpreters));
                    let _ = tx.send(Done {
                        batch: Some(id),
                        index: i,
                        late: Late {
                            key: item.key.clone(),
                            binding_uid: item.binding_uid.clone(),
                            cluster: batch.cluster.clone(),
                            fresh,
                        },
                    });
                });
            waiting.insert(i, (lane, started));
        }
        let mut fresh = HashMap::new();
        let mut late = Vec::new();
        let mut deferred = HashSet::new();
        let slow_nanos = self.slow_after.as_nanos() as u64;
        // Stuck jobs are looked for now and then, not at every result (a batch has hundreds).
        let check_every = self.slow_after / 4;
        let mut next_check = Instant::now() + check_every;
        while !waiting.is_empty() {
            tokio::select! {
                done = self.done_rx.recv() => match done {
                    Some(done) if done.batch == Some(id) && waiting.remove(&done.index).is_some() => {
                        fresh.insert(done.index, done.late.fresh);
                    }
                    Some(done) => late.push(done),
                    None => break,
                },
                _ = tokio::time::sleep_until(next_check.into()) => {}
            }
            if Instant::now() < next_check {
                continue;
            }
            next_check = Instant::now() + check_every;
            let now_nanos = nanos_since(self.epoch) + 1;
            let pool = &self.pool;
            let mut slow_lanes: HashMap<LaneKey, bool> = HashMap::new();
            waiting.retain(|i, (lane, started)| {
                let started = started.load(AtomicOrdering::Relaxed);
                let stuck = if started == 0 {
                    *slow_lanes
                        .entry(lane.clone())
                        .or_insert_with(|| pool.is_slow(lane))
                } else {
                    now_nanos.saturating_sub(started) >= slow_nanos
                };
                if stuck {
                    deferred.insert(*i);
                }
                !stuck
            });
        }
        let mut state = self.lock();
        let mut processed = state.fold(
            &batch,
            work,
            binding,
            interpreters,
            &prints,
            fresh,
            &deferred,
            now,
        );
        processed.deferred = deferred.len();
        processed.late = late.len();
        processed.reevaluated = late.iter().filter(|d| d.batch.is_none()).count();
        for done in late {
            state.fold_late(done.late, now, &mut processed);
        }
        processed
    }

    /// Folds in `first` and every other interpretation that has come.
    pub fn late(&mut self, first: Done, now: &Time) -> Processed {
        let mut processed = Processed::default();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = Some(first);
        while let Some(done) = next {
            processed.late += 1;
            processed.reevaluated += usize::from(done.batch.is_none());
            state.fold_late(done.late, now, &mut processed);
            next = self.done_rx.try_recv().ok();
        }
        processed.dirty.sort();
        processed
    }

    /// The customizations changed to `current`: the last object of every binding and cluster
    /// whose kind's customizations changed is interpreted again, in the background (after the
    /// live reports of every lane). Returns how many.
    pub fn interpreters_changed(&mut self, current: Arc<Interpreters>) -> usize {
        let changed: HashSet<LaneKey> = current
            .changed_kinds(&self.known)
            .iter()
            .map(lane_of_kind)
            .collect();
        for lane in &changed {
            self.pool.forget(lane);
        }
        let jobs = self
            .lock()
            .reinterpretations(self.known.generation(), &current, &changed);
        let count = jobs.len();
        for job in jobs {
            let (interpreters, tx) = (current.clone(), self.done_tx.clone());
            let lane = job.lane.clone();
            let vouched = !current.customizes(&lane);
            self.pool
                .submit(lane, Priority::Background, vouched, move || {
                    let fresh =
                        Fresh::new(Interpreted::run(&job.observed, job.print, &interpreters));
                    let _ = tx.send(Done {
                        batch: None,
                        index: 0,
                        late: Late {
                            key: job.key,
                            binding_uid: job.binding_uid,
                            cluster: job.cluster,
                            fresh,
                        },
                    });
                });
        }
        self.known = current;
        count
    }

    /// The next interpretation that comes (for [`Engine::late`]).
    pub async fn next_done(&mut self) -> Option<Done> {
        self.done_rx.recv().await
    }
}

fn nanos_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
}

/// What the processor loop waits for.
enum Wake {
    Batch(Option<crate::status::intake::Submission>),
    Done(Box<Done>),
    Changed,
}

/// Runs the processor until the intake closes: a thread folds batches in (with the
/// interpretations done on the lanes' threads), a task writes the dirty bindings, another posts
/// the interpreter failures as Events. Returns the shared state (for tests and the template
/// aggregation).
pub fn run(mut intake: StatusReceiver, deps: ProcessorDeps) -> SharedState {
    let state: SharedState = Arc::new(Mutex::new(StatusState::default()));
    let (dirty_tx, dirty_rx) = mpsc::unbounded_channel::<WorkKey>();
    let (notices_tx, notices_rx) = mpsc::unbounded_channel::<FailureNotice>();
    let again = dirty_tx.clone();
    let bindings = deps.bindings.clone();
    let work = deps.work.clone();
    let interpreters = deps.interpreters.clone();
    let metrics = deps.metrics.clone();
    let outputs = Outputs {
        metrics: deps.metrics.clone(),
        transitions: deps.transitions.clone(),
        dirty: dirty_tx,
        notices: notices_tx,
        handoff: deps.handoff.clone(),
    };
    let full_reports = deps.full_reports.clone();
    let threads = interpret_threads();
    let mut engine = Engine::new(
        state.clone(),
        Arc::new(Pool::new(threads, crate::interpreters::lanes::SLOW_AFTER)),
        interpreters.current(),
        crate::interpreters::lanes::SLOW_AFTER,
    );
    let spawned = std::thread::Builder::new()
        .name("status-processor".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the status processor's runtime");
                    return;
                }
            };
            runtime.block_on(async move {
                let mut changes = interpreters.subscribe();
                loop {
                    // Reports first: a burst of re-evaluations never holds them back.
                    let wake = tokio::select! {
                        biased;
                        submission = intake.recv() => Wake::Batch(submission),
                        Some(done) = engine.next_done() => Wake::Done(Box::new(done)),
                        Ok(()) = changes.changed() => Wake::Changed,
                    };
                    let now = Time(k8s_openapi::jiff::Timestamp::now());
                    match wake {
                        Wake::Batch(None) => return,
                        Wake::Batch(Some(submission)) => {
                            let started = Instant::now();
                            let current = interpreters.current();
                            let batch = Arc::new(submission.batch);
                            let mut processed = engine
                                .batch(
                                    batch.clone(),
                                    &work,
                                    |key| {
                                        bindings.get(&ObjectRef::new(&key.name).within(&key.namespace))
                                    },
                                    &current,
                                    &now,
                                )
                                .await;
                            metrics
                                .items
                                .with_label_values(&["accepted"])
                                .inc_by(processed.response.accepted as u64);
                            metrics
                                .items
                                .with_label_values(&["rejected"])
                                .inc_by(processed.response.rejected.len() as u64);
                            metrics
                                .batch_seconds
                                .observe(started.elapsed().as_secs_f64());
                            let response = std::mem::take(&mut processed.response);
                            let displaced = outputs.publish(&mut processed);
                            if batch.report.full
                                && let Some(tx) = &full_reports
                            {
                                let _ = tx.send(batch.cluster.clone());
                            }
                            let _ = submission.reply.send(response);
                            free_in_parallel(displaced, threads);
                        }
                        Wake::Done(done) => {
                            let mut processed = engine.late(*done, &now);
                            let displaced = outputs.publish(&mut processed);
                            free_in_parallel(displaced, threads);
                        }
                        Wake::Changed => {
                            let current = interpreters.current();
                            let generation = current.generation();
                            let count = engine.interpreters_changed(current);
                            metrics.reinterpretations.inc_by(count as u64);
                            tracing::info!(
                                generation,
                                objects = count,
                                "customizations changed: re-interpreting the last objects of the kinds they changed"
                            );
                        }
                    }
                }
            });
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the status processor thread");
    }
    tokio::spawn(
        crate::interpreters::events::run(
            deps.client.clone(),
            notices_rx,
            deps.metrics.events_dropped.clone(),
        )
        .in_current_span(),
    );
    tokio::spawn(write_dirty(dirty_rx, again, state.clone(), deps).in_current_span());
    state
}

/// Where what the processor folded in goes.
struct Outputs {
    metrics: ProcessorMetrics,
    transitions: Option<mpsc::UnboundedSender<HealthTransition>>,
    dirty: mpsc::UnboundedSender<WorkKey>,
    notices: mpsc::UnboundedSender<FailureNotice>,
    handoff: Option<Arc<crate::status::handoff::Handoff>>,
}

impl Outputs {
    /// Hands on the transitions, dirty bindings, failures and costs of `processed`; returns
    /// what it displaced, to free.
    fn publish(&self, processed: &mut Processed) -> Vec<serde_json::Value> {
        let metrics = &self.metrics;
        metrics.deferred.inc_by(processed.deferred as u64);
        for cost in processed.costs.drain(..) {
            let labels = [cost.customization.as_str(), cost.operation.name()];
            metrics
                .interpreter_seconds
                .with_label_values(&labels)
                .inc_by(cost.seconds);
            metrics
                .interpreter_evaluations
                .with_label_values(&[labels[0], labels[1], cost.outcome.as_str()])
                .inc();
        }
        for t in processed.transitions.drain(..) {
            tracing::debug!(target: stages::TARGET, stage = stages::HEALTH_DECIDED,
                cluster = %t.cluster, work = %t.key, health = t.to.as_str());
            metrics
                .health_transitions
                .with_label_values(&[t.to.as_str()])
                .inc();
            if let Some(tx) = &self.transitions {
                let _ = tx.send(t);
            }
        }
        for key in processed.dirty.drain(..) {
            // The binder first (it decides on these items now), then the write.
            if let Some(handoff) = &self.handoff {
                handoff.status_changed(&key);
            }
            let _ = self.dirty.send(key);
        }
        for notice in processed.failures.drain(..) {
            let _ = self.notices.send(notice);
        }
        std::mem::take(&mut processed.displaced)
    }
}

/// A failed status write is tried again after this long, this many times (the items stay in
/// the processor's state; without a retry the binding would show them only after the next
/// change, and the binder would wait for them).
const WRITE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
const WRITE_TRIES: u32 = 5;

/// Writes the status of dirty bindings, each at most `write_concurrency` at once; a binding
/// that becomes dirty again while being written is written again after.
async fn write_dirty(
    mut rx: mpsc::UnboundedReceiver<WorkKey>,
    again: mpsc::UnboundedSender<WorkKey>,
    state: SharedState,
    deps: ProcessorDeps,
) {
    let ProcessorDeps {
        client,
        bindings,
        metrics,
        written,
        write_concurrency,
        handoff,
        ..
    } = deps;
    let semaphore = Arc::new(tokio::sync::Semaphore::new(write_concurrency.max(1)));
    let pending: Arc<Mutex<HashSet<WorkKey>>> = Arc::new(Mutex::new(HashSet::new()));
    // Failed writes in a row per binding (cleared by a write that works).
    let failures: Arc<Mutex<HashMap<WorkKey, u32>>> = Arc::new(Mutex::new(HashMap::new()));
    while let Some(key) = rx.recv().await {
        if !pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone())
        {
            continue;
        }
        let (client, bindings, state, pending, metrics, written, failures, again) = (
            client.clone(),
            bindings.clone(),
            state.clone(),
            pending.clone(),
            metrics.clone(),
            written.clone(),
            failures.clone(),
            again.clone(),
        );
        let (semaphore, handoff) = (semaphore.clone(), handoff.clone());
        tokio::spawn(async move {
            // After the binder's decision on these items (its spec write must not race this
            // one), and without a writer's permit meanwhile: a held write blocks no other.
            if let Some(handoff) = &handoff {
                handoff
                    .wait(&key, crate::status::handoff::HOLD_AT_MOST)
                    .await;
            }
            let Ok(permit) = semaphore.acquire_owned().await else {
                return;
            };
            // Taken off the pending set before reading the state: a change that lands during
            // the write marks the binding dirty again.
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
            let result = write_status(&client, &bindings, &state, &key).await;
            let label = match &result {
                Ok(true) => "written",
                Ok(false) => "unchanged",
                Err(_) => "error",
            };
            metrics.status_writes.with_label_values(&[label]).inc();
            let tries = {
                let mut failures = failures.lock().unwrap_or_else(|e| e.into_inner());
                if result.is_ok() {
                    failures.remove(&key);
                    0
                } else {
                    let tries = failures.entry(key.clone()).or_default();
                    *tries += 1;
                    *tries
                }
            };
            drop(permit);
            match result {
                Ok(true) => {
                    if let Some(tx) = &written {
                        let _ = tx.send(key);
                    }
                }
                Ok(false) => {}
                Err(e) if tries < WRITE_TRIES => {
                    tracing::warn!(binding = %key, error = %e, tries, "writing binding status failed; trying again");
                    tokio::time::sleep(WRITE_RETRY * tries).await;
                    let _ = again.send(key);
                }
                Err(e) => {
                    failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&key);
                    tracing::warn!(binding = %key, error = %e, tries, "writing binding status failed; giving up until its next report");
                }
            }
        });
    }
}

/// Applies the binding's items and conditions if they differ from what the binding has.
/// `Ok(false)`: nothing to write (or the binding is gone).
pub async fn write_status(
    client: &kube::Client,
    bindings: &Store<ResourceBinding>,
    state: &SharedState,
    key: &WorkKey,
) -> Result<bool, kube::Error> {
    let Some(binding) = bindings.get(&ObjectRef::new(&key.name).within(&key.namespace)) else {
        return Ok(false);
    };
    let uid = binding.metadata.uid.clone().unwrap_or_default();
    let items = {
        let guard = state.lock().unwrap_or_else(|e| e.into_inner());
        if guard.uid(key) != Some(uid.as_str()) {
            return Ok(false);
        }
        guard.items(key)
    };
    let (patch, changed) =
        status_patch(&binding, items, &Time(k8s_openapi::jiff::Timestamp::now()));
    if !changed {
        return Ok(false);
    }
    let api: Api<ResourceBinding> = Api::namespaced(client.clone(), &key.namespace);
    api.patch_status(
        &key.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await?;
    Ok(true)
}

/// Equal once written: the API keeps times to the second, the processor's state to the
/// microsecond, so items are compared in their written (JSON) form.
fn same_as_written(a: &[AggregatedStatusItem], b: &[AggregatedStatusItem]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x == y || serde_json::to_value(x).ok() == serde_json::to_value(y).ok())
}

/// The clusters whose items a binding's status carries: those it is placed on or being evicted
/// from (old copies still report under Gracefully and Never).
fn written_for(binding: &ResourceBinding) -> HashSet<&str> {
    binding
        .spec
        .clusters
        .iter()
        .map(|c| c.name.as_str())
        .chain(
            binding
                .spec
                .graceful_eviction_tasks
                .iter()
                .map(|t| t.from_cluster.as_str()),
        )
        .collect()
}

/// The status patch for a binding: the items of the clusters it is placed on or being evicted
/// from (old copies still report under Gracefully and Never), and the two conditions; and
/// whether it differs from the binding's current status.
pub fn status_patch(
    binding: &ResourceBinding,
    items: Vec<AggregatedStatusItem>,
    now: &Time,
) -> (serde_json::Value, bool) {
    let wanted = written_for(binding);
    let items: Vec<AggregatedStatusItem> = items
        .into_iter()
        .filter(|i| wanted.contains(i.cluster_name.as_str()))
        .collect();
    let previous = binding
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let conditions = status::conditions(
        &binding.spec.clusters,
        &items,
        previous,
        binding.metadata.generation,
        now,
    );
    let current_items = binding
        .status
        .as_ref()
        .map(|s| s.aggregated_status.as_slice())
        .unwrap_or_default();
    let same_conditions = conditions.iter().all(|c| {
        previous.iter().any(|p| {
            p.type_ == c.type_
                && p.status == c.status
                && p.reason == c.reason
                && p.message == c.message
                && p.observed_generation == c.observed_generation
        })
    });
    let summary = status::summary(&binding.spec.clusters, &items);
    let same_summary = binding.status.as_ref().and_then(|s| s.summary.as_ref()) == Some(&summary);
    let changed = !same_as_written(current_items, &items) || !same_conditions || !same_summary;
    let patch = serde_json::json!({
        "apiVersion": "work.lifeboat.dev/v1alpha1",
        "kind": "ResourceBinding",
        "metadata": {"name": binding.metadata.name, "namespace": binding.metadata.namespace},
        "status": {"aggregatedStatus": items, "conditions": conditions, "summary": summary},
    });
    (patch, changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreters::Interpreters;
    use k8s_openapi::jiff::Timestamp;
    use lifeboat_api::binding::ResourceBindingSpec;
    use lifeboat_api::protocol::{StatusReport, Work};
    use lifeboat_interpreter::{Runtime, RuntimeConfig};
    use serde_json::json;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + second).unwrap())
    }

    #[test]
    fn values_freed_in_parallel_are_all_freed_by_the_time_it_returns() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Counted<'a>(&'a AtomicUsize);
        impl Drop for Counted<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        for (n, threads) in [(0, 2), (10, 2), (1000, 1), (1000, 2), (1001, 3), (5000, 8)] {
            let freed = AtomicUsize::new(0);
            free_in_parallel((0..n).map(|_| Counted(&freed)).collect(), threads);
            assert_eq!(
                freed.load(Ordering::SeqCst),
                n,
                "{n} values on {threads} threads"
            );
        }
    }

    #[test]
    fn work_split_over_threads_comes_back_in_order_and_a_panicked_chunk_as_none() {
        let items: Vec<u32> = (0..1000).collect();
        let serial = map_in_parallel(&items, 1, |i| Some(i * 3));
        for threads in [2, 3, 8] {
            assert_eq!(map_in_parallel(&items, threads, |i| Some(i * 3)), serial);
        }
        // Too few items for a second thread: all on the calling one.
        let few: Vec<u32> = (0..40).collect();
        let caller = std::thread::current().id();
        assert!(
            map_in_parallel(&few, 2, |_| Some(std::thread::current().id()))
                .iter()
                .all(|t| *t == Some(caller))
        );
        // The second half's thread panics: its items are None, the first half is intact.
        let out = map_in_parallel(&items, 2, |i| {
            assert!(*i < 500, "a chunk's thread fails");
            Some(*i)
        });
        assert_eq!(out.len(), 1000);
        assert!(out[..500].iter().zip(0..).all(|(o, i)| *o == Some(i)));
        assert!(out[500..].iter().all(Option::is_none));
    }

    fn key() -> WorkKey {
        WorkKey {
            namespace: "ml".into(),
            name: "train-appwrapper".into(),
        }
    }

    fn interpreters() -> Interpreters {
        let builtin =
            Interpreters::builtin(Arc::new(Runtime::new(RuntimeConfig::default()))).unwrap();
        Interpreters::layered(builtin, &[]).0
    }

    fn store_with_work() -> WorkStore {
        let store = WorkStore::new("e1");
        store.upsert(
            "m1",
            Work {
                key: key(),
                binding_uid: "uid-1".into(),
                manifest: json!({}),
                ..Default::default()
            },
        );
        store
    }

    fn appwrapper(phase: &str, unhealthy: Option<&str>) -> serde_json::Value {
        let mut conditions = vec![
            json!({"type": "PodsReady", "status": if phase == "Running" { "True" } else { "False" },
            "reason": "x", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}),
        ];
        if let Some(msg) = unhealthy {
            conditions.push(
                json!({"type": "Unhealthy", "status": "True", "reason": "FoundFailedPods",
                "message": msg, "lastTransitionTime": "2026-01-01T00:00:00Z"}),
            );
        }
        json!({
            "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": "train", "namespace": "ml", "generation": 1},
            "spec": {"components": []},
            "status": {"phase": phase, "conditions": conditions}
        })
    }

    fn report(second: i64, observed: serde_json::Value) -> WorkStatus {
        WorkStatus {
            key: key(),
            binding_uid: "uid-1".into(),
            revision: 1,
            applied: true,
            applied_message: None,
            observed: Some(ObservedObject::from_value(&observed).unwrap()),
            observed_at: at(second),
            reset_generation: None,
            fenced: false,
            gone: false,
        }
    }

    fn batch(cluster: &str, items: Vec<WorkStatus>) -> StatusBatch {
        StatusBatch::from_agent(cluster.into(), StatusReport { items, full: false })
    }

    #[test]
    fn reports_become_items_and_replays_change_nothing() {
        let work = store_with_work();
        let interp = interpreters();
        let mut state = StatusState::default();
        let none = |_: &WorkKey| None;
        let b = batch("m1", vec![report(1, appwrapper("Running", None))]);
        let p = state.process(&b, &work, none, &interp, &at(100));
        assert_eq!(p.response.accepted, 1);
        assert_eq!(p.dirty, vec![key()]);
        let item = &state.items(&key())[0];
        assert_eq!(item.health, ResourceHealth::Healthy);
        assert_eq!(item.status.as_ref().unwrap()["phase"], "Running");
        // the very same batch again: accepted, nothing dirty
        let p = state.process(&b, &work, none, &interp, &at(101));
        assert_eq!((p.response.accepted, p.dirty.len()), (1, 0));
        // an older report is refused as stale
        let old = batch(
            "m1",
            vec![report(0, appwrapper("Failed", Some("[Infrastructure] x")))],
        );
        let p = state.process(&old, &work, none, &interp, &at(102));
        assert_eq!(p.response.accepted, 0);
        assert!(p.response.rejected[0].reason.starts_with("stale"));
        assert_eq!(state.items(&key())[0].health, ResourceHealth::Healthy);
    }

    #[test]
    fn a_binding_whose_status_lags_behind_the_processor_is_behind() {
        let work = store_with_work();
        let interp = interpreters();
        let mut state = StatusState::default();
        let mut binding: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "train-appwrapper", "namespace": "ml", "uid": "uid-1"},
            "spec": {
                "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"},
                "clusters": [{"name": "m1"}]
            },
            "status": {"aggregatedStatus": [{
                "clusterName": "m1", "applied": true, "health": "Unhealthy",
                "failureClass": "Infrastructure", "unhealthySince": "2026-01-01T00:00:00Z"
            }]}
        }))
        .unwrap();
        // Nothing reported since the start: nothing to wait for.
        assert!(!state.ahead_of(&binding));
        let seed = Arc::new(binding.clone());
        let b = batch("m1", vec![report(1, appwrapper("Running", None))]);
        // A time within a second, as the processor's clock gives it.
        let now = Time(at(100).0 + k8s_openapi::jiff::SignedDuration::from_millis(250));
        state.process(&b, &work, |_| Some(seed.clone()), &interp, &now);
        // The processor knows it is Healthy again; the binding still says Unhealthy.
        assert!(state.ahead_of(&binding));
        // Decisions see the processor's item in place of the binding's, the others as they are.
        let mut with_another = binding.clone();
        let mut gone = with_another.status.as_ref().unwrap().aggregated_status[0].clone();
        gone.cluster_name = "m0".into();
        with_another
            .status
            .as_mut()
            .unwrap()
            .aggregated_status
            .insert(0, gone);
        let newest = state.newest_items(&with_another).expect("newer items");
        let health: Vec<(&str, ResourceHealth)> = newest
            .iter()
            .map(|i| (i.cluster_name.as_str(), i.health))
            .collect();
        assert_eq!(
            health,
            [
                ("m0", ResourceHealth::Unhealthy),
                ("m1", ResourceHealth::Healthy)
            ]
        );
        // Written, and the copy read back shows it (times to the second): caught up.
        binding.status.as_mut().unwrap().aggregated_status =
            serde_json::from_value(serde_json::to_value(state.items(&key())).unwrap()).unwrap();
        assert!(!state.ahead_of(&binding));
        assert_eq!(state.newest_items(&binding), None);
        // A cluster the status is not written for (no placement there) does not count.
        let mut moved = binding.clone();
        moved.spec.clusters[0].name = "m2".into();
        moved.status.as_mut().unwrap().aggregated_status.clear();
        assert!(!state.ahead_of(&moved));
        // Nor does a binding of another UID (deleted and created again).
        let mut other = seed.as_ref().clone();
        other.metadata.uid = Some("uid-2".into());
        assert!(!state.ahead_of(&other));
    }

    #[test]
    fn the_agents_failure_class_reaches_the_item() {
        let work = store_with_work();
        let interp = interpreters();
        let mut state = StatusState::default();
        let b = batch(
            "m1",
            vec![report(
                1,
                appwrapper("Failed", Some("[Infrastructure] node n1 is NotReady")),
            )],
        );
        let p = state.process(&b, &work, |_| None, &interp, &at(5));
        let item = &state.items(&key())[0];
        assert_eq!(item.health, ResourceHealth::Unhealthy);
        assert_eq!(item.failure_class, Some(FailureClass::Infrastructure));
        assert_eq!(
            item.unhealthy_since,
            Some(lifeboat_api::time::stored(at(5).0))
        );
        assert_eq!(p.transitions.len(), 1);
        assert_eq!(p.transitions[0].to, ResourceHealth::Unhealthy);
    }

    #[test]
    fn a_pytorchjob_without_status_makes_an_item_the_crd_takes() {
        let work = store_with_work();
        let interp = interpreters();
        let mut state = StatusState::default();
        let job = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}}});
        state.process(
            &batch("m1", vec![report(1, job)]),
            &work,
            |_| None,
            &interp,
            &at(1),
        );
        let item = serde_json::to_value(&state.items(&key())[0]).unwrap();
        assert!(item.get("status").is_none(), "no status: {item}");
    }

    #[test]
    fn work_of_another_cluster_or_binding_is_refused() {
        let work = store_with_work();
        let interp = interpreters();
        let mut state = StatusState::default();
        let p = state.process(
            &batch("m2", vec![report(1, appwrapper("Running", None))]),
            &work,
            |_| None,
            &interp,
            &at(1),
        );
        assert_eq!(p.response.accepted, 0);
        assert!(
            p.response.rejected[0]
                .reason
                .contains("not assigned to cluster m2")
        );
        let mut other_uid = report(1, appwrapper("Running", None));
        other_uid.binding_uid = "uid-old".into();
        let p = state.process(
            &batch("m1", vec![other_uid]),
            &work,
            |_| None,
            &interp,
            &at(1),
        );
        assert!(p.response.rejected[0].reason.contains("binding UID"));
        assert!(state.is_empty());
    }

    #[test]
    fn a_withdrawn_copy_reported_gone_becomes_an_unapplied_item_with_gone_at() {
        let work = store_with_work();
        let interp = interpreters();
        let mut state = StatusState::default();
        let failed = batch(
            "m1",
            vec![report(1, appwrapper("Failed", Some("[Infrastructure] x")))],
        );
        state.process(&failed, &work, |_| None, &interp, &at(10));
        let gone = |second| WorkStatus {
            applied: false,
            observed: None,
            gone: true,
            ..report(second, json!({}))
        };
        // not withdrawn yet: refused, the item stays
        let p = state.process(
            &batch("m1", vec![gone(2)]),
            &work,
            |_| None,
            &interp,
            &at(11),
        );
        assert!(p.response.rejected[0].reason.starts_with("gone:"));
        assert_eq!(state.items(&key())[0].health, ResourceHealth::Unhealthy);
        work.withdraw_for_purge("m1", &key(), "uid-1");
        // another cluster cannot report it
        let p = state.process(
            &batch("m2", vec![gone(3)]),
            &work,
            |_| None,
            &interp,
            &at(12),
        );
        assert_eq!(p.response.accepted, 0);
        let p = state.process(
            &batch("m1", vec![gone(3)]),
            &work,
            |_| None,
            &interp,
            &at(13),
        );
        assert_eq!((p.response.accepted, p.dirty.len()), (1, 1));
        assert_eq!(p.transitions[0].to, ResourceHealth::Unknown);
        let item = &state.items(&key())[0];
        assert!(!item.applied && item.status.is_none());
        assert_eq!(item.gone_at, Some(at(13)));
        // again after a reconnect: taken, nothing changes
        let p = state.process(
            &batch("m1", vec![gone(4)]),
            &work,
            |_| None,
            &interp,
            &at(14),
        );
        assert_eq!((p.response.accepted, p.dirty.len()), (1, 0));
        assert_eq!(state.items(&key())[0].gone_at, Some(at(13)));
    }

    #[test]
    fn a_gone_report_in_the_second_of_the_last_report_is_taken() {
        let work = store_with_work();
        let interp = interpreters();
        let mut state = StatusState::default();
        let failed = batch(
            "m1",
            vec![report(5, appwrapper("Failed", Some("[Infrastructure] x")))],
        );
        state.process(&failed, &work, |_| None, &interp, &at(10));
        work.withdraw_for_purge("m1", &key(), "uid-1");
        let gone = WorkStatus {
            applied: false,
            observed: None,
            gone: true,
            ..report(5, json!({}))
        };
        let p = state.process(&batch("m1", vec![gone]), &work, |_| None, &interp, &at(10));
        assert_eq!((p.response.accepted, p.dirty.len()), (1, 1));
        assert_eq!(state.items(&key())[0].gone_at, Some(at(10)));
    }

    #[test]
    fn timers_survive_a_restart_through_the_bindings_status() {
        let work = store_with_work();
        let interp = interpreters();
        let mut binding = ResourceBinding::new("train-appwrapper", ResourceBindingSpec::default());
        binding.metadata.namespace = Some("ml".into());
        binding.metadata.uid = Some("uid-1".into());
        binding.status = Some(
            serde_json::from_value(json!({"aggregatedStatus": [{
                "clusterName": "m1", "applied": true, "health": "Unhealthy",
                "failureClass": "Capacity", "unhealthySince": "2027-01-15T08:00:00Z"
            }]}))
            .unwrap(),
        );
        let binding = Arc::new(binding);
        let mut state = StatusState::default();
        // after the restart the agent reports Unknown (its own restart): the timer stays
        let unknown = appwrapper("Resuming", None);
        let b = batch("m1", vec![report(1, unknown)]);
        state.process(&b, &work, |_| Some(binding.clone()), &interp, &at(500));
        let item = &state.items(&key())[0];
        assert_eq!(
            item.unhealthy_since.as_ref().unwrap().0.to_string(),
            "2027-01-15T08:00:00Z"
        );
    }

    #[test]
    fn the_patch_keeps_placed_and_evicting_clusters_only() {
        let mut binding: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "b", "namespace": "ml", "generation": 2},
            "spec": {"resource": {"apiVersion": "v1", "kind": "Pod", "name": "p"},
                     "clusters": [{"name": "m2"}],
                     "gracefulEvictionTasks": [{"fromCluster": "m1", "reason": "ApplicationFailure", "producer": "hub"}]}
        }))
        .unwrap();
        let item = |c: &str, h| AggregatedStatusItem {
            cluster_name: c.into(),
            applied: true,
            health: h,
            ..Default::default()
        };
        let items = vec![
            item("m1", ResourceHealth::Unhealthy),
            item("m2", ResourceHealth::Healthy),
            item("m3", ResourceHealth::Healthy),
        ];
        let (patch, changed) = status_patch(&binding, items.clone(), &at(1));
        assert!(changed);
        let clusters: Vec<&str> = patch["status"]["aggregatedStatus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["clusterName"].as_str().unwrap())
            .collect();
        assert_eq!(clusters, ["m1", "m2"]);
        assert_eq!(patch["status"]["conditions"][1]["status"], "True");
        // once the binding carries that status, the same items are no change
        binding.status = Some(serde_json::from_value(patch["status"].clone()).unwrap());
        let (_, changed) = status_patch(&binding, items, &at(2));
        assert!(!changed);
    }

    fn appwrapper_customization(script: &str) -> Interpreters {
        let builtin =
            Interpreters::builtin(Arc::new(Runtime::new(RuntimeConfig::default()))).unwrap();
        let object: lifeboat_api::config::ResourceInterpreterCustomization =
            serde_json::from_value(json!({
                "apiVersion": "config.lifeboat.dev/v1alpha1",
                "kind": "ResourceInterpreterCustomization",
                "metadata": {"name": "appwrapper-health"},
                "spec": {
                    "target": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"},
                    "customizations": {"healthInterpretation": {"luaScript": script}}
                }
            }))
            .unwrap();
        let (layered, rejected) = Interpreters::layered(builtin, &[object]);
        assert!(rejected.is_empty(), "{rejected:?}");
        layered
    }

    fn misses(state: &StatusState, b: &StatusBatch, interp: &Interpreters) -> usize {
        state.misses(b, &fingerprints(b, interp)).len()
    }

    #[test]
    fn an_unchanged_object_is_not_interpreted_again_and_a_changed_one_is() {
        let work = store_with_work();
        let interp = interpreters();
        let mut state = StatusState::default();
        let running = batch("m1", vec![report(1, appwrapper("Running", None))]);
        assert_eq!(misses(&state, &running, &interp), 1);
        state.process(&running, &work, |_| None, &interp, &at(10));
        // a newer report of the same object: served from the cache, nothing changes
        let again = batch("m1", vec![report(2, appwrapper("Running", None))]);
        assert_eq!(misses(&state, &again, &interp), 0);
        let p = state.process(&again, &work, |_| None, &interp, &at(11));
        assert_eq!((p.response.accepted, p.dirty.len()), (1, 0));
        assert!(p.transitions.is_empty());
        assert_eq!(state.items(&key())[0].health, ResourceHealth::Healthy);
        // the object changed: interpreted again, with its new verdict and reflected status
        let failed = batch(
            "m1",
            vec![report(
                3,
                appwrapper("Failed", Some("[Infrastructure] node n1 is NotReady")),
            )],
        );
        assert_eq!(misses(&state, &failed, &interp), 1);
        let p = state.process(&failed, &work, |_| None, &interp, &at(12));
        assert_eq!(p.transitions.len(), 1);
        let item = &state.items(&key())[0];
        assert_eq!(item.health, ResourceHealth::Unhealthy);
        assert_eq!(item.status.as_ref().unwrap()["phase"], "Failed");
        // what it replaced goes back to the caller to free: the item's old status and the old
        // interpretation's reflected status, both the Running one
        assert_eq!(p.displaced.len(), 2);
        assert!(p.displaced.iter().all(|v| v["phase"] == "Running"));
        // and back to the first object: interpreted again (the cache holds the last one only)
        let back = batch("m1", vec![report(4, appwrapper("Running", None))]);
        assert_eq!(misses(&state, &back, &interp), 1);
        let p = state.process(&back, &work, |_| None, &interp, &at(13));
        assert_eq!(p.transitions[0].to, ResourceHealth::Healthy);
        // a report without an object forgets the interpretation
        let mut gone = report(5, appwrapper("Running", None));
        gone.observed = None;
        state.process(&batch("m1", vec![gone]), &work, |_| None, &interp, &at(14));
        let back = batch("m1", vec![report(6, appwrapper("Running", None))]);
        assert_eq!(misses(&state, &back, &interp), 1);
    }

    #[test]
    fn changed_customizations_invalidate_the_cache() {
        let work = store_with_work();
        let builtin = interpreters();
        let mut state = StatusState::default();
        let b = |second| batch("m1", vec![report(second, appwrapper("Running", None))]);
        state.process(&b(1), &work, |_| None, &builtin, &at(10));
        assert_eq!(state.items(&key())[0].health, ResourceHealth::Healthy);
        // the same object under a customization that judges it unhealthy
        let never = appwrapper_customization(
            "function InterpretHealth(obj) return {healthy = false, reason = 'customized'} end",
        );
        assert_eq!(misses(&state, &b(2), &never), 1);
        let p = state.process(&b(2), &work, |_| None, &never, &at(11));
        assert_eq!(p.transitions.len(), 1);
        let item = &state.items(&key())[0];
        assert_eq!(item.health, ResourceHealth::Unhealthy);
        assert_eq!(item.health_reason.as_deref(), Some("customized"));
        // the same scripts layered again are another generation: interpreted again
        let relayered = appwrapper_customization(
            "function InterpretHealth(obj) return {healthy = false, reason = 'customized'} end",
        );
        assert_ne!(never.generation(), relayered.generation());
        assert_eq!(misses(&state, &b(3), &relayered), 1);
    }

    #[test]
    fn a_failing_customization_gives_unknown_every_time_and_blocks_no_other_item() {
        let work = store_with_work();
        let other = WorkKey {
            namespace: "ml".into(),
            name: "other".into(),
        };
        work.upsert(
            "m1",
            Work {
                key: other.clone(),
                binding_uid: "uid-2".into(),
                manifest: json!({}),
                ..Default::default()
            },
        );
        let interp = appwrapper_customization("function InterpretHealth(obj) error('boom') end");
        let pod = |second| WorkStatus {
            key: other.clone(),
            binding_uid: "uid-2".into(),
            ..report(
                second,
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                       "status": {"phase": "Succeeded"}}),
            )
        };
        let mut state = StatusState::default();
        for (second, dirty) in [(1, 2), (2, 0)] {
            let b = batch(
                "m1",
                vec![report(second, appwrapper("Running", None)), pod(second)],
            );
            let p = state.process(&b, &work, |_| None, &interp, &at(10 + second));
            assert_eq!(p.response.accepted, 2);
            assert_eq!(p.dirty.len(), dirty, "report {second}");
            let item = &state.items(&key())[0];
            assert_eq!(item.health, ResourceHealth::Unknown);
            let reason = item.health_reason.as_deref().unwrap();
            assert!(
                reason.starts_with("health interpretation failed"),
                "{reason}"
            );
            assert!(reason.contains("boom"), "{reason}");
            assert_eq!(state.items(&other)[0].health, ResourceHealth::Healthy);
        }
    }

    #[test]
    fn interpreting_on_several_threads_gives_the_same_results_in_order() {
        let interp = interpreters();
        let items: Vec<WorkStatus> = (0..100)
            .map(|i| {
                let unhealthy = (i % 3 == 0).then_some("[Capacity] preempted");
                report(
                    i,
                    appwrapper(if i % 2 == 0 { "Running" } else { "Failed" }, unhealthy),
                )
            })
            .collect();
        let b = batch("m1", items);
        let prints = fingerprints(&b, &interp);
        let all: Vec<(usize, Fingerprint)> = prints
            .iter()
            .enumerate()
            .map(|(i, p)| (i, p.unwrap()))
            .collect();
        let one = interpret_items(&b, &all, &interp, 1);
        let three = interpret_items(&b, &all, &interp, 3);
        assert_eq!(one.len(), 100);
        // the same results (what they cost differs from run to run)
        let without_costs = |m: &HashMap<usize, Fresh>| -> HashMap<usize, Fresh> {
            m.iter()
                .map(|(i, f)| {
                    let mut f = f.clone();
                    f.interpreted.costs.clear();
                    (*i, f)
                })
                .collect()
        };
        assert_eq!(without_costs(&one), without_costs(&three));
        assert!(
            one.values()
                .all(|f| f.item_status == f.interpreted.reflected)
        );
        assert!(
            matches!(
                &one[&3].interpreted.verdict,
                HealthVerdict::Judged {
                    health: ResourceHealth::Unhealthy,
                    class: Some(FailureClass::Capacity),
                    ..
                }
            ),
            "{:?}",
            one[&3].interpreted.verdict
        );
        assert!(matches!(
            &one[&2].interpreted.verdict,
            HealthVerdict::Judged {
                health: ResourceHealth::Healthy,
                ..
            }
        ));
    }

    /// A customization for `target` (apiVersion, kind) with this InterpretHealth, over the
    /// built-ins of `runtime`.
    fn customized(
        runtime: Arc<Runtime>,
        name: &str,
        target: (&str, &str),
        script: &str,
    ) -> Interpreters {
        let builtin = Interpreters::builtin(runtime).unwrap();
        let object: lifeboat_api::config::ResourceInterpreterCustomization =
            serde_json::from_value(json!({
                "apiVersion": "config.lifeboat.dev/v1alpha1",
                "kind": "ResourceInterpreterCustomization",
                "metadata": {"name": name},
                "spec": {
                    "target": {"apiVersion": target.0, "kind": target.1},
                    "customizations": {"healthInterpretation": {"luaScript": script}}
                }
            }))
            .unwrap();
        let (layered, rejected) = Interpreters::layered(builtin, &[object]);
        assert!(rejected.is_empty(), "{rejected:?}");
        layered
    }

    fn shared(state: StatusState) -> SharedState {
        Arc::new(Mutex::new(state))
    }

    fn work_for(store: &WorkStore, name: &str) -> WorkKey {
        let key = WorkKey {
            namespace: "ml".into(),
            name: name.into(),
        };
        store.upsert(
            "m1",
            Work {
                key: key.clone(),
                binding_uid: format!("uid-{name}"),
                manifest: json!({}),
                ..Default::default()
            },
        );
        key
    }

    fn report_of(key: &WorkKey, second: i64, observed: serde_json::Value) -> WorkStatus {
        WorkStatus {
            key: key.clone(),
            binding_uid: format!("uid-{}", key.name),
            ..report(second, observed)
        }
    }

    #[tokio::test]
    async fn an_unrelated_binding_is_decided_while_a_hostile_customization_runs() {
        // The hostile script spins until the wall clock stops it (2 s here).
        let runtime = Arc::new(Runtime::new(RuntimeConfig {
            limits: lifeboat_interpreter::Limits {
                wall_clock: Duration::from_secs(2),
                instructions: u64::MAX / 2,
                ..Default::default()
            },
            ..Default::default()
        }));
        let interp = Arc::new(customized(
            runtime,
            "spin",
            ("example.com/v1", "Widget"),
            "function InterpretHealth(obj) while true do end end",
        ));
        let work = store_with_work();
        let hostile: Vec<WorkKey> = (0..3)
            .map(|i| work_for(&work, &format!("widget-{i}")))
            .collect();
        let widget =
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}});
        let pool = Arc::new(Pool::new(2, crate::interpreters::lanes::SLOW_AFTER));
        let mut engine = Engine::new(
            shared(StatusState::default()),
            pool.clone(),
            interp.clone(),
            crate::interpreters::lanes::SLOW_AFTER,
        );
        let widgets = Arc::new(batch(
            "m1",
            hostile
                .iter()
                .map(|k| report_of(k, 1, widget.clone()))
                .collect(),
        ));
        let p = engine
            .batch(widgets, &work, |_| None, &interp, &at(1))
            .await;
        // taken, their interpretations left to come
        assert_eq!((p.response.accepted, p.deferred), (3, 3));
        assert!(engine.state().lock().unwrap().items(&hostile[0]).is_empty());
        // the AppWrapper's report is decided now, while a hostile evaluation runs
        let aw = Arc::new(batch("m1", vec![report(1, appwrapper("Running", None))]));
        let p = engine.batch(aw, &work, |_| None, &interp, &at(1)).await;
        assert_eq!((p.response.accepted, p.deferred, p.dirty.len()), (1, 0, 1));
        assert_eq!(
            engine.state().lock().unwrap().items(&key())[0].health,
            ResourceHealth::Healthy
        );
        assert_eq!(pool.running("example.com/v1/Widget"), 1);
        // the hostile evaluation ends at its limit: its item says so, with the customization
        let done = tokio::time::timeout(Duration::from_secs(30), engine.next_done())
            .await
            .unwrap()
            .unwrap();
        let p = engine.late(done, &at(3));
        assert!(!p.dirty.is_empty());
        assert_eq!(p.failures[0].failure.customization, "spin");
        assert!(p.costs.iter().any(|c| c.customization == "spin"
            && c.operation == Operation::InterpretHealth
            && c.outcome == Outcome::Timeout));
        let state = engine.state().lock().unwrap();
        let item = p.dirty.iter().flat_map(|k| state.items(k)).next().unwrap();
        assert_eq!(item.health, ResourceHealth::Unknown);
        let reason = item.health_reason.unwrap();
        assert!(
            reason.starts_with(status::INTERPRETER_FAILED)
                && reason.contains("customization spin failed in InterpretHealth")
                && reason.contains("limit wall_clock"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn a_change_of_customizations_reinterprets_the_kinds_it_changes_without_a_report() {
        let runtime = Arc::new(Runtime::new(RuntimeConfig::default()));
        let plain =
            Arc::new(Interpreters::layered(Interpreters::builtin(runtime.clone()).unwrap(), &[]).0);
        let work = store_with_work();
        let pod_key = work_for(&work, "pod");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                         "status": {"phase": "Running"}});
        let mut engine = Engine::new(
            shared(StatusState::default()),
            Arc::new(Pool::new(2, crate::interpreters::lanes::SLOW_AFTER)),
            plain.clone(),
            crate::interpreters::lanes::SLOW_AFTER,
        );
        let b = Arc::new(batch(
            "m1",
            vec![
                report(1, appwrapper("Running", None)),
                report_of(&pod_key, 1, pod.clone()),
            ],
        ));
        engine.batch(b, &work, |_| None, &plain, &at(1)).await;
        assert_eq!(
            engine.state().lock().unwrap().items(&key())[0].health,
            ResourceHealth::Healthy
        );
        // a customization of AppWrappers that raises: only the AppWrapper is interpreted again
        let broken = Arc::new(customized(
            runtime,
            "broken",
            ("workload.codeflare.dev/v1beta2", "AppWrapper"),
            "function InterpretHealth(obj)\n  error('no health here')\nend",
        ));
        assert_eq!(engine.interpreters_changed(broken.clone()), 1);
        let done = tokio::time::timeout(Duration::from_secs(30), engine.next_done())
            .await
            .unwrap()
            .unwrap();
        let p = engine.late(done, &at(2));
        assert_eq!(p.dirty, vec![key()]);
        assert_eq!(p.failures.len(), 1);
        let notice = &p.failures[0];
        assert_eq!((notice.key.clone(), notice.cluster.as_str()), (key(), "m1"));
        assert_eq!(notice.failure.customization, "broken");
        assert!(
            notice.failure.message.contains(
                "customization broken failed in InterpretHealth (spec.customizations.healthInterpretation.luaScript)"
            ) && notice.failure.message.contains(":2: no health here"),
            "{}",
            notice.failure.message
        );
        let item = engine.state().lock().unwrap().items(&key())[0].clone();
        assert_eq!(item.health, ResourceHealth::Unknown);
        let binding: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "train-appwrapper", "namespace": "ml", "generation": 1},
            "spec": {"resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"},
                     "clusters": [{"name": "m1"}]}
        }))
        .unwrap();
        let (patch, _) = status_patch(&binding, vec![item], &at(2));
        let healthy = &patch["status"]["conditions"][1];
        assert_eq!(healthy["reason"], status::REASON_INTERPRETER_ERROR);
        assert!(
            healthy["message"]
                .as_str()
                .unwrap()
                .contains("customization broken failed in InterpretHealth"),
            "{healthy}"
        );
        // the Pod kept its interpretation: the same report again is no miss under the new
        // layering, and the AppWrapper's is not either (already re-interpreted)
        let again = batch(
            "m1",
            vec![
                report(3, appwrapper("Running", None)),
                report_of(&pod_key, 3, pod),
            ],
        );
        let state = engine.state().lock().unwrap();
        assert!(
            state
                .misses(&again, &fingerprints(&again, &broken))
                .is_empty()
        );
    }
}
