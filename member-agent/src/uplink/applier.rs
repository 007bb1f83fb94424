//! Applying the hub's works in the member: server-side apply (field manager `lifeboat`, forced)
//! of each work's manifest, labelled with its binding; deletion of what is no longer assigned
//! (found by its binding labels, deleted only if the labels name that work, with a UID
//! precondition, in the background: nothing waits for the member's garbage collector); and,
//! after a snapshot, the sweep that adopts what this agent created before a restart and removes
//! what no longer has a work.
//!
//! A work withdrawn with a request to confirm its copy gone (a `Directly` eviction) is watched
//! until the workload no longer runs, then reported gone: an AppWrapper is deleted in the
//! background and is gone once it is no longer served (its finalizer, this agent's controller,
//! holds it until its components and pods are gone) and no pod labelled with it is left that
//! is not terminal (read by the agent itself, whoever holds the AppWrapper's finalizers); any
//! other kind is deleted in the foreground, so it is served until the garbage collector has
//! deleted its dependents. A work this agent does not know (it restarted since) is found by
//! its binding labels.
//!
//! Why not the foreground everywhere: a foreground deletion ends when the member's garbage
//! collector removes its `foregroundDeletion` finalizer, and the garbage collector learns new
//! kinds only at its periodic discovery (30 s in kube-controller-manager). An AppWrapper
//! withdrawn in the first half minute after the agent installed its CRD stayed for about 19 s on
//! the fleet (issue 20).
//!
//! One worker applies works concurrently (a bounded number at a time, never two applies of the
//! same work at once); a failed apply is reported to the hub (`applied: false` with the error)
//! and retried with backoff; an invalid manifest is reported and not retried.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions,
    PropagationPolicy,
};
use lifeboat_api::appwrapper::constants::{self as aw, APPWRAPPER_LABEL};
use lifeboat_api::binding::{FIELD_MANAGER, LABEL_BINDING_NAME, LABEL_BINDING_NAMESPACE};
use lifeboat_api::policy::PurgeMode;
use lifeboat_api::protocol::{Work, WorkKey};
use lifeboat_api::stages;
use lifeboat_runtime::kube_error::KubeError;
use lifeboat_runtime::queue::WorkQueue;
use tracing::Instrument;

use super::backoff::Backoff;
use super::catalog::{ApiCatalog, check_ready, namespaced};
use super::fencing::{self, Fence, Suspension};
use super::metrics::HubMetrics;
use super::namespaces::Namespaces;
use super::reporter::{SharedBook, StatusWatches};
use super::reset::{self, Live, ResetState, Step};
use super::work::{Labelled, ManifestError, ObjectId, Prepared, key_of, orphans, prepare};

/// First retry of a failed apply; doubles up to the applier's maximum.
const RETRY_BASE: Duration = Duration::from_secs(1);
/// Kinds listed at once by a sweep.
const SWEEP_CONCURRENCY: usize = 4;
/// How often a withdrawn copy the hub waits for is checked while it is being deleted: first
/// after this long, doubling up to [`GONE_POLL_MAX`] (most copies are gone within a few tenths of
/// a second; a slow one is not read ten times a second).
/// The status watch's deletion event checks at once; the poll is for what it does not show (pods
/// that still run, a missed event).
const GONE_POLL_MIN: Duration = Duration::from_millis(50);
const GONE_POLL_MAX: Duration = Duration::from_millis(500);

/// The `n`th wait (from 0) for a withdrawn copy to be gone.
fn gone_poll(n: u32) -> Duration {
    GONE_POLL_MIN
        .saturating_mul(1u32.checked_shl(n).unwrap_or(u32::MAX))
        .min(GONE_POLL_MAX)
}

/// How an object no longer assigned is deleted: in the background, but in the foreground when
/// its absence is reported to the hub as the workload's and it is not an AppWrapper (whose
/// pods the agent checks itself, see the module).
fn propagation_for(id: &ObjectId, confirm: bool) -> PropagationPolicy {
    if confirm && !is_appwrapper(id) {
        PropagationPolicy::Foreground
    } else {
        PropagationPolicy::Background
    }
}

fn is_appwrapper(id: &ObjectId) -> bool {
    id.group == aw::GROUP && id.kind == aw::KIND
}

/// Whether a pod still runs (or may): not `Succeeded` or `Failed`.
fn pod_runs(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// What [`Applier::delete_owned`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deletion {
    /// Not there (or its kind is gone).
    Absent,
    /// There, but its binding labels name another work: not this work's copy.
    OtherWork,
    /// Deletion asked for now.
    Requested,
    /// Being deleted already (its finalizers and dependents are not done).
    Pending,
}

/// Why one apply failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Invalid(#[from] ManifestError),
    #[error("{api_version} {kind} is not served by the member's API server")]
    UnknownKind { api_version: String, kind: String },
    #[error("{context}: {0}", context = .0.context())]
    Kube(#[source] KubeError),
}

