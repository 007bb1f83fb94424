//! The AppWrapper controller: fetch (indexes, confirmed by reads where a verdict depends on an
//! absence) → decide (the pure [`crate::machine`]) → apply (finalizer, status, creates, deletes,
//! events). Status and finalizer writes carry the resourceVersion they were computed from, so a
//! decision made on a stale read is rejected by the API server and retried.

mod apply;
pub mod failures;
#[cfg(test)]
mod mock;
mod observe;
pub mod queue;
pub mod slots;
pub mod watches;
pub mod written;

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::{FutureExt, StreamExt};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use lifeboat_api::appwrapper::constants::FINALIZER;
use lifeboat_api::appwrapper::{AppWrapper, AppWrapperPhase as Phase};
use lifeboat_api::stages;
use lifeboat_runtime::kube_error::KubeError;
use lifeboat_runtime::leader::Leadership;
use lifeboat_runtime::readiness::Readiness;
use tracing::Instrument;

use crate::config::AppWrapperConfig;
use crate::index::{AwKey, PodIndex};
use crate::machine::{self, FinalizerChange, Input};
use crate::metrics::Metrics;
use crate::node_health::NodeHealthIndex;
use crate::params::Params;
use watches::ComponentWatches;

/// Errors of one reconcile. Each has a low-cardinality metric label.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The source is said by the error chain (`failures::error_chain`), not by this text.
    #[error("kubernetes API ({context})", context = .0.context())]
    Kube(#[source] KubeError),
    #[error("the AppWrapper changed since it was read; retrying")]
    Conflict,
    #[error("discovery: {0}")]
    Discovery(#[from] watches::KindError),
    #[error("serializing {what}: {source}")]
    Serialization {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(e) => e.metric_label(),
            Error::Conflict => "conflict",
            Error::Discovery(_) => "discovery",
            Error::Serialization { .. } => "serialization",
        }
    }

    fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        let error = KubeError::new(context.into(), source);
        if error.is_conflict() {
            return Error::Conflict;
        }
        Error::Kube(error)
    }
}

/// Shared state of the controller.
pub struct Context {
    pub client: kube::Client,
    pub config: Arc<AppWrapperConfig>,
    pub pods: Arc<RwLock<PodIndex>>,
    pub nodes: Arc<RwLock<NodeHealthIndex>>,
    pub components: ComponentWatches,
    pub recorder: Recorder,
    pub metrics: Metrics,
    /// When each AppWrapper was first asked for since its last reconcile started.
    pub queue: Arc<queue::QueueClock>,
    /// Versions this agent wrote over, to skip reconciles of a copy the cache has not updated.
    pub written: written::WrittenVersions,
    /// Name of the cluster this agent runs in (for logs and spans).
    pub cluster: String,
    /// Runs of failed reconciles, for backoff and Warning Events.
    pub failures: failures::Failures,
    /// The reconcile slots (`--concurrency`), detection before clean-up.
    pub slots: Arc<slots::Slots>,
    /// The controller's cache of AppWrappers: a reconcile that waited for a slot reads the
    /// latest copy from it (`None` in unit tests, which hand the copy in).
    pub store: Option<reflector::Store<AppWrapper>>,
}

impl Context {
    /// The controller's state for `client`'s cluster, with empty indexes; wrapped-kind watches
    /// send their reconcile requests to `trigger` and report their sync to `readiness`.
    pub fn new(
        client: kube::Client,
        config: Arc<AppWrapperConfig>,
        metrics: Metrics,
        cluster: String,
        trigger: watches::Trigger,
        readiness: Readiness,
    ) -> Self {
        let nodes =
            NodeHealthIndex::new(config.autopilot.clone(), config.reclamation_taints.clone());
        Self {
            client: client.clone(),
            config,
            pods: Arc::new(RwLock::new(PodIndex::default())),
            nodes: Arc::new(RwLock::new(nodes)),
            components: ComponentWatches::new(client.clone(), trigger, readiness),
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "lifeboat-agent".into(),
                    instance: std::env::var("POD_NAME").ok(),
                },
            ),
            metrics,
            cluster,
            queue: Arc::default(),
            written: written::WrittenVersions::default(),
            failures: failures::Failures::default(),
            slots: slots::Slots::new(DEFAULT_SLOTS),
            store: None,
        }
    }

    fn monitor_nodes(&self) -> bool {
        self.config
            .autopilot
            .as_ref()
            .is_some_and(|a| a.monitor_nodes)
    }

    /// Awaits one API request, observing its round trip under `request` (a fixed name).
    async fn timed<T>(
        &self,
        request: &'static str,
        call: impl std::future::Future<Output = T>,
    ) -> T {
        let started = Instant::now();
        let out = call.await;
        self.metrics
            .api_request_duration
            .with_label_values(&[request])
            .observe(started.elapsed().as_secs_f64());
        out
    }
}

