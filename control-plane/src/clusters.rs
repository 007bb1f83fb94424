//! Cluster health: the hub's view of whether each member's agent is alive, from the Lease the
//! agent renews through its heartbeats (`cluster-<name>` in the hub namespace).
//!
//! - Lease renewed within its duration → `Ready=True` (reason `ClusterReady`), no taint.
//! - Not renewed within its duration → `Ready=Unknown` (reason `ClusterStatusUnknown`, the last
//!   renewal in the message) and the taint `cluster.lifeboat.dev/unreachable:NoSchedule`.
//! - No agent ever registered → `Ready=Unknown` (reason `AgentNotRegistered`) and the taint.
//! - Lease renewed, but the agent's heartbeats say its member's kube-apiserver has not answered
//!   it for its bound (the heartbeat handler keeps that on the Lease,
//!   [`ANNOTATION_MEMBER_API_UNREACHABLE_SINCE`]) → `Ready=False` (reason `MemberAPIUnreachable`)
//!   and the taint `cluster.lifeboat.dev/not-ready:NoSchedule`: the agent is alive but can do
//!   nothing in its cluster, so the cluster counts as lost for failover like an expired lease.
//!
//! A new leader gives every lease a full duration from the moment it starts leading (agents
//! renew through the hub, so none could while there was no leader). The monitor is the only
//! writer of the `Ready` condition (the condition list is atomic: one owner) and of the
//! unreachable and not-ready taints (server-side apply, field manager [`FIELD_MANAGER`], owning
//! only that item of the `spec.taints` list-map). Each transition gets an Event on the Cluster and goes out on a
//! broadcast channel for the failover code.
//!
//! [`judge`] is the pure decision; [`ClusterHealthMonitor::run`] is the IO around it. The monitor
//! also keeps the hub's finalizer on every Cluster and lets deleted ones go once their agent has
//! stopped ([`crate::cluster_removal`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use lifeboat_api::cluster::{
    CONDITION_READY, Cluster, ClusterStatus, GPU_RESOURCE, HUB_SYSTEM_NAMESPACE,
    REASON_CLUSTER_READY, REASON_LEASE_EXPIRED, REASON_MEMBER_API_UNREACHABLE,
    REASON_NOT_REGISTERED, TAINT_NOT_READY, TAINT_UNREACHABLE,
};
// The Lease names and annotations are the contract with the agent API's heartbeat: lifeboat-api.
pub use lifeboat_api::cluster::{ANNOTATION_MEMBER_API_UNREACHABLE_SINCE, lease_name};
use lifeboat_api::quantity::Quantity;
use prometheus::{IntGaugeVec, Opts, Registry};
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;
use tracing::Instrument;

use crate::agentapi::auth::CLUSTER_NAME_LABEL;
use crate::agentapi::spawn_reflector;
use crate::cluster_removal::ClusterRemoval;
use crate::leadership::LeaderState;

/// Field manager of the `Ready` condition and the unreachable taint.
pub const FIELD_MANAGER: &str = "lifeboat-hub/cluster-health";
/// Event reasons.
pub const EVENT_READY: &str = "ClusterReady";
pub const EVENT_UNREACHABLE: &str = "ClusterUnreachable";
pub const EVENT_NOT_READY: &str = "ClusterNotReady";
/// The effect of the unreachable and not-ready taints.
pub const TAINT_EFFECT: &str = "NoSchedule";
/// The taints this monitor owns.
const MONITOR_TAINTS: [&str; 2] = [TAINT_UNREACHABLE, TAINT_NOT_READY];
/// After a write, how long the monitor trusts it over a Cluster cache that does not show it yet.
const WRITE_SETTLE: Duration = Duration::from_secs(5);

/// Settings of the monitor.
#[derive(Debug, Clone)]
pub struct ClusterHealthConfig {
    /// Namespace of the Leases.
    pub namespace: String,
    /// Lease duration for a Lease that does not say its own (the agent API writes it).
    pub lease_duration: Duration,
    /// Leases are checked at least this often (and at each expiry, and on each change).
    pub period: Duration,
    /// A Cluster nobody registered yet is left alone this long after its creation (its agent
    /// may be registering right now).
    pub registration_grace: Duration,
    /// Only Clusters matching this label selector (shards; tests). `None`: every Cluster.
    pub cluster_selector: Option<String>,
}

impl Default for ClusterHealthConfig {
    fn default() -> Self {
        ClusterHealthConfig {
            namespace: HUB_SYSTEM_NAMESPACE.to_string(),
            lease_duration: Duration::from_secs(40),
            period: Duration::from_secs(1),
            registration_grace: Duration::from_secs(5),
            cluster_selector: None,
        }
    }
}

/// Whether a cluster's agent is alive, as the hub sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClusterHealth {
    /// The Lease is fresh.
    Ready,
    /// The Lease expired (or vanished).
    Unreachable,
    /// No agent ever registered.
    NotRegistered,
    /// The Lease is fresh, but the agent reports that the member's kube-apiserver does not
    /// answer it.
    MemberApiUnreachable,
}