impl ApplyError {
    fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        ApplyError::Kube(KubeError::new(context.into(), source))
    }

    /// The message reported to the hub (`appliedMessage`).
    pub fn message(&self) -> String {
        match self {
            ApplyError::Kube(e) => match e.status() {
                Some(status) => refusal(e.context(), status),
                None => self.to_string(),
            },
            other => other.to_string(),
        }
    }
}

/// A cause's message longer than this keeps only its start and its end.
const CAUSE_MESSAGE_CHARS: usize = 160;

/// An API server's refusal as the hub shows it: with causes (a validation error names each field),
/// the message's headline then each field and its message, the rejected value cut short when
/// long (the server prints the whole value, e.g. a Job's pod template, before the reason), so
/// every field and its reason fit in the hub's 1 KiB `appliedMessage`; without causes, the
/// server's message.
fn refusal(context: &str, status: &kube::core::Status) -> String {
    let causes = status
        .details
        .as_ref()
        .map(|d| d.causes.as_slice())
        .unwrap_or_default();
    if causes.is_empty() {
        return format!(
            "{context}: {} ({}, {})",
            status.message, status.reason, status.code
        );
    }
    let headline = status
        .message
        .split_once(": ")
        .map_or(status.message.as_str(), |(headline, _)| headline);
    let causes: Vec<String> = causes
        .iter()
        .map(|c| {
            let message = shortened(&c.message);
            if c.field.is_empty() {
                message
            } else {
                format!("{}: {message}", c.field)
            }
        })
        .collect();
    format!(
        "{context}: {headline}: {} ({}, {})",
        causes.join("; "),
        status.reason,
        status.code
    )
}

/// `message` whole when short, else its first and last characters around a `…` (the reason
/// comes last).
fn shortened(message: &str) -> String {
    let chars = message.chars().count();
    if chars <= CAUSE_MESSAGE_CHARS {
        return message.to_string();
    }
    let head: String = message.chars().take(CAUSE_MESSAGE_CHARS / 4).collect();
    let tail: String = message
        .chars()
        .skip(chars - CAUSE_MESSAGE_CHARS * 3 / 4)
        .collect();
    format!("{head}…{tail}")
}

#[derive(Debug)]
struct Slot {
    /// What the hub wants: `None` once the work is no longer assigned (the slot goes when its
    /// object is gone).
    desired: Option<Arc<Work>>,
    /// The object the last successful apply made.
    applied: Option<ObjectId>,
    /// The object the latest manifest names (known even when its apply failed).
    intended: Option<ObjectId>,
    /// In-place resets done and in progress.
    reset: ResetState,
    backoff: Backoff,
    /// Withdrawn, and the hub waits to hear the copy is gone: the binding UID to report under.
    confirm: Option<String>,
    /// The objects of a withdrawn work this agent did not know, found by their labels.
    found: Option<Vec<ObjectId>>,
    /// How many times the removal of a confirmed purge looked and found the copy still there.
    gone_polls: u32,
}

impl Slot {
    fn new(max_backoff: Duration) -> Self {
        Slot {
            desired: None,
            applied: None,
            intended: None,
            reset: ResetState::default(),
            backoff: Backoff::new(RETRY_BASE, max_backoff),
            confirm: None,
            found: None,
            gone_polls: 0,
        }
    }
}

/// What became of one pass over a work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Done,
    Retry(Duration),
}

/// The works of this cluster and the objects they made.
pub struct Applier {
    client: kube::Client,
    catalog: Arc<ApiCatalog>,
    namespaces: Arc<Namespaces>,
    book: Arc<SharedBook>,
    watches: StatusWatches,
    metrics: HubMetrics,
    cluster: String,
    max_backoff: Duration,
    /// While it holds, `Directly` works are applied suspended (or deleted).
    fence: Arc<Fence>,
    slots: Mutex<HashMap<WorkKey, Slot>>,
    queue: Queue,
}

/// Whether a fence suspends the work: its purge mode is `Directly` (never two copies).
fn fenceable(work: &Work) -> bool {
    work.purge_mode == Some(PurgeMode::Directly)
}

/// Works waiting for the worker: each at most once, never applied twice at once, a retry due at
/// its earliest time and cancelled by a new add (`lifeboat_runtime::queue`).
pub type Queue = WorkQueue<WorkKey>;

/// The object a work's manifest names, resolved.
struct Target {
    prepared: Prepared,
    resource: ApiResource,
    is_namespaced: bool,
    id: ObjectId,
}

/// The reset annotation an apply carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Annotate {
    /// The generation the object was already re-created for (kept).
    Completed(i64),
    /// The object is re-created now for this generation.
    Recreate(i64),
}