/// Options of the controller.
pub struct ControllerOptions {
    pub cluster: String,
    pub concurrency: u16,
    /// Reconcile only while this replica leads ([`Leadership::always`] without election).
    pub leadership: Leadership,
    /// The process's readiness: the watches started here report their initial sync to it.
    pub readiness: Readiness,
    /// The core watches, registered with `readiness` by the caller before serving `/readyz`.
    pub core_watches: watches::CoreWatches,
}

/// Reconcile requests from the watches, passed on to the controller of the current leadership
/// term, dropped while standing by (a new term reconciles every AppWrapper anyway).
type Gate = Arc<Mutex<Option<UnboundedSender<ObjectRef<AppWrapper>>>>>;

/// Also starts each request's queue clock (the queue wait metric runs from the first request).
async fn forward(
    mut requests: UnboundedReceiver<(ObjectRef<AppWrapper>, Instant)>,
    gate: Gate,
    queue: Arc<queue::QueueClock>,
) {
    while let Some((request, at)) = requests.next().await {
        if let Some(term) = gate.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            queue.triggered(
                AwKey::new(
                    request.namespace.clone().unwrap_or_default(),
                    request.name.clone(),
                ),
                at,
            );
            let _ = term.unbounded_send(request);
        }
    }
}

/// Runs the controller until `shutdown` resolves. The watches (and so the caches) run from the
/// start; reconciles run only while `options.leadership` says this replica leads, and are
/// aborted at once when it stops leading.
pub async fn run(
    client: kube::Client,
    config: Arc<AppWrapperConfig>,
    metrics: Metrics,
    options: ControllerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ControllerOptions {
        cluster,
        concurrency,
        mut leadership,
        readiness,
        core_watches,
    } = options;
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let (reader, writer) = reflector::store();
    let mut ctx = Context::new(
        client.clone(),
        config,
        metrics,
        cluster,
        tx.clone(),
        readiness,
    );
    ctx.slots = slots::Slots::new(usize::from(concurrency));
    ctx.store = Some(reader.clone());
    let ctx = Arc::new(ctx);
    let (pods, nodes) = (ctx.pods.clone(), ctx.nodes.clone());
    let gate: Gate = Arc::default();
    // Dropped (and so aborted) with this function, finished or cancelled.
    let mut background = tokio::task::JoinSet::new();
    background.spawn(watches::watch_appwrappers(
        client.clone(),
        writer,
        tx.clone(),
        core_watches.appwrappers,
    ));
    background.spawn(watches::watch_pods(
        client.clone(),
        ctx.cluster.clone(),
        pods.clone(),
        tx.clone(),
        core_watches.pods,
    ));
    background.spawn(watches::watch_nodes(
        client,
        nodes,
        pods,
        tx,
        core_watches.nodes,
    ));
    background.spawn(forward(rx, gate.clone(), ctx.queue.clone()));

    let shutdown = shutdown.shared();
    loop {
        tokio::select! {
            biased;
            () = shutdown.clone() => break,
            () = leadership.acquired() => {}
        }
        tracing::info!("leading: reconciling every AppWrapper");
        let (term, requests) = futures::channel::mpsc::unbounded();
        *gate.lock().unwrap_or_else(|e| e.into_inner()) = Some(term);
        ctx.metrics.leader.set(1);
        let store = reader.clone();
        let everything = futures::stream::once(async move {
            let _ = store.wait_until_ready().await;
        });
        let controller = Controller::for_stream(
            futures::stream::pending::<Result<AppWrapper, watcher::Error>>(),
            reader.clone(),
        )
        // Unbounded here: each reconcile waits for one of `ctx.slots`, which hand them out
        // by priority (kube's runner takes its waiting objects in no order). The runner still
        // runs one reconcile of an object at a time.
        .with_config(
            ControllerConfig::default()
                .concurrency(0)
                .debounce(Duration::ZERO),
        )
        .reconcile_on(requests)
        .reconcile_all_on(everything)
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile failed");
            }
        });
        let finished = tokio::select! {
            () = controller => true,
            // Dropping the controller aborts its reconciles: no write after this point.
            () = leadership.lost() => false,
        };
        *gate.lock().unwrap_or_else(|e| e.into_inner()) = None;
        ctx.metrics.leader.set(0);
        if finished {
            break;
        }
        tracing::warn!("lost leadership: reconciles aborted; standing by with warm caches");
    }
}