impl ClusterHealth {
    /// The `Ready` condition status.
    pub fn condition_status(self) -> &'static str {
        match self {
            ClusterHealth::Ready => "True",
            ClusterHealth::MemberApiUnreachable => "False",
            _ => "Unknown",
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            ClusterHealth::Ready => REASON_CLUSTER_READY,
            ClusterHealth::Unreachable => REASON_LEASE_EXPIRED,
            ClusterHealth::NotRegistered => REASON_NOT_REGISTERED,
            ClusterHealth::MemberApiUnreachable => REASON_MEMBER_API_UNREACHABLE,
        }
    }

    pub fn tainted(self) -> bool {
        self.taint_key().is_some()
    }

    /// The NoSchedule taint the Cluster carries in this health: `not-ready` when the cluster
    /// reports itself not ready, `unreachable` when its agent is not heard from.
    pub fn taint_key(self) -> Option<&'static str> {
        match self {
            ClusterHealth::Ready => None,
            ClusterHealth::MemberApiUnreachable => Some(TAINT_NOT_READY),
            ClusterHealth::Unreachable | ClusterHealth::NotRegistered => Some(TAINT_UNREACHABLE),
        }
    }

    /// `lifeboat_hub_cluster_ready`: 1 True, 0 False, -1 Unknown.
    pub fn metric_value(self) -> i64 {
        match self {
            ClusterHealth::Ready => 1,
            ClusterHealth::MemberApiUnreachable => 0,
            _ => -1,
        }
    }

    /// The health a Cluster's `Ready` condition shows, if it has one this monitor wrote.
    pub fn from_condition(condition: &Condition) -> Option<ClusterHealth> {
        match (condition.status.as_str(), condition.reason.as_str()) {
            ("True", _) => Some(ClusterHealth::Ready),
            ("Unknown", REASON_NOT_REGISTERED) => Some(ClusterHealth::NotRegistered),
            ("Unknown", _) => Some(ClusterHealth::Unreachable),
            ("False", REASON_MEMBER_API_UNREACHABLE) => Some(ClusterHealth::MemberApiUnreachable),
            _ => None,
        }
    }
}

/// The monitor's judgement of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub health: ClusterHealth,
    pub message: String,
    /// When a Ready cluster's lease expires (the monitor wakes up then).
    pub expires: Option<Timestamp>,
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// What a cluster's Lease says about its agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTerms<'a> {
    /// The last renewal, if the Lease was ever renewed.
    pub renewed: Option<Timestamp>,
    /// The Lease's duration (the default when it does not say).
    pub duration: Duration,
    /// The agent holding it ("unknown" when it does not say).
    pub holder: &'a str,
}

impl<'a> LeaseTerms<'a> {
    pub fn of(lease: Option<&'a Lease>, default_duration: Duration) -> LeaseTerms<'a> {
        let spec = lease.and_then(|l| l.spec.as_ref());
        LeaseTerms {
            renewed: spec
                .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
                .map(|t| t.0),
            duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or(default_duration),
            holder: spec
                .and_then(|s| s.holder_identity.as_deref())
                .unwrap_or("unknown"),
        }
    }

    /// When the Lease runs out: a full duration after the last renewal, and never before a full
    /// duration after `leading_since` (agents renew through the hub, so none could while no hub
    /// led). `None`: never renewed.
    pub fn expires(&self, leading_since: Timestamp) -> Option<Timestamp> {
        self.renewed
            .map(|renewed| plus(renewed.max(leading_since), self.duration))
    }

    /// When a registered agent whose Lease is gone counts as lost: one duration after the
    /// Cluster's creation, or after `leading_since` when later.
    pub fn lost_without_lease(&self, cluster: &Cluster, leading_since: Timestamp) -> Timestamp {
        plus(
            created_at(cluster, leading_since).max(leading_since),
            self.duration,
        )
    }
}

/// When `cluster` was created (`otherwise` when it does not say).
fn created_at(cluster: &Cluster, otherwise: Timestamp) -> Timestamp {
    cluster
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(otherwise)
}

/// Posts `event` on `cluster`. A failure is logged, not retried: the Event records, it decides
/// nothing.
pub(crate) async fn post_event(recorder: &Recorder, cluster: &Cluster, event: Event) {
    if let Err(error) = recorder.publish(&event, &cluster.object_ref(&())).await {
        tracing::warn!(%error, reason = %event.reason, "publishing an Event on the Cluster failed");
    }
}

/// Judges `cluster` from its Lease at `now`. `leading_since`: when this hub started leading
/// (no lease is considered expired before a full duration from then). `None`: too early to say.
pub fn judge(
    cluster: &Cluster,
    lease: Option<&Lease>,
    now: Timestamp,
    leading_since: Timestamp,
    config: &ClusterHealthConfig,
) -> Option<Verdict> {
    let terms = LeaseTerms::of(lease, config.lease_duration);
    let (duration, holder) = (terms.duration, terms.holder);
    if let (Some(renewed), Some(expires)) = (terms.renewed, terms.expires(leading_since)) {
        let member_api_silent_since = lease
            .and_then(|l| l.metadata.annotations.as_ref())
            .and_then(|a| a.get(ANNOTATION_MEMBER_API_UNREACHABLE_SINCE))
            .and_then(|since| since.parse::<Timestamp>().ok());
        return Some(if now < expires {
            match member_api_silent_since {
                Some(since) => Verdict {
                    health: ClusterHealth::MemberApiUnreachable,
                    message: format!(
                        "the agent ({holder}) renews the cluster's lease but reports that the \
                         member's kube-apiserver has not answered it since {since}"
                    ),
                    expires: Some(expires),
                },
                None => Verdict {
                    health: ClusterHealth::Ready,
                    message: format!("the agent ({holder}) renews the cluster's lease"),
                    expires: Some(expires),
                },
            }
        } else {
            Verdict {
                health: ClusterHealth::Unreachable,
                message: format!(
                    "the agent ({holder}) last renewed the cluster's lease at {renewed} and the \
                     lease ({}s) expired at {expires}",
                    duration.as_secs()
                ),
                expires: None,
            }
        });
    }
    let created = created_at(cluster, leading_since);
    let registered = cluster.status.as_ref().and_then(|s| s.agent.as_ref());
    match registered {
        None if now < plus(created, config.registration_grace) => None,
        None => Some(Verdict {
            health: ClusterHealth::NotRegistered,
            message: "no agent has registered for this cluster".into(),
            expires: None,
        }),
        Some(agent) => {
            // Registered, but the Lease is gone: give it one duration.
            (now >= terms.lost_without_lease(cluster, leading_since)).then(|| Verdict {
                health: ClusterHealth::Unreachable,
                message: format!(
                    "the agent ({}) registered but the cluster has no lease",
                    agent.identity
                ),
                expires: None,
            })
        }
    }
}

/// What a Cluster shows of the monitor's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub ready: Option<Condition>,
    pub taint: Option<Taint>,
    /// `status.notReadySince`.
    pub not_ready_since: Option<MicroTime>,
}

