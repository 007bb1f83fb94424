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
//! stopped ([`crate::clusters::removal`]).

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
use lifeboat_api::quantity::Quantity;
use lifeboat_runtime::cache::Cache;
use prometheus::{IntGaugeVec, Opts, Registry};
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;
use tracing::Instrument;

use crate::clusters::removal::ClusterRemoval;
use crate::leadership::LeaderState;
use lifeboat_api::cluster::{
    ANNOTATION_MEMBER_API_UNREACHABLE_SINCE, CLUSTER_NAME_LABEL, lease_name,
};

mod fleet;
mod monitor;

pub use fleet::*;
pub use monitor::*;

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

#[cfg(test)]
pub(crate) mod tests;