fn error_policy(aw: Arc<AppWrapper>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[error.metric_label()])
        .inc();
    match error {
        // Somebody (often ourselves) wrote the object since we read it: look again at once.
        Error::Conflict => Action::requeue(failures::CONFLICT_RETRY),
        // Counted by `failures::record` when the reconcile returned.
        _ => Action::requeue(ctx.failures.retry_after(&AwKey::new(
            aw.namespace().unwrap_or_default(),
            aw.name_any(),
        ))),
    }
}

/// When a reconcile skipped as stale looks again if no watch event came first.
const STALE_COPY_RECHECK: Duration = Duration::from_secs(1);

/// Slots of a context built without `run` (unit tests).
const DEFAULT_SLOTS: usize = 16;

/// Whose turn comes first when the slots are full: see [`slots`].
fn priority(aw: &AppWrapper) -> slots::Priority {
    let phase = aw.status.as_ref().map(|s| s.phase).unwrap_or_default();
    match phase {
        _ if aw.meta().deletion_timestamp.is_some() => slots::Priority::CleanUp,
        Phase::Empty | Phase::Suspended | Phase::Resuming | Phase::Running => {
            slots::Priority::Detect
        }
        _ => slots::Priority::CleanUp,
    }
}

/// Skips a copy this agent already wrote over: the watch event of the new version (on its way)
/// triggers the reconcile that counts, and its queue wait still runs from the first trigger.
/// The timer only covers a watch that lost the event.
fn skip_stale(aw: &AppWrapper, key: &AwKey, ctx: &Context) -> Option<Action> {
    if !ctx
        .written
        .is_stale(key, aw.meta().resource_version.as_deref())
    {
        return None;
    }
    ctx.metrics.reconciles_skipped_stale.inc();
    tracing::debug!(cluster = %ctx.cluster, namespace = %key.namespace, appwrapper = %key.name,
        "cached copy older than our last write; skipped");
    Some(Action::requeue(STALE_COPY_RECHECK))
}

async fn reconcile(aw: Arc<AppWrapper>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = AwKey::new(aw.namespace().unwrap_or_default(), aw.name_any());
    if let Some(skip) = skip_stale(&aw, &key, &ctx) {
        return Ok(skip);
    }
    let permit = ctx.slots.acquire(priority(&aw)).await;
    // The copy handed in may have aged while this waited for a slot: take the cache's latest.
    let aw = match &ctx.store {
        Some(store) => match store.get(&ObjectRef::from_obj(&*aw)) {
            Some(latest) => latest,
            None => return Ok(Action::await_change()),
        },
        None => aw,
    };
    if let Some(skip) = skip_stale(&aw, &key, &ctx) {
        return Ok(skip);
    }
    let started = Instant::now();
    let queue_wait = ctx.queue.started(&key, started);
    if let Some(wait) = queue_wait {
        ctx.metrics.reconcile_queue_wait.observe(wait.as_secs_f64());
    }
    let span = tracing::info_span!("reconcile", cluster = %ctx.cluster, namespace = %key.namespace, appwrapper = %key.name,
        queue_wait_ms = queue_wait.map(|w| w.as_secs_f64() * 1000.0));
    ctx.metrics.reconciles.inc();
    let result = reconcile_appwrapper(&aw, &ctx, permit)
        .instrument(span.clone())
        .await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    failures::record(&aw, &result, &ctx).instrument(span).await;
    result
}