impl Shown {
    pub fn of(cluster: &Cluster) -> Shown {
        Shown {
            ready: cluster
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_READY))
                .cloned(),
            taint: cluster
                .spec
                .taints
                .iter()
                .find(|t| is_monitor_taint(t))
                .cloned(),
            not_ready_since: cluster
                .status
                .as_ref()
                .and_then(|s| s.not_ready_since.clone()),
        }
    }

    pub fn health(&self) -> Option<ClusterHealth> {
        self.ready.as_ref().and_then(ClusterHealth::from_condition)
    }

    /// Whether the Cluster already shows `health` (condition status and reason, and the taint).
    pub fn matches(&self, health: ClusterHealth) -> bool {
        self.ready
            .as_ref()
            .is_some_and(|c| c.status == health.condition_status() && c.reason == health.reason())
            && self.taint.as_ref().map(|t| t.key.as_str()) == health.taint_key()
    }
}

/// One of the NoSchedule taints this monitor owns.
fn is_monitor_taint(taint: &Taint) -> bool {
    MONITOR_TAINTS.contains(&taint.key.as_str()) && taint.effect == TAINT_EFFECT
}

/// The `Ready` condition for `verdict`; the transition time stays when the status does.
pub fn ready_condition(
    verdict: &Verdict,
    shown: &Shown,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let last_transition_time = shown
        .ready
        .as_ref()
        .filter(|c| c.status == verdict.health.condition_status())
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: CONDITION_READY.to_string(),
        status: verdict.health.condition_status().to_string(),
        reason: verdict.health.reason().to_string(),
        message: verdict.message.clone(),
        last_transition_time,
        observed_generation: generation,
    }
}

/// `status.notReadySince` for `verdict`: none while Ready; kept while the condition keeps its
/// status (and so its transition time); else `now` to the microsecond, never earlier
/// (`lifeboat_api::time::stored`). A not-Ready Cluster an older hub wrote has none, and keeps
/// none until its next transition: its toleration counts from the end of the condition's second.
pub fn not_ready_since(verdict: &Verdict, shown: &Shown, now: Timestamp) -> Option<MicroTime> {
    if verdict.health == ClusterHealth::Ready {
        return None;
    }
    let kept = shown
        .ready
        .as_ref()
        .is_some_and(|c| c.status == verdict.health.condition_status());
    if kept {
        shown.not_ready_since.clone()
    } else {
        Some(lifeboat_api::time::stored(now))
    }
}

/// A change of a cluster's health.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadinessTransition {
    pub cluster: String,
    /// `None`: the cluster had no verdict before.
    pub from: Option<ClusterHealth>,
    pub to: ClusterHealth,
    pub message: String,
    pub at: Time,
}

/// The `state` label values of `lifeboat_hub_cluster_gpus`, in the order of
/// [`FleetGaugeValues::gpus`].
pub const GPU_STATES: [&str; 2] = ["allocatable", "allocated"];
/// The `condition` label values of `lifeboat_hub_cluster_nodes`, in the order of
/// [`FleetGaugeValues::nodes`].
pub const NODE_CONDITIONS: [&str; 3] = ["not_ready", "autopilot_flagged", "spot_reclaiming"];

/// What the fleet gauges show of one cluster, from the inventory its agent reports into the
/// Cluster's status. `None`: not reported yet (no series, rather than a zero that would claim a
/// cluster without GPUs or without bad nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FleetGaugeValues {
    /// `nvidia.com/gpu` allocatable and allocated (whole GPUs), by [`GPU_STATES`]; a reported
    /// summary without GPUs is zero. `None` too when a quantity does not parse.
    pub gpus: Option<[i64; 2]>,
    /// Nodes NotReady, Autopilot-flagged and with a spot reclamation notice, by
    /// [`NODE_CONDITIONS`].
    pub nodes: Option<[i64; 3]>,
}

impl FleetGaugeValues {
    pub fn of(status: Option<&ClusterStatus>) -> FleetGaugeValues {
        let gpus = status
            .and_then(|s| s.resource_summary.as_ref())
            .and_then(|summary| {
                let whole =
                    |list: &lifeboat_api::cluster::ResourceList| match list.get(GPU_RESOURCE) {
                        None => Some(0),
                        Some(q) => Quantity::parse(&q.0).ok().map(|q| q.value()),
                    };
                Some([whole(&summary.allocatable)?, whole(&summary.allocated)?])
            });
        let nodes = status.and_then(|s| s.node_health.as_ref()).map(|health| {
            [
                i64::from(health.not_ready),
                i64::from(health.autopilot_flagged),
                i64::from(health.spot_reclaiming),
            ]
        });
        FleetGaugeValues { gpus, nodes }
    }
}

/// `lifeboat_hub_cluster_gpus{cluster,state}` and `lifeboat_hub_cluster_nodes{cluster,condition}`.
/// One label set per cluster and value (bounded by the fleet, like `lifeboat_hub_cluster_ready`;
/// no node names).
#[derive(Clone)]
struct FleetGauges {
    gpus: IntGaugeVec,
    nodes: IntGaugeVec,
}