impl Annotate {
    fn generation(self) -> i64 {
        match self {
            Annotate::Completed(g) | Annotate::Recreate(g) => g,
        }
    }

    fn recreated(self) -> Option<i64> {
        match self {
            Annotate::Recreate(g) => Some(g),
            Annotate::Completed(_) => None,
        }
    }
}

/// What the reset of a work leaves for its apply.
enum ResetFlow {
    Apply {
        annotate: Option<Annotate>,
    },
    /// A reset step is under way: look again after this long.
    Wait(Duration),
}

/// What an [`Applier`] is built from.
pub struct ApplierParts {
    pub client: kube::Client,
    pub catalog: Arc<ApiCatalog>,
    pub namespaces: Arc<Namespaces>,
    pub book: Arc<SharedBook>,
    pub metrics: HubMetrics,
    pub cluster: String,
    pub max_backoff: Duration,
    pub fence: Arc<Fence>,
}

impl Applier {
    pub fn new(parts: ApplierParts) -> (Arc<Self>, Queue) {
        let ApplierParts {
            client,
            catalog,
            namespaces,
            book,
            metrics,
            cluster,
            max_backoff,
            fence,
        } = parts;
        let queue = Queue::new();
        let rx = queue.clone();
        (
            Arc::new_cyclic(|me: &std::sync::Weak<Applier>| {
                let me = me.clone();
                // A withdrawn copy the hub waits for is looked at again as soon as the status
                // watch sees an object of it deleted, not at its next poll.
                let on_deleted = Arc::new(move |key: WorkKey| {
                    if let Some(applier) = me.upgrade() {
                        applier.object_deleted(key);
                    }
                });
                let watches = StatusWatches::new(client.clone(), book.clone(), on_deleted);
                Self {
                    client,
                    catalog,
                    namespaces,
                    book,
                    watches,
                    metrics,
                    cluster,
                    max_backoff: max_backoff.max(RETRY_BASE),
                    fence,
                    slots: Mutex::new(HashMap::new()),
                    queue,
                }
            }),
            rx,
        )
    }