/// One reconcile in `permit`'s slot; the slot is given back before the Events are published
/// (best effort, and no input of any decision).
async fn reconcile_appwrapper(
    aw: &AppWrapper,
    ctx: &Context,
    permit: slots::Permit,
) -> Result<Action, Error> {
    let key = AwKey::new(aw.namespace().unwrap_or_default(), aw.name_any());
    let has_finalizer = aw.finalizers().iter().any(|f| f == FINALIZER);
    let deleting = aw.meta().deletion_timestamp.is_some();
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    let (params, problems) =
        Params::from_annotations(aw.annotations(), &ctx.config.fault_tolerance);
    let status = aw.status.clone().unwrap_or_default();
    let mut observation = observe::observe(aw, &status, &key, &params, ctx).await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let uid = aw.uid().unwrap_or_default();
    let common = Common {
        aw,
        uid: &uid,
        params: &params,
        problems: &problems,
        deleting,
        has_finalizer,
        now,
    };
    let (decision, mut phase_changes) = machine::steps(&common.input(&status, &observation));

    let mut writer = apply::Writer::new(aw, ctx);
    if decision.finalizer == FinalizerChange::Add {
        writer.add_finalizer().await?;
    }
    writer.write_status(&status, &decision.status).await?;
    for (_, to) in &phase_changes {
        if matches!(to, Phase::Failed | Phase::Resetting) {
            tracing::debug!(target: stages::TARGET, stage = stages::APPWRAPPER_FAILED_WRITTEN,
                cluster = %ctx.cluster, namespace = %key.namespace, appwrapper = %key.name, phase = %to);
        }
    }
    let mut final_decision = decision.clone();
    if !decision.actions.create.is_empty() {
        // Identities are recorded; now create, then let the machine judge the results.
        let results =
            apply::create_components(aw, &decision.status, &decision.actions.create, ctx).await;
        observation.create_results = Some(results);
        let after = machine::step(&common.input(&decision.status, &observation));
        writer.write_status(&decision.status, &after.status).await?;
        phase_changes.extend(after.phase_change);
        let mut events = decision.events.clone();
        events.extend(after.events.iter().cloned());
        final_decision = after;
        final_decision.events = events;
    }
    apply::deletions(
        aw,
        &final_decision.status,
        &final_decision.actions,
        &key,
        ctx,
    )
    .await?;
    for (from, to) in phase_changes {
        tracing::info!(from = %from, to = %to, "phase changed");
        ctx.metrics
            .phase_total
            .with_label_values(&[key.namespace.as_str(), to.as_str()])
            .inc();
        if matches!(to, Phase::Resetting | Phase::Failed) {
            let reason = final_decision
                .status
                .transitions
                .iter()
                .rev()
                .find(|t| t.phase == to)
                .map(|t| t.reason.clone())
                .unwrap_or_default();
            ctx.metrics
                .resets
                .with_label_values(&[reason.as_str(), to.as_str()])
                .inc();
        }
    }
    drop(permit);
    apply::publish_events(aw, &final_decision.events, ctx).await;
    if final_decision.finalizer == FinalizerChange::Remove {
        writer.remove_finalizer().await?;
        // Released: no later version of this object needs waiting for.
        ctx.written.settled(&key);
        return Ok(Action::await_change());
    }
    Ok(match final_decision.requeue_after {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// What both steps of one reconcile share.
struct Common<'a> {
    aw: &'a AppWrapper,
    uid: &'a str,
    params: &'a Params,
    problems: &'a [crate::params::AnnotationProblem],
    deleting: bool,
    has_finalizer: bool,
    now: k8s_openapi::jiff::Timestamp,
}

impl Common<'_> {
    fn input<'b>(
        &'b self,
        status: &'b lifeboat_api::appwrapper::AppWrapperStatus,
        observation: &'b crate::machine::Observation,
    ) -> Input<'b> {
        Input {
            spec: &self.aw.spec,
            status,
            uid: self.uid,
            generation: self.aw.meta().generation,
            deleting: self.deleting,
            has_finalizer: self.has_finalizer,
            params: self.params,
            annotation_problems: self.problems,
            observation,
            now: self.now,
        }
    }
}