impl FleetGauges {
    fn new(registry: &Registry) -> Result<FleetGauges, prometheus::Error> {
        let gpus = IntGaugeVec::new(
            Opts::new(
                "lifeboat_hub_cluster_gpus",
                "nvidia.com/gpu of each member cluster as its agent reports it: allocatable (ready, \
                 schedulable nodes) and allocated (requests of the pods bound to them)",
            ),
            &["cluster", "state"],
        )?;
        let nodes = IntGaugeVec::new(
            Opts::new(
                "lifeboat_hub_cluster_nodes",
                "Nodes of each member cluster that cannot or soon will not run work, as its agent \
                 reports them: not_ready, autopilot_flagged, spot_reclaiming",
            ),
            &["cluster", "condition"],
        )?;
        registry.register(Box::new(gpus.clone()))?;
        registry.register(Box::new(nodes.clone()))?;
        Ok(FleetGauges { gpus, nodes })
    }

    /// Sets every value of `cluster`, zeros included (so the series exist), and removes those
    /// not reported.
    fn set(&self, cluster: &str, values: FleetGaugeValues) {
        set_or_remove(&self.gpus, cluster, &GPU_STATES, values.gpus.as_ref());
        set_or_remove(
            &self.nodes,
            cluster,
            &NODE_CONDITIONS,
            values.nodes.as_ref(),
        );
    }

    fn remove(&self, cluster: &str) {
        self.set(cluster, FleetGaugeValues::default());
    }

    fn reset(&self) {
        self.gpus.reset();
        self.nodes.reset();
    }
}

fn set_or_remove<const N: usize>(
    gauge: &IntGaugeVec,
    cluster: &str,
    labels: &[&str; N],
    values: Option<&[i64; N]>,
) {
    for (i, label) in labels.iter().enumerate() {
        match values {
            Some(values) => gauge.with_label_values(&[cluster, label]).set(values[i]),
            None => {
                let _ = gauge.remove_label_values(&[cluster, label]);
            }
        }
    }
}

/// The cluster health monitor.
pub struct ClusterHealthMonitor {
    config: ClusterHealthConfig,
    client: kube::Client,
    ready_gauge: IntGaugeVec,
    fleet_gauges: FleetGauges,
    transitions: broadcast::Sender<ReadinessTransition>,
    readiness: watch::Sender<BTreeMap<String, ClusterHealth>>,
    recorder: Recorder,
}

struct Remembered {
    health: ClusterHealth,
    written: Option<Instant>,
}

impl ClusterHealthMonitor {
    /// Creates the monitor and registers `lifeboat_hub_cluster_ready{cluster}`,
    /// `lifeboat_hub_cluster_gpus{cluster,state}` and `lifeboat_hub_cluster_nodes{cluster,condition}`
    /// in `registry`.
    pub fn new(
        config: ClusterHealthConfig,
        client: kube::Client,
        registry: &Registry,
    ) -> Result<ClusterHealthMonitor, prometheus::Error> {
        let ready_gauge = IntGaugeVec::new(
            Opts::new(
                "lifeboat_hub_cluster_ready",
                "Ready condition of each member cluster: 1 True, 0 False, -1 Unknown",
            ),
            &["cluster"],
        )?;
        registry.register(Box::new(ready_gauge.clone()))?;
        let fleet_gauges = FleetGauges::new(registry)?;
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "lifeboat-hub".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Ok(ClusterHealthMonitor {
            config,
            client,
            ready_gauge,
            fleet_gauges,
            transitions: broadcast::channel(1024).0,
            readiness: watch::channel(BTreeMap::new()).0,
            recorder,
        })
    }

    /// Every transition from now on (a slow receiver loses the oldest: read
    /// [`ClusterHealthMonitor::readiness`] for the current state).
    pub fn subscribe(&self) -> broadcast::Receiver<ReadinessTransition> {
        self.transitions.subscribe()
    }

    /// The current health of every judged cluster.
    pub fn readiness(&self) -> watch::Receiver<BTreeMap<String, ClusterHealth>> {
        self.readiness.subscribe()
    }