    /// The status watch saw an object of `key` deleted: a removal whose gone report the hub
    /// waits for is checked at once (the poll stays, for pods that still run).
    fn object_deleted(&self, key: WorkKey) {
        let awaited = self
            .lock()
            .get(&key)
            .is_some_and(|s| s.desired.is_none() && s.confirm.is_some());
        if awaited {
            self.queue.add(key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<WorkKey, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The member this applier applies to (for logs and spans).
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The hub wants `work` in the cluster.
    pub fn upsert(&self, work: Box<Work>) {
        let key = work.key.clone();
        self.book
            .with(|b| b.assign(&key, &work.binding_uid, work.revision));
        {
            let mut slots = self.lock();
            let slot = slots
                .entry(key.clone())
                .or_insert_with(|| Slot::new(self.max_backoff));
            slot.desired = Some(Arc::from(work));
            slot.confirm = None;
            slot.found = None;
            slot.backoff.reset();
        }
        self.metrics.work_items.set(self.len() as i64);
        self.queue.add(key);
    }

    /// The work is no longer assigned: its object goes. With `confirm` (the binding UID) the hub
    /// waits to hear the copy is gone: once its objects are no longer served it is reported so
    /// (also for a work this agent does not know: it may have removed it before a restart).
    pub fn remove(&self, key: &WorkKey, confirm: Option<String>) {
        self.book.with(|b| b.withdraw(key, confirm.as_deref()));
        let known = {
            let mut slots = self.lock();
            match slots.get_mut(key) {
                Some(slot) => {
                    slot.desired = None;
                    slot.backoff.reset();
                    if confirm.is_some() {
                        slot.confirm = confirm;
                    }
                    true
                }
                None if confirm.is_some() => {
                    let mut slot = Slot::new(self.max_backoff);
                    slot.confirm = confirm;
                    slots.insert(key.clone(), slot);
                    true
                }
                None => false,
            }
        };
        self.metrics.work_items.set(self.len() as i64);
        if known {
            self.queue.add(key.clone());
        }
    }

    /// The works assigned now.
    pub fn keys(&self) -> Vec<WorkKey> {
        let mut keys: Vec<WorkKey> = self
            .lock()
            .iter()
            .filter(|(_, s)| s.desired.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    /// How many works are assigned.
    pub fn len(&self) -> usize {
        self.lock().values().filter(|s| s.desired.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The assigned works that a fence suspends (purge mode `Directly`).
    pub fn fenceable_keys(&self) -> Vec<WorkKey> {
        let mut keys: Vec<WorkKey> = self
            .lock()
            .iter()
            .filter(|(_, s)| s.desired.as_deref().is_some_and(fenceable))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    /// Applies the fenceable works again (the fence fell or lifted).
    pub fn requeue_fenceable(&self) -> usize {
        let keys = self.fenceable_keys();
        for key in &keys {
            if let Some(slot) = self.lock().get_mut(key) {
                slot.backoff.reset();
            }
            self.queue.add(key.clone());
        }
        keys.len()
    }

    fn desired(&self, key: &WorkKey) -> Option<Arc<Work>> {
        self.lock().get(key).and_then(|s| s.desired.clone())
    }

    /// Applies queued works, `concurrency` at a time, retrying failures with backoff, until
    /// dropped.
    pub async fn run(self: Arc<Self>, queue: Queue, concurrency: usize) {
        let mut running = FuturesUnordered::new();
        loop {
            tokio::select! {
                next = queue.next(), if running.len() < concurrency.max(1) => {
                    let Some(key) = next else { break };
                    let this = self.clone();
                    running.push(async move {
                        let outcome = this.reconcile(&key).await;
                        (key, outcome)
                    });
                }
                Some((key, outcome)) = running.next(), if !running.is_empty() => {
                    // Added meanwhile: applied again at once, the retry dropped.
                    if let Outcome::Retry(after) = outcome {
                        queue.add_after(key.clone(), after);
                    }
                    queue.done(&key);
                }
            }
        }
    }

    async fn reconcile(&self, key: &WorkKey) -> Outcome {
        let Some((desired, applied, intended)) = self
            .lock()
            .get(key)
            .map(|s| (s.desired.clone(), s.applied.clone(), s.intended.clone()))
        else {
            return Outcome::Done;
        };
        match desired {
            Some(work) => {
                let span = tracing::info_span!("apply", cluster = %self.cluster, work = %key, revision = work.revision);
                self.apply_work(key, &work, applied).instrument(span).await
            }
            None => {
                let span = tracing::info_span!("remove", cluster = %self.cluster, work = %key);
                self.remove_objects(key, [applied, intended])
                    .instrument(span)
                    .await
            }
        }
    }

    async fn apply_work(&self, key: &WorkKey, work: &Work, applied: Option<ObjectId>) -> Outcome {
        // A reset step under way comes back later; its errors are the apply's.
        let result = match self.reset_step(key, work).await {
            Ok(ResetFlow::Wait(after)) => return Outcome::Retry(after),
            Ok(ResetFlow::Apply { annotate }) => self
                .apply(key, work, annotate)
                .await
                .map(|applied| (applied, annotate)),
            Err(e) => Err(e),
        };
        match result {
            Ok(((id, resource), annotate)) => {
                if let Some(generation) = annotate.and_then(|a| a.recreated()) {
                    self.metrics.applies.with_label_values(&["reset"]).inc();
                    tracing::info!(object = %id, generation, "re-created: in-place reset done");
                    if let Some(slot) = self.lock().get_mut(key) {
                        slot.reset.done(generation);
                    }
                }
                self.watches.ensure(&resource);
                self.metrics.applies.with_label_values(&["applied"]).inc();
                tracing::debug!(object = %id, "applied");
                tracing::debug!(target: stages::TARGET, stage = stages::OBJECT_APPLIED,
                    cluster = %self.cluster, work = %key, revision = work.revision);
                if let Some(old) = applied.filter(|old| *old != id) {
                    // The manifest names another object now: the old one goes.
                    match self
                        .delete_owned(&old, key, PropagationPolicy::Background)
                        .await
                    {
                        Ok(_) => {
                            tracing::info!(object = %old, "deleted the object a renamed work made before")
                        }
                        Err(e) => {
                            tracing::warn!(object = %old, error = %e, "cannot delete the object a renamed work made before")
                        }
                    }
                }
                if let Some(slot) = self.lock().get_mut(key) {
                    slot.applied = Some(id.clone());
                    slot.backoff.reset();
                }
                self.book.with(|b| b.applied(key, work.revision, Ok(id)));
                Outcome::Done
            }
            Err(ApplyError::Invalid(e)) => {
                self.metrics.applies.with_label_values(&["invalid"]).inc();
                tracing::warn!(error = %e, "the work's manifest cannot be applied; waiting for a new revision");
                self.book
                    .with(|b| b.applied(key, work.revision, Err(e.to_string())));
                Outcome::Done
            }
            Err(e) => {
                self.metrics.applies.with_label_values(&["failed"]).inc();
                let message = e.message();
                self.book
                    .with(|b| b.applied(key, work.revision, Err(message.clone())));
                let after = self
                    .lock()
                    .get_mut(key)
                    .map(|s| s.backoff.next_delay())
                    .unwrap_or(RETRY_BASE);
                tracing::warn!(error = %message, retry_in = ?after, "apply failed");
                Outcome::Retry(after)
            }
        }
    }

    /// The in-place reset of the work, if one is asked and not done: one step of it (delete,
    /// wait until gone, pause), or what the apply must carry (the completed generation, or the
    /// one it re-creates the object for).
    async fn reset_step(&self, key: &WorkKey, work: &Work) -> Result<ResetFlow, ApplyError> {
        let Some(request) = work.reset.as_ref() else {
            return Ok(ResetFlow::Apply { annotate: None });
        };
        let mut state = self
            .lock()
            .get(key)
            .map(|s| s.reset.clone())
            .unwrap_or_default();
        if !reset::needs_live(Some(request), &state) {
            return Ok(ResetFlow::Apply {
                annotate: state.annotation().map(Annotate::Completed),
            });
        }
        if fenceable(work) && self.fence.is_fenced() {
            // Fenced: the workload stays suspended; the reset waits for the fence to lift.
            return Ok(ResetFlow::Apply {
                annotate: state.annotation().map(Annotate::Completed),
            });
        }
        let (target, api) = self.target(key, work).await?;
        // A server still starting can read an existing custom object as missing.
        check_ready(&self.client)
            .await
            .map_err(|e| ApplyError::kube(format!("reading {} for its reset", target.id), e))?;
        let object = api
            .get_opt(&target.id.name)
            .await
            .map_err(|e| ApplyError::kube(format!("reading {} for its reset", target.id), e))?;
        let live = match &object {
            None => Live::Absent,
            Some(o) => Live::Present {
                deleting: o.metadata.deletion_timestamp.is_some(),
                completed: reset::completed_generation(o.metadata.annotations.as_ref())
                    .unwrap_or_else(|e| {
                        tracing::warn!(object = %target.id, error = %e, "the reset annotation is not a generation: taken as never reset");
                        None
                    }),
            },
        };
        let next = reset::step(request, &mut state, &live, std::time::Instant::now());
        if let Some(slot) = self.lock().get_mut(key) {
            slot.reset = state;
        }
        Ok(match next {
            Step::Apply { annotate } => ResetFlow::Apply {
                annotate: annotate.map(Annotate::Completed),
            },
            Step::Delete => {
                tracing::info!(object = %target.id, generation = request.generation, pause_seconds = request.pause_seconds, "in-place reset: deleting the object");
                self.delete_owned(&target.id, key, PropagationPolicy::Foreground)
                    .await
                    .map_err(|e| {
                        ApplyError::kube(format!("deleting {} for its reset", target.id), e)
                    })?;
                ResetFlow::Wait(reset::GONE_POLL)
            }
            Step::WaitGone => {
                tracing::debug!(object = %target.id, "in-place reset: waiting until the object is gone");
                ResetFlow::Wait(reset::GONE_POLL)
            }
            Step::Pause(left) => {
                tracing::info!(object = %target.id, left = ?left, "in-place reset: the object is gone; pausing");
                ResetFlow::Wait(left)
            }
            Step::Recreate { generation } => ResetFlow::Apply {
                annotate: Some(Annotate::Recreate(generation)),
            },
        })
    }

    /// What the work's manifest names, resolved, and the API to reach it.
    async fn target(
        &self,
        key: &WorkKey,
        work: &Work,
    ) -> Result<(Target, Api<DynamicObject>), ApplyError> {
        let prepared = prepare(work)?;
        let (resource, caps) = self
            .catalog
            .resolve(&prepared.api_version, &prepared.kind)
            .await
            .map_err(|e| ApplyError::kube("discovery", e))?
            .ok_or_else(|| ApplyError::UnknownKind {
                api_version: prepared.api_version.clone(),
                kind: prepared.kind.clone(),
            })?;
        let is_namespaced = namespaced(&caps);
        let id = ObjectId {
            group: resource.group.clone(),
            kind: resource.kind.clone(),
            namespace: is_namespaced.then(|| prepared.namespace.clone()),
            name: prepared.name.clone(),
        };
        if let Some(slot) = self.lock().get_mut(key) {
            slot.intended = Some(id.clone());
        }
        let api: Api<DynamicObject> = if is_namespaced {
            Api::namespaced_with(self.client.clone(), &prepared.namespace, &resource)
        } else {
            Api::all_with(self.client.clone(), &resource)
        };
        Ok((
            Target {
                prepared,
                resource,
                is_namespaced,
                id,
            },
            api,
        ))
    }

    /// Server-side apply of the work's manifest (with the reset annotation `annotate` asks
    /// for); returns the object and its resource.
    async fn apply(
        &self,
        key: &WorkKey,
        work: &Work,
        annotate: Option<Annotate>,
    ) -> Result<(ObjectId, ApiResource), ApplyError> {
        let (
            Target {
                prepared:
                    Prepared {
                        namespace,
                        name,
                        mut body,
                        ..
                    },
                resource,
                is_namespaced,
                id,
            },
            api,
        ) = self.target(key, work).await?;
        if let Some(annotate) = annotate {
            reset::annotate(&mut body, annotate.generation());
        }
        if fenceable(work) && self.fence.is_fenced() {
            match fencing::suspend(&mut body) {
                Suspension::Suspended => {
                    tracing::warn!(object = %id, "fenced: applied suspended (cluster failover purgeMode Directly, the hub is out of reach)");
                }
                Suspension::Delete => {
                    tracing::warn!(object = %id, "fenced: deleted, its kind cannot be suspended (cluster failover purgeMode Directly, the hub is out of reach)");
                    self.delete_owned(&id, key, PropagationPolicy::Background)
                        .await
                        .map_err(|e| ApplyError::kube(format!("deleting {id} (fenced)"), e))?;
                    return Ok((id, resource));
                }
            }
        }
        let meta = body
            .get_mut("metadata")
            .and_then(serde_json::Value::as_object_mut);
        if is_namespaced {
            self.namespaces
                .ensure(&namespace)
                .await
                .map_err(|e| ApplyError::kube(format!("creating namespace {namespace}"), e))?;
            if let Some(meta) = meta {
                meta.insert("namespace".into(), namespace.clone().into());
            }
        } else if let Some(meta) = meta {
            meta.remove("namespace");
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match api.patch(&name, &params, &Patch::Apply(&body)).await {
            Ok(_) => Ok((id, resource)),
            Err(e) => {
                if let kube::Error::Api(s) = &e
                    && s.code == 404
                {
                    // The kind (a CRD) or the namespace went away since they were looked up.
                    self.catalog.invalidate().await;
                    self.namespaces.forget(&namespace);
                }
                Err(ApplyError::kube(format!("applying {id}"), e))
            }
        }
    }

    async fn remove_objects(&self, key: &WorkKey, ids: [Option<ObjectId>; 2]) -> Outcome {
        let mut ids: Vec<ObjectId> = ids.into_iter().flatten().collect();
        let (confirm, found) = self
            .lock()
            .get(key)
            .map(|s| (s.confirm.clone(), s.found.clone()))
            .unwrap_or_default();
        if confirm.is_some() && ids.is_empty() {
            // A work this agent does not know (it restarted since it had it): its objects, if
            // any are left, carry its binding labels.
            let found = match found {
                Some(found) => found,
                None => match self.find_labelled(key).await {
                    Ok(found) => {
                        if let Some(slot) = self.lock().get_mut(key) {
                            slot.found = Some(found.clone());
                        }
                        found
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot list the objects of a withdrawn work");
                        return self.retry_removal(key);
                    }
                },
            };
            ids = found;
        }
        ids.sort();
        ids.dedup();
        let mut failed = false;
        let mut remaining = 0;
        for id in &ids {
            match self
                .delete_owned(id, key, propagation_for(id, confirm.is_some()))
                .await
            {
                Ok(Deletion::Requested) => {
                    remaining += 1;
                    self.metrics.applies.with_label_values(&["deleted"]).inc();
                    tracing::info!(object = %id, "deleted: no longer assigned to this cluster");
                }
                Ok(Deletion::Pending) => remaining += 1,
                Ok(Deletion::Absent) if confirm.is_some() && is_appwrapper(id) => {
                    // Deleted in the background: gone only once none of its pods runs.
                    match self.running_pods(id).await {
                        Ok(0) => {}
                        Ok(pods) => {
                            tracing::debug!(object = %id, pods, "the withdrawn AppWrapper is gone, pods of it still run");
                            remaining += 1;
                        }
                        Err(e) => {
                            failed = true;
                            tracing::warn!(object = %id, error = %e, "cannot list the pods of a withdrawn AppWrapper");
                        }
                    }
                }
                Ok(Deletion::Absent | Deletion::OtherWork) => {}
                Err(e) => {
                    failed = true;
                    self.metrics
                        .applies
                        .with_label_values(&["delete_failed"])
                        .inc();
                    tracing::warn!(object = %id, error = %e, "cannot delete an object no longer assigned");
                }
            }
        }
        let confirmed = {
            let mut slots = self.lock();
            let Some(slot) = slots.get_mut(key) else {
                return Outcome::Done;
            };
            if slot.desired.is_some() {
                // Assigned again meanwhile: the queue has it.
                return Outcome::Done;
            }
            if failed {
                return Outcome::Retry(slot.backoff.next_delay());
            }
            if slot.confirm.is_some() && remaining > 0 {
                // The hub waits for the copy to be gone, not for its deletion to be asked.
                let wait = gone_poll(slot.gone_polls);
                slot.gone_polls = slot.gone_polls.saturating_add(1);
                return Outcome::Retry(wait);
            }
            slots.remove(key).and_then(|s| s.confirm)
        };
        if let Some(binding_uid) = confirmed {
            tracing::info!(
                objects = ids.len(),
                "the withdrawn copy is gone: reporting it to the hub"
            );
            self.book.report_gone(key, &binding_uid);
        }
        Outcome::Done
    }

    /// How many pods labelled with the AppWrapper `id` are not terminal, read from the member's
    /// apiserver (not a cache: the count decides a gone report).
    async fn running_pods(&self, id: &ObjectId) -> Result<usize, kube::Error> {
        let pods: Api<Pod> = match &id.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => return Ok(0),
        };
        let params = ListParams::default().labels(&format!("{APPWRAPPER_LABEL}={}", id.name));
        Ok(pods
            .list(&params)
            .await?
            .items
            .iter()
            .filter(|p| pod_runs(p))
            .count())
    }

    fn retry_removal(&self, key: &WorkKey) -> Outcome {
        Outcome::Retry(
            self.lock()
                .get_mut(key)
                .map(|s| s.backoff.next_delay())
                .unwrap_or(RETRY_BASE),
        )
    }

    /// The objects carrying the binding labels of `key`, of every kind the member serves.
    async fn find_labelled(&self, key: &WorkKey) -> Result<Vec<ObjectId>, kube::Error> {
        let selector = format!(
            "{LABEL_BINDING_NAMESPACE}={},{LABEL_BINDING_NAME}={}",
            key.namespace, key.name
        );
        Ok(self
            .list_labelled(&selector)
            .await?
            .into_iter()
            .filter(|o| o.key == *key)
            .map(|o| o.id)
            .collect())
    }

    /// Deletes `id` if it exists and its binding labels name `key` (UID precondition), with
    /// `propagation`; says whether it was there.
    async fn delete_owned(
        &self,
        id: &ObjectId,
        key: &WorkKey,
        propagation: PropagationPolicy,
    ) -> Result<Deletion, kube::Error> {
        let Some((resource, _)) = self.catalog.resolve_group_kind(&id.group, &id.kind).await?
        else {
            // The kind is gone, and its objects with it (discovery of a ready server).
            return Ok(Deletion::Absent);
        };
        // A server still starting can read an existing custom object as missing.
        check_ready(&self.client).await?;
        let api: Api<DynamicObject> = match &id.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        };
        let Some(object) = api.get_opt(&id.name).await? else {
            return Ok(Deletion::Absent);
        };
        let owner = object.metadata.labels.as_ref().and_then(key_of);
        if owner.as_ref() != Some(key) {
            tracing::info!(object = %id, "not deleted: its binding labels name another work");
            return Ok(Deletion::OtherWork);
        }
        if object.metadata.deletion_timestamp.is_some() {
            return Ok(Deletion::Pending);
        }
        let params = DeleteParams {
            propagation_policy: Some(propagation),
            preconditions: Some(Preconditions {
                uid: object.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&id.name, &params).await {
            Ok(_) => Ok(Deletion::Requested),
            // Gone meanwhile.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Deletion::Absent),
            // Replaced by another object of the same name: looked at again on the next pass.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Deletion::Pending),
            Err(e) => Err(e),
        }
    }

    /// After a snapshot whose works are `keys`: lists every object with binding labels (every
    /// kind the member serves) and deletes those no work names. Returns how many were deleted.
    pub async fn sweep(&self, keys: &BTreeSet<WorkKey>) -> Result<usize, kube::Error> {
        let snapshot = self
            .catalog
            .refresh_if_older(Duration::from_secs(30))
            .await?;
        let assigned: BTreeMap<WorkKey, Option<ObjectId>> = keys
            .iter()
            .map(|key| {
                let id = self
                    .desired(key)
                    .and_then(|w| prepare(&w).ok())
                    .and_then(|p| {
                        snapshot
                            .resolve(&p.api_version, &p.kind)
                            .map(|(_, caps)| p.id(namespaced(&caps)))
                    });
                (key.clone(), id)
            })
            .collect();
        let found = self
            .list_labelled(&format!("{LABEL_BINDING_NAMESPACE},{LABEL_BINDING_NAME}"))
            .await?;
        let orphaned = orphans(&assigned, &found);
        let adopted = found.len() - orphaned.len();
        let mut deleted = 0;
        for id in orphaned {
            let Some(key) = found.iter().find(|o| o.id == id).map(|o| o.key.clone()) else {
                continue;
            };
            match self
                .delete_owned(&id, &key, PropagationPolicy::Background)
                .await
            {
                Ok(Deletion::Requested) => {
                    deleted += 1;
                    self.metrics.applies.with_label_values(&["deleted"]).inc();
                    tracing::info!(object = %id, work = %key, "deleted: its work is no longer assigned to this cluster");
                }
                Ok(Deletion::Pending | Deletion::Absent | Deletion::OtherWork) => {}
                Err(e) => {
                    self.metrics
                        .applies
                        .with_label_values(&["delete_failed"])
                        .inc();
                    tracing::warn!(object = %id, error = %e, "sweep: cannot delete")
                }
            }
        }
        tracing::info!(
            works = keys.len(),
            labelled = found.len(),
            adopted,
            deleted,
            "snapshot applied: objects of other works removed"
        );
        Ok(deleted)
    }

    /// Every object with labels matching `selector`, of every kind the member serves and the
    /// agent may list, with the work its binding labels name.
    async fn list_labelled(&self, selector: &str) -> Result<Vec<Labelled>, kube::Error> {
        let snapshot = self
            .catalog
            .refresh_if_older(Duration::from_secs(30))
            .await?;
        // A server still starting can list existing custom objects as none.
        check_ready(&self.client).await?;
        let lists = futures::stream::iter(snapshot.sweepable())
            .map(|(resource, caps)| {
                let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
                let params = ListParams::default().labels(selector);
                async move {
                    let listed = api.list_metadata(&params).await;
                    (resource, caps, listed)
                }
            })
            .buffer_unordered(SWEEP_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        let mut found = Vec::new();
        for (resource, caps, listed) in lists {
            let list = match listed {
                Ok(list) => list,
                // A kind the agent may not list is a kind it could not have applied; a kind no
                // longer served has no objects left.
                Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => {
                    tracing::debug!(kind = %resource.kind, group = %resource.group, code = s.code, error = %s.message, "cannot list labelled objects");
                    continue;
                }
                // Anything else leaves the list unknown, not empty.
                Err(e) => return Err(e),
            };
            for object in list.items {
                let Some(key) = object.metadata.labels.as_ref().and_then(key_of) else {
                    continue;
                };
                found.push(Labelled {
                    id: ObjectId {
                        group: resource.group.clone(),
                        kind: resource.kind.clone(),
                        namespace: if namespaced(&caps) {
                            object.metadata.namespace.clone()
                        } else {
                            None
                        },
                        name: object.metadata.name.clone().unwrap_or_default(),
                    },
                    key,
                });
            }
        }
        Ok(found)
    }

    /// The hub deleted this cluster: every work and every object with binding labels goes.
    pub async fn remove_everything(&self) -> Result<usize, kube::Error> {
        for key in self.keys() {
            self.remove(&key, None);
        }
        self.sweep(&BTreeSet::new()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use kube::core::response::{StatusCause, StatusDetails};

    fn invalid(message: &str, causes: Vec<StatusCause>) -> ApplyError {
        let mut status = Status::failure(message, "Invalid").with_code(422);
        if !causes.is_empty() {
            status = status.with_details(StatusDetails {
                name: "train".into(),
                group: "batch".into(),
                kind: "Job".into(),
                uid: String::new(),
                causes,
                retry_after_seconds: 0,
            });
        }
        ApplyError::kube(
            "applying Job.batch ml/train",
            kube::Error::Api(status.boxed()),
        )
    }

    fn cause(field: &str, message: &str) -> StatusCause {
        StatusCause {
            reason: "FieldValueInvalid".into(),
            message: message.into(),
            field: field.into(),
        }
    }

    #[test]
    fn a_refusal_names_each_field_and_its_reason_with_a_long_value_cut_short() {
        let template = format!(
            "{{\"labels\":{{}},\"Spec\":{{{}}}}}",
            "\"x\":null,".repeat(300)
        );
        let long = format!("Invalid value: {template}: field is immutable");
        let err = invalid(
            &format!("Job.batch \"train\" is invalid: spec.template: {long}"),
            vec![
                cause("spec.template", &long),
                cause("spec.selector", "Invalid value: \"x\": must be 'u2'"),
            ],
        );
        let message = err.message();
        assert!(message.len() < 600, "{} bytes: {message}", message.len());
        assert!(
            message.starts_with(
                "applying Job.batch ml/train: Job.batch \"train\" is invalid: spec.template: Invalid value: {"
            ),
            "{message}"
        );
        assert!(message.contains('…'), "{message}");
        assert!(
            message.ends_with(
                "\"x\":null,}}: field is immutable; spec.selector: Invalid value: \"x\": must be 'u2' (Invalid, 422)"
            ),
            "{message}"
        );
    }

    #[test]
    fn a_refusal_without_causes_is_the_servers_message() {
        let err = invalid("admission webhook \"w\" denied the request: no", vec![]);
        assert_eq!(
            err.message(),
            "applying Job.batch ml/train: admission webhook \"w\" denied the request: no (Invalid, 422)"
        );
        let short = "Invalid value: \"python train.py --resume\": entrypoint is immutable";
        assert_eq!(shortened(short), short);
        let unicode = "é".repeat(CAUSE_MESSAGE_CHARS + 1);
        assert_eq!(shortened(&unicode).chars().count(), CAUSE_MESSAGE_CHARS + 1);
    }
}