    /// Watches Clusters and Leases and keeps the clusters' health while this hub leads, until
    /// `shutdown` completes.
    pub async fn run(
        self,
        mut leadership: watch::Receiver<LeaderState>,
        shutdown: impl Future<Output = ()>,
    ) {
        let wake = Arc::new(Notify::new());
        let mut cluster_watch = watcher::Config::default();
        if let Some(selector) = &self.config.cluster_selector {
            cluster_watch = cluster_watch.labels(selector);
        }
        let (clusters, cluster_task) = spawn_reflector(
            Api::<Cluster>::all(self.client.clone()),
            cluster_watch,
            "Clusters (cluster health)",
            Some(wake.clone()),
        );
        let (leases, lease_task) = spawn_reflector(
            Api::<Lease>::namespaced(self.client.clone(), &self.config.namespace),
            watcher::Config::default().labels(CLUSTER_NAME_LABEL),
            "cluster Leases",
            Some(wake.clone()),
        );
        let _abort = AbortOnDrop(vec![cluster_task, lease_task]);
        let mut removal = ClusterRemoval::new(
            self.client.clone(),
            self.config.namespace.clone(),
            self.config.lease_duration,
            self.recorder.clone(),
        );
        let mut shutdown = std::pin::pin!(shutdown);
        let mut memory: HashMap<String, Remembered> = HashMap::new();
        let mut with_fleet_gauges: BTreeSet<String> = BTreeSet::new();
        let mut leading_since: Option<Timestamp> = None;
        let mut next_wake = Instant::now();
        loop {
            let leading = leadership.borrow().is_leader;
            match (leading, leading_since) {
                (true, None) => {
                    leading_since = Some(Timestamp::now());
                    memory.clear();
                    let _ = tokio::time::timeout(Duration::from_secs(30), async {
                        let _ = clusters.wait_until_ready().await;
                        let _ = leases.wait_until_ready().await;
                    })
                    .await;
                }
                (false, Some(_)) => {
                    leading_since = None;
                    // Only the leader exports the per-cluster gauges: a former leader's would
                    // go stale, and sums over the replicas would count each cluster twice.
                    self.ready_gauge.reset();
                    self.fleet_gauges.reset();
                    with_fleet_gauges.clear();
                }
                _ => {}
            }
            if let Some(since) = leading_since {
                let soonest = self.evaluate(&clusters, &leases, since, &mut memory).await;
                let released = removal.pass(&clusters, &leases, since).await;
                let soonest = match (soonest, released) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                self.export_fleet(&clusters, &mut with_fleet_gauges);
                let period = Instant::now() + self.config.period;
                next_wake = soonest
                    .and_then(|t| Timestamp::now().duration_until(t).try_into().ok())
                    .map(|d: Duration| (Instant::now() + d + Duration::from_millis(5)).min(period))
                    .unwrap_or(period);
            }
            tokio::select! {
                _ = &mut shutdown => return,
                changed = leadership.changed() => if changed.is_err() { return },
                _ = wake.notified() => {}
                _ = tokio::time::sleep_until(next_wake), if leading_since.is_some() => {}
            }
        }
    }

    /// Sets the fleet gauges of every Cluster in the cache from its status, and removes those of
    /// Clusters deleted (or being deleted) since the last pass.
    fn export_fleet(&self, clusters: &Store<Cluster>, exported: &mut BTreeSet<String>) {
        let mut present = BTreeSet::new();
        for cluster in clusters.state() {
            if cluster.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let name = cluster.name_any();
            self.fleet_gauges
                .set(&name, FleetGaugeValues::of(cluster.status.as_ref()));
            present.insert(name);
        }
        for gone in exported.difference(&present) {
            self.fleet_gauges.remove(gone);
        }
        *exported = present;
    }

    /// Judges every cluster, writes what differs; returns the soonest lease expiry.
    async fn evaluate(
        &self,
        clusters: &Store<Cluster>,
        leases: &Store<Lease>,
        leading_since: Timestamp,
        memory: &mut HashMap<String, Remembered>,
    ) -> Option<Timestamp> {
        let now = Timestamp::now();
        let mut soonest: Option<Timestamp> = None;
        let mut present = BTreeMap::new();
        for cluster in clusters.state() {
            let name = cluster.name_any();
            if cluster.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let lease =
                leases.get(&ObjectRef::new(&lease_name(&name)).within(&self.config.namespace));
            let Some(verdict) = judge(&cluster, lease.as_deref(), now, leading_since, &self.config)
            else {
                continue;
            };
            if let Some(expires) = verdict.expires {
                soonest = Some(soonest.map_or(expires, |s| s.min(expires)));
            }
            present.insert(name.clone(), verdict.health);
            let shown = Shown::of(&cluster);
            let remembered = memory.get(&name);
            let known = remembered.map(|r| r.health).or_else(|| shown.health());
            if shown.matches(verdict.health) {
                memory.insert(
                    name,
                    Remembered {
                        health: verdict.health,
                        written: None,
                    },
                );
                continue;
            }
            if remembered.is_some_and(|r| {
                r.health == verdict.health && r.written.is_some_and(|w| w.elapsed() < WRITE_SETTLE)
            }) {
                continue; // written; the cache has not caught up yet
            }
            // Instrumented, not entered: an entered span must not live across an await.
            let span = tracing::info_span!("cluster_health", cluster = %name);
            let written = self
                .write(&cluster, &verdict, &shown, now)
                .instrument(span.clone())
                .await;
            match written {
                Ok(()) => {
                    memory.insert(
                        name.clone(),
                        Remembered {
                            health: verdict.health,
                            written: Some(Instant::now()),
                        },
                    );
                    if known != Some(verdict.health) {
                        self.announce(&cluster, known, &verdict, now)
                            .instrument(span)
                            .await;
                    }
                }
                Err(error) => span.in_scope(|| {
                    tracing::warn!(%error, health = ?verdict.health, "writing the cluster's health failed; retrying")
                }),
            }
        }
        // Gauges and the snapshot follow the clusters that exist.
        let previous = self.readiness.borrow().clone();
        for gone in previous.keys().filter(|c| !present.contains_key(*c)) {
            let _ = self.ready_gauge.remove_label_values(&[gone]);
            memory.remove(gone);
        }
        for (cluster, health) in &present {
            self.ready_gauge
                .with_label_values(&[cluster])
                .set(health.metric_value());
        }
        if previous != present {
            self.readiness.send_replace(present);
        }
        soonest
    }

    /// Writes the condition and the taint. Unhealthy: taint first (the scheduler reads it),
    /// then the condition; healthy: condition first, then the taint goes.
    async fn write(
        &self,
        cluster: &Cluster,
        verdict: &Verdict,
        shown: &Shown,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        let name = cluster.name_any();
        let api: Api<Cluster> = Api::all(self.client.clone());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let condition = ready_condition(verdict, shown, cluster.metadata.generation, now);
        let mut fields = serde_json::json!({"conditions": [condition]});
        if let Some(since) = not_ready_since(verdict, shown, now) {
            // Left out once Ready: server-side apply then removes it.
            fields["notReadySince"] = serde_json::json!(since);
        }
        let status = serde_json::json!({
            "apiVersion": Cluster::api_version(&()),
            "kind": Cluster::kind(&()),
            "metadata": {"name": name},
            "status": fields,
        });
        if let Some(key) = verdict.health.taint_key() {
            // Applying only this one removes the other taint of this manager, if it was set.
            let taint = Taint {
                key: key.to_string(),
                effect: TAINT_EFFECT.to_string(),
                value: None,
                time_added: shown
                    .taint
                    .as_ref()
                    .filter(|t| t.key == key)
                    .and_then(|t| t.time_added.clone())
                    .or(Some(Time(now))),
            };
            let spec = serde_json::json!({
                "apiVersion": Cluster::api_version(&()),
                "kind": Cluster::kind(&()),
                "metadata": {"name": name},
                "spec": {"taints": [taint]},
            });
            api.patch(&name, &params, &Patch::Apply(&spec)).await?;
            api.patch_status(&name, &params, &Patch::Apply(&status))
                .await?;
        } else {
            let mut after = api
                .patch_status(&name, &params, &Patch::Apply(&status))
                .await?;
            // Removed with a guarded JSON patch rather than by applying without it: applying a
            // spec that ends up empty would drop the (required) spec, and a taint someone else
            // added must go as well (this monitor is the authority on it).
            while let Some((index, key)) = after
                .spec
                .taints
                .iter()
                .enumerate()
                .find(|(_, t)| is_monitor_taint(t))
                .map(|(i, t)| (i, t.key.clone()))
            {
                let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
                    {"op": "test", "path": format!("/spec/taints/{index}/key"), "value": key},
                    {"op": "test", "path": format!("/spec/taints/{index}/effect"), "value": TAINT_EFFECT},
                    {"op": "remove", "path": format!("/spec/taints/{index}")},
                ]))
                .map_err(kube::Error::SerdeError)?;
                after = api
                    .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
                    .await?;
            }
        }
        Ok(())
    }

    async fn announce(
        &self,
        cluster: &Cluster,
        from: Option<ClusterHealth>,
        verdict: &Verdict,
        now: Timestamp,
    ) {
        let name = cluster.name_any();
        let (type_, reason) = match verdict.health {
            ClusterHealth::Ready => (EventType::Normal, EVENT_READY),
            ClusterHealth::MemberApiUnreachable => (EventType::Warning, EVENT_NOT_READY),
            _ => (EventType::Warning, EVENT_UNREACHABLE),
        };
        if verdict.health == ClusterHealth::Ready {
            tracing::info!(from = ?from, "cluster ready");
        } else {
            tracing::warn!(from = ?from, to = ?verdict.health, message = %verdict.message, "cluster not ready");
        }
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(&verdict.message, 1000)),
            action: "MonitorLease".into(),
            secondary: None,
        };
        post_event(&self.recorder, cluster, event).await;
        let _ = self.transitions.send(ReadinessTransition {
            cluster: name,
            from,
            to: verdict.health,
            message: verdict.message.clone(),
            at: Time(now),
        });
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::ObjectMeta;
    use lifeboat_api::cluster::{AgentInfo, ClusterSpec, ClusterStatus};

    /// `second` seconds after a fixed instant.
    pub(crate) fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_780_000_000 + second).unwrap()
    }

    /// A Cluster created at `at(created)`, with an agent in its status when `registered`.
    pub(crate) fn cluster(created: i64, registered: bool) -> Cluster {
        let mut c = Cluster::new("gpu-east", ClusterSpec::default());
        c.metadata.creation_timestamp = Some(Time(at(created)));
        if registered {
            c.status = Some(ClusterStatus {
                agent: Some(AgentInfo {
                    identity: "agent-0".into(),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        c
    }

    fn lease(renewed: i64, seconds: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some("agent-0".into()),
                lease_duration_seconds: Some(seconds),
                renew_time: Some(MicroTime(at(renewed))),
                ..Default::default()
            }),
        }
    }

    fn config() -> ClusterHealthConfig {
        ClusterHealthConfig::default()
    }

    fn health(v: Option<Verdict>) -> Option<ClusterHealth> {
        v.map(|v| v.health)
    }

    #[test]
    fn a_lease_not_renewed_within_its_duration_makes_the_cluster_unreachable() {
        let c = cluster(0, true);
        let l = lease(100, 40);
        let j = |now| judge(&c, Some(&l), at(now), at(0), &config());
        assert_eq!(health(j(139)), Some(ClusterHealth::Ready));
        assert_eq!(j(139).unwrap().expires, Some(at(140)));
        assert_eq!(health(j(140)), Some(ClusterHealth::Unreachable));
        let message = j(141).unwrap().message;
        assert!(
            message.contains("agent-0") && message.contains("40s"),
            "{message}"
        );
        // renewed again: ready
        let renewed = lease(141, 40);
        assert_eq!(
            health(judge(&c, Some(&renewed), at(141), at(0), &config())),
            Some(ClusterHealth::Ready)
        );
    }

    #[test]
    fn a_new_leader_gives_every_lease_a_full_duration() {
        let c = cluster(0, true);
        let l = lease(100, 40);
        // the hub was down from 100 to 200: the lease is long expired, but leading since 200
        assert_eq!(
            health(judge(&c, Some(&l), at(210), at(200), &config())),
            Some(ClusterHealth::Ready)
        );
        assert_eq!(
            health(judge(&c, Some(&l), at(240), at(200), &config())),
            Some(ClusterHealth::Unreachable)
        );
    }

    #[test]
    fn clusters_without_a_lease() {
        // never registered: after the registration grace
        let c = cluster(100, false);
        assert_eq!(health(judge(&c, None, at(102), at(0), &config())), None);
        assert_eq!(
            health(judge(&c, None, at(105), at(0), &config())),
            Some(ClusterHealth::NotRegistered)
        );
        // registered but the lease is gone: after one duration
        let c = cluster(100, true);
        assert_eq!(health(judge(&c, None, at(139), at(0), &config())), None);
        assert_eq!(
            health(judge(&c, None, at(140), at(0), &config())),
            Some(ClusterHealth::Unreachable)
        );
    }

    #[test]
    fn a_member_api_reported_silent_makes_a_renewed_cluster_not_ready() {
        let c = cluster(0, true);
        let mut l = lease(100, 40);
        l.metadata.annotations = Some(
            [(
                ANNOTATION_MEMBER_API_UNREACHABLE_SINCE.to_string(),
                at(70).to_string(),
            )]
            .into(),
        );
        let j = |now| judge(&c, Some(&l), at(now), at(0), &config());
        let verdict = j(110).unwrap();
        assert_eq!(verdict.health, ClusterHealth::MemberApiUnreachable);
        assert_eq!(verdict.expires, Some(at(140)));
        assert!(
            verdict.message.contains("agent-0") && verdict.message.contains(&at(70).to_string()),
            "{}",
            verdict.message
        );
        // the lease still runs out: the agent is then not heard from at all
        assert_eq!(health(j(140)), Some(ClusterHealth::Unreachable));
        // the next heartbeat without the annotation: Ready
        assert_eq!(
            health(judge(&c, Some(&lease(120, 40)), at(121), at(0), &config())),
            Some(ClusterHealth::Ready)
        );
    }

    #[test]
    fn every_health_reads_back_from_its_condition_and_has_its_taint() {
        for health in [
            ClusterHealth::Ready,
            ClusterHealth::Unreachable,
            ClusterHealth::NotRegistered,
            ClusterHealth::MemberApiUnreachable,
        ] {
            let mut c = cluster(0, true);
            let condition = ready_condition(&verdict(health), &Shown::of(&c), None, at(1));
            c.status.as_mut().unwrap().conditions = vec![condition];
            c.spec.taints = health
                .taint_key()
                .map(|key| Taint {
                    key: key.into(),
                    effect: TAINT_EFFECT.into(),
                    ..Default::default()
                })
                .into_iter()
                .collect();
            let shown = Shown::of(&c);
            assert_eq!(shown.health(), Some(health));
            assert!(shown.matches(health), "{health:?}");
        }
        assert_eq!(
            ClusterHealth::MemberApiUnreachable.condition_status(),
            "False"
        );
        assert_eq!(ClusterHealth::MemberApiUnreachable.metric_value(), 0);
    }

    #[test]
    fn the_taint_must_be_the_one_of_the_health() {
        let mut c = cluster(0, true);
        c.status.as_mut().unwrap().conditions = vec![ready_condition(
            &verdict(ClusterHealth::MemberApiUnreachable),
            &Shown::of(&c),
            None,
            at(1),
        )];
        c.spec.taints = vec![Taint {
            key: TAINT_UNREACHABLE.into(),
            effect: TAINT_EFFECT.into(),
            ..Default::default()
        }];
        assert!(!Shown::of(&c).matches(ClusterHealth::MemberApiUnreachable));
        c.spec.taints[0].key = TAINT_NOT_READY.into();
        assert!(Shown::of(&c).matches(ClusterHealth::MemberApiUnreachable));
        // Unknown and False are different transitions: the time moves
        let unknown = ready_condition(
            &verdict(ClusterHealth::Unreachable),
            &Shown::of(&c),
            None,
            at(9),
        );
        assert_eq!(unknown.last_transition_time, Time(at(9)));
    }

    fn verdict(health: ClusterHealth) -> Verdict {
        Verdict {
            health,
            message: "m".into(),
            expires: None,
        }
    }

    #[test]
    fn what_the_cluster_shows_decides_whether_to_write() {
        let mut c = cluster(0, true);
        let shown = Shown::of(&c);
        assert!(!shown.matches(ClusterHealth::Ready));
        let condition =
            ready_condition(&verdict(ClusterHealth::Unreachable), &shown, Some(1), at(5));
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("Unknown", "ClusterStatusUnknown")
        );
        assert_eq!(condition.last_transition_time, Time(at(5)));
        c.status.as_mut().unwrap().conditions = vec![condition];
        // the condition alone is not enough: the taint is missing
        assert!(!Shown::of(&c).matches(ClusterHealth::Unreachable));
        c.spec.taints = vec![Taint {
            key: TAINT_UNREACHABLE.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }];
        let shown = Shown::of(&c);
        assert!(shown.matches(ClusterHealth::Unreachable));
        assert_eq!(shown.health(), Some(ClusterHealth::Unreachable));
        assert!(!shown.matches(ClusterHealth::NotRegistered));
        // same status again: the transition time stays
        let again = ready_condition(&verdict(ClusterHealth::Unreachable), &shown, Some(1), at(9));
        assert_eq!(again.last_transition_time, Time(at(5)));
        let ready = ready_condition(&verdict(ClusterHealth::Ready), &shown, Some(1), at(9));
        assert_eq!(ready.last_transition_time, Time(at(9)));
    }

    #[test]
    fn not_ready_since_keeps_the_transition_to_the_microsecond() {
        let mut c = cluster(0, true);
        let lost_at = at(5)
            .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(300))
            .unwrap();
        let unreachable = verdict(ClusterHealth::Unreachable);
        let since = not_ready_since(&unreachable, &Shown::of(&c), lost_at).unwrap();
        assert_eq!(since, lifeboat_api::time::stored(lost_at));
        assert!(since.0 >= lost_at);
        let condition = ready_condition(&unreachable, &Shown::of(&c), None, lost_at);
        let status = c.status.as_mut().unwrap();
        status.conditions = vec![condition];
        status.not_ready_since = Some(since.clone());
        // a later pass with the same status keeps it
        assert_eq!(
            not_ready_since(&unreachable, &Shown::of(&c), at(9)),
            Some(since)
        );
        // another not-Ready status is a new transition, as the condition's time is
        let silent = verdict(ClusterHealth::MemberApiUnreachable);
        assert_eq!(
            not_ready_since(&silent, &Shown::of(&c), at(9)),
            Some(lifeboat_api::time::stored(at(9)))
        );
        assert_eq!(
            not_ready_since(&verdict(ClusterHealth::Ready), &Shown::of(&c), at(9)),
            None
        );
        // an older hub's not-Ready Cluster (no notReadySince) gets none until it changes
        c.status.as_mut().unwrap().not_ready_since = None;
        assert_eq!(not_ready_since(&unreachable, &Shown::of(&c), at(9)), None);
    }

    fn status_json(value: serde_json::Value) -> ClusterStatus {
        serde_json::from_value(value).expect("a ClusterStatus")
    }

    #[test]
    fn fleet_gauges_read_the_gpus_and_unhealthy_nodes_of_the_reported_inventory() {
        let status = status_json(serde_json::json!({
            "resourceSummary": {
                "allocatable": {"cpu": "96", "nvidia.com/gpu": "16"},
                "allocated": {"cpu": "12500m", "nvidia.com/gpu": "5"}
            },
            "nodeHealth": {
                "notReady": 2, "autopilotFlagged": 1, "spotReclaiming": 3,
                "notReadyNodes": ["n1", "n2"]
            }
        }));
        assert_eq!(
            FleetGaugeValues::of(Some(&status)),
            FleetGaugeValues {
                gpus: Some([16, 5]),
                nodes: Some([2, 1, 3]),
            }
        );
        // A reported inventory without GPUs or bad nodes is zeros, not absent.
        let healthy = status_json(serde_json::json!({
            "resourceSummary": {"allocatable": {"cpu": "8"}, "allocated": {}},
            "nodeHealth": {"notReady": 0, "autopilotFlagged": 0, "spotReclaiming": 0}
        }));
        assert_eq!(
            FleetGaugeValues::of(Some(&healthy)),
            FleetGaugeValues {
                gpus: Some([0, 0]),
                nodes: Some([0, 0, 0]),
            }
        );
        // Nothing reported yet (registered, or no status at all): no values.
        let registered = cluster(0, true);
        assert_eq!(
            FleetGaugeValues::of(registered.status.as_ref()),
            FleetGaugeValues::default()
        );
        assert_eq!(FleetGaugeValues::of(None), FleetGaugeValues::default());
        // A fractional quantity counts whole GPUs, rounded up (Quantity.Value); one that does
        // not parse leaves the GPUs out rather than claiming zero.
        let odd = status_json(serde_json::json!({
            "resourceSummary": {
                "allocatable": {"nvidia.com/gpu": "1500m"},
                "allocated": {"nvidia.com/gpu": "two"}
            }
        }));
        assert_eq!(FleetGaugeValues::of(Some(&odd)).gpus, None);
        let fractional = status_json(serde_json::json!({
            "resourceSummary": {"allocatable": {"nvidia.com/gpu": "1500m"}, "allocated": {}}
        }));
        assert_eq!(FleetGaugeValues::of(Some(&fractional)).gpus, Some([2, 0]));
    }

    /// The samples of `name` in `registry`: label values (in label-name order) → value.
    fn samples(registry: &Registry, name: &str) -> BTreeMap<Vec<String>, i64> {
        crate::test_metrics::series(registry, name)
            .into_iter()
            .map(|(labels, value)| (labels, value as i64))
            .collect()
    }

    #[test]
    fn fleet_gauges_set_zeros_and_drop_what_is_no_longer_reported() {
        let registry = Registry::new();
        let gauges = FleetGauges::new(&registry).expect("registered");
        let key = |cluster: &str, value: &str| vec![cluster.to_string(), value.to_string()];
        gauges.set(
            "gpu-east",
            FleetGaugeValues {
                gpus: Some([8, 3]),
                nodes: Some([0, 1, 0]),
            },
        );
        gauges.set(
            "cpu-west",
            FleetGaugeValues {
                gpus: Some([0, 0]),
                nodes: None,
            },
        );
        let gpus = samples(&registry, "lifeboat_hub_cluster_gpus");
        assert_eq!(gpus.len(), 4, "{gpus:?}");
        assert_eq!(gpus[&key("gpu-east", "allocatable")], 8);
        assert_eq!(gpus[&key("gpu-east", "allocated")], 3);
        assert_eq!(gpus[&key("cpu-west", "allocatable")], 0);
        let nodes = samples(&registry, "lifeboat_hub_cluster_nodes");
        assert_eq!(
            nodes,
            [
                (key("gpu-east", "autopilot_flagged"), 1),
                (key("gpu-east", "not_ready"), 0),
                (key("gpu-east", "spot_reclaiming"), 0),
            ]
            .into_iter()
            .collect()
        );
        // A deleted cluster's series go; the other cluster's stay.
        gauges.remove("gpu-east");
        assert!(samples(&registry, "lifeboat_hub_cluster_nodes").is_empty());
        let gpus = samples(&registry, "lifeboat_hub_cluster_gpus");
        assert_eq!(
            gpus.keys().map(|k| k[0].as_str()).collect::<Vec<_>>(),
            ["cpu-west"; 2]
        );
        gauges.reset();
        assert!(samples(&registry, "lifeboat_hub_cluster_gpus").is_empty());
    }
}
