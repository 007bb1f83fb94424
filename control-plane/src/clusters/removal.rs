//! Deleting a Cluster on the hub stops its agent for good.
//!
//! The hub keeps its finalizer [`FINALIZER`] on every Cluster (registration creates Clusters
//! with it; the cluster health monitor adds it to any other, while it leads). When a Cluster is
//! deleted, the finalizer holds it while:
//!
//! - the binder's cluster failover moves its workloads (`ClusterDeleted` evictions: the Cluster
//!   is being deleted);
//! - its agent's heartbeats are answered `stop`: the agent removes the hub's work from its
//!   cluster, marks its credential Secret removed-from-hub (so a restart does not register
//!   again) and says so in a last heartbeat with `stopped`, which the hub records on the
//!   cluster's Lease ([`ANNOTATION_AGENT_STOPPED`]).
//!
//! [`release`] (pure) says when the finalizer goes: the agent confirmed it stopped, or its Lease
//! ran out (a dead or cut-off agent must not keep a Cluster forever), or no agent ever
//! registered. Then the bootstrap tokens bound to the cluster's name (minted before the
//! deletion) are revoked, so an agent that missed the stop cannot register the name again with
//! one, an Event `ClusterRemoved` says why, and the finalizer is removed; the Cluster's
//! credential Secret and Lease (owned by it) go with it.
//! [`ClusterRemoval::pass`] is the IO around it, run by the cluster health monitor.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use lifeboat_api::cluster::Cluster;
use tokio::time::Instant;
use tracing::Instrument;

use crate::clusters::health::{LeaseTerms, post_event};
use lifeboat_api::cluster::lease_name;
use lifeboat_api::credentials::{BOOTSTRAP_CLUSTER_NAME_KEY, BOOTSTRAP_TOKEN_TYPE};

/// The hub's finalizer on every Cluster: held until the cluster's agent has stopped.
pub const FINALIZER: &str = "cluster.lifeboat.dev/stop-agent";
/// Annotation on a cluster's Lease: when (RFC 3339, the hub's clock) the agent of the Cluster
/// being deleted confirmed that it removed the hub's work and stopped.
pub const ANNOTATION_AGENT_STOPPED: &str = "cluster.lifeboat.dev/agent-stopped-at";
/// Field manager of the finalizer (its own, so the monitor's applies of taints and conditions
/// and this one never remove each other's fields).
pub const FIELD_MANAGER: &str = "lifeboat-hub/cluster-removal";
/// Event reason when the hub lets a deleted Cluster go.
pub const EVENT_REMOVED: &str = "ClusterRemoved";
/// After adding the finalizer, how long a Cluster cache that does not show it yet is trusted
/// less than the write.
const WRITE_SETTLE: Duration = Duration::from_secs(5);

/// Why the hub lets a deleted Cluster go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseReason {
    /// The agent confirmed that it removed the hub's work and stopped.
    AgentStopped { at: Timestamp },
    /// The agent did not confirm within its Lease: it is dead or cut off, and may still run
    /// the hub's work if it was cut off (its fence suspends `Directly` work).
    LeaseExpired { holder: String, since: Timestamp },
    /// No agent ever registered for the Cluster.
    NeverRegistered,
}

impl ReleaseReason {
    pub fn message(&self) -> String {
        match self {
            ReleaseReason::AgentStopped { at } => format!(
                "the agent removed the hub's work from its cluster and stopped at {at}; it stays \
                 stopped until it is joined again"
            ),
            ReleaseReason::LeaseExpired { holder, since } => format!(
                "the agent ({holder}) did not confirm that it stopped before the cluster's lease \
                 ran out at {since}; if it comes back, it finds its credential revoked"
            ),
            ReleaseReason::NeverRegistered => "no agent ever registered for this cluster".into(),
        }
    }

    /// The metric-free, log-friendly name.
    pub fn as_str(&self) -> &'static str {
        match self {
            ReleaseReason::AgentStopped { .. } => "AgentStopped",
            ReleaseReason::LeaseExpired { .. } => "LeaseExpired",
            ReleaseReason::NeverRegistered => "NeverRegistered",
        }
    }
}

/// Whether a Cluster being deleted may go now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    Now(ReleaseReason),
    /// Not before this time (the Lease runs out then, unless the agent confirms sooner).
    NotBefore(Timestamp),
}

/// Decides whether `cluster`, being deleted, may go at `now`, from its Lease. `leading_since`:
/// when this hub started leading (a Lease is given a full duration from then, as for health).
pub fn release(
    cluster: &Cluster,
    lease: Option<&Lease>,
    now: Timestamp,
    leading_since: Timestamp,
    default_lease: Duration,
) -> Release {
    let deleted_at = cluster.metadata.deletion_timestamp.as_ref().map(|t| t.0);
    let stopped_at = lease
        .and_then(|l| l.metadata.annotations.as_ref())
        .and_then(|a| a.get(ANNOTATION_AGENT_STOPPED))
        .and_then(|at| at.parse::<Timestamp>().ok())
        // A confirmation is for this deletion (deletion times are whole seconds).
        .filter(|at| deleted_at.is_none_or(|d| at.as_second() >= d.as_second()));
    if let Some(at) = stopped_at {
        return Release::Now(ReleaseReason::AgentStopped { at });
    }
    let terms = LeaseTerms::of(lease, default_lease);
    let registered = cluster.status.as_ref().is_some_and(|s| s.agent.is_some());
    let lost_at = match terms.expires(leading_since) {
        Some(expires) => expires,
        None if registered => terms.lost_without_lease(cluster, leading_since),
        None => return Release::Now(ReleaseReason::NeverRegistered),
    };
    if now >= lost_at {
        Release::Now(ReleaseReason::LeaseExpired {
            holder: terms.holder.to_string(),
            since: lost_at,
        })
    } else {
        Release::NotBefore(lost_at)
    }
}

/// Whether a bootstrap token Secret is bound to `cluster` and was made before `deleted_at`
/// (one minted after the deletion is meant for joining the cluster again).
pub fn bound_before(secret: &Secret, cluster: &str, deleted_at: Option<Timestamp>) -> bool {
    let bound = secret
        .data
        .as_ref()
        .and_then(|d| d.get(BOOTSTRAP_CLUSTER_NAME_KEY))
        .is_some_and(|v| String::from_utf8_lossy(&v.0).trim() == cluster);
    let made = secret.metadata.creation_timestamp.as_ref().map(|t| t.0);
    bound
        && match (made, deleted_at) {
            (Some(made), Some(deleted)) => made.as_second() <= deleted.as_second(),
            _ => true,
        }
}

/// The IO of cluster removal, for the cluster health monitor (which runs it only while it
/// leads).
pub struct ClusterRemoval {
    client: kube::Client,
    /// The hub's namespace (Leases, bootstrap tokens).
    namespace: String,
    default_lease: Duration,
    recorder: Recorder,
    /// Cluster UID → when this hub added the finalizer.
    added: HashMap<String, Instant>,
}

impl ClusterRemoval {
    pub fn new(
        client: kube::Client,
        namespace: String,
        default_lease: Duration,
        recorder: Recorder,
    ) -> ClusterRemoval {
        ClusterRemoval {
            client,
            namespace,
            default_lease,
            recorder,
            added: HashMap::new(),
        }
    }

    /// Adds the finalizer where it is missing and lets go the deleted Clusters that may go.
    /// Returns when to look again (the soonest Lease that runs out on a Cluster being deleted).
    pub async fn pass(
        &mut self,
        clusters: &Store<Cluster>,
        leases: &Store<Lease>,
        leading_since: Timestamp,
    ) -> Option<Timestamp> {
        let now = Timestamp::now();
        let mut soonest: Option<Timestamp> = None;
        self.added.retain(|_, at| at.elapsed() < WRITE_SETTLE);
        for cluster in clusters.state() {
            let name = cluster.name_any();
            let span = tracing::info_span!("cluster_removal", cluster = %name);
            let lease = leases.get(&ObjectRef::new(&lease_name(&name)).within(&self.namespace));
            if let Some(at) = self
                .one(&cluster, lease.as_deref(), now, leading_since)
                .instrument(span)
                .await
            {
                soonest = Some(soonest.map_or(at, |s| s.min(at)));
            }
        }
        soonest
    }

    /// One Cluster's part of [`ClusterRemoval::pass`]; returns when to look again.
    async fn one(
        &mut self,
        cluster: &Cluster,
        lease: Option<&Lease>,
        now: Timestamp,
        leading_since: Timestamp,
    ) -> Option<Timestamp> {
        let name = cluster.name_any();
        let held = cluster.finalizers().iter().any(|f| f == FINALIZER);
        if cluster.metadata.deletion_timestamp.is_none() {
            let uid = cluster.uid().unwrap_or_default();
            if !held && !self.added.contains_key(&uid) {
                match self.add_finalizer(&name).await {
                    Ok(()) => {
                        self.added.insert(uid, Instant::now());
                    }
                    Err(error) => {
                        tracing::warn!(%error, "adding the hub's finalizer failed; retrying")
                    }
                }
            }
            return None;
        }
        if !held {
            return None;
        }
        match release(cluster, lease, now, leading_since, self.default_lease) {
            Release::NotBefore(at) => Some(at),
            Release::Now(reason) => {
                if let Err(error) = self.let_go(cluster, &reason).await {
                    tracing::warn!(%error, reason = reason.as_str(), "removing the deleted Cluster failed; retrying");
                }
                None
            }
        }
    }

    async fn add_finalizer(&self, name: &str) -> Result<(), kube::Error> {
        // Server-side apply: the finalizers are a set, so this adds ours and keeps the others.
        let patch = serde_json::json!({
            "apiVersion": Cluster::api_version(&()),
            "kind": Cluster::kind(&()),
            "metadata": {"name": name, "finalizers": [FINALIZER]},
        });
        Api::<Cluster>::all(self.client.clone())
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        tracing::debug!("added the hub's finalizer");
        Ok(())
    }

    /// Revokes the bootstrap tokens bound to the cluster, posts the Event, removes the
    /// finalizer.
    async fn let_go(&self, cluster: &Cluster, reason: &ReleaseReason) -> Result<(), kube::Error> {
        let name = cluster.name_any();
        let deleted_at = cluster.metadata.deletion_timestamp.as_ref().map(|t| t.0);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let tokens = secrets
            .list(&ListParams::default().fields(&format!("type={BOOTSTRAP_TOKEN_TYPE}")))
            .await?;
        for token in tokens
            .items
            .iter()
            .filter(|s| bound_before(s, &name, deleted_at))
        {
            let token_name = token.name_any();
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: token.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match secrets.delete(&token_name, &params).await {
                Ok(_) => {
                    tracing::info!(bootstrap_token = %token_name, "revoked a bootstrap token bound to the deleted cluster")
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        let message = reason.message();
        let event = Event {
            type_: match reason {
                ReleaseReason::LeaseExpired { .. } => EventType::Warning,
                _ => EventType::Normal,
            },
            reason: EVENT_REMOVED.into(),
            note: Some(message.clone()),
            action: "StopAgent".into(),
            secondary: None,
        };
        post_event(&self.recorder, cluster, event).await;
        remove_finalizer(&self.client, cluster).await?;
        match reason {
            ReleaseReason::LeaseExpired { .. } => {
                tracing::warn!(reason = reason.as_str(), %message, "deleted cluster removed")
            }
            _ => tracing::info!(reason = reason.as_str(), %message, "deleted cluster removed"),
        }
        Ok(())
    }
}

/// Removes [`FINALIZER`] from `cluster` (a JSON patch that tests the entry first, so a list
/// changed meanwhile is refused rather than the wrong entry removed; the next pass retries).
async fn remove_finalizer(client: &kube::Client, cluster: &Cluster) -> Result<(), kube::Error> {
    let Some(index) = cluster.finalizers().iter().position(|f| f == FINALIZER) else {
        return Ok(());
    };
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FINALIZER},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
    ]))
    .map_err(kube::Error::SerdeError)?;
    match Api::<Cluster>::all(client.clone())
        .patch(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clusters::health::tests::{at, cluster};
    use k8s_openapi::ByteString;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
    use kube::api::ObjectMeta;

    fn deleted(created: i64, deleted: i64, registered: bool) -> Cluster {
        let mut c = cluster(created, registered);
        c.metadata.deletion_timestamp = Some(Time(at(deleted)));
        c.metadata.finalizers = Some(vec![FINALIZER.into()]);
        c
    }

    fn lease(renewed: i64, stopped: Option<i64>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                annotations: stopped
                    .map(|s| [(ANNOTATION_AGENT_STOPPED.to_string(), at(s).to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("agent-0".into()),
                lease_duration_seconds: Some(40),
                renew_time: Some(MicroTime(at(renewed))),
                ..Default::default()
            }),
        }
    }

    const LEASE: Duration = Duration::from_secs(40);

    #[test]
    fn a_confirmed_stop_lets_the_cluster_go_at_once() {
        let c = deleted(0, 100, true);
        assert_eq!(
            release(&c, Some(&lease(95, Some(101))), at(102), at(0), LEASE),
            Release::Now(ReleaseReason::AgentStopped { at: at(101) })
        );
        // A confirmation older than this deletion (a Lease left from before) does not count.
        assert_eq!(
            release(&c, Some(&lease(95, Some(90))), at(102), at(0), LEASE),
            Release::NotBefore(at(135))
        );
    }

    #[test]
    fn a_silent_agent_holds_the_cluster_until_its_lease_runs_out() {
        let c = deleted(0, 100, true);
        let l = lease(95, None);
        assert_eq!(
            release(&c, Some(&l), at(134), at(0), LEASE),
            Release::NotBefore(at(135))
        );
        let Release::Now(reason) = release(&c, Some(&l), at(135), at(0), LEASE) else {
            panic!("released at expiry");
        };
        assert_eq!(
            reason,
            ReleaseReason::LeaseExpired {
                holder: "agent-0".into(),
                since: at(135)
            }
        );
        assert!(reason.message().contains("agent-0"), "{}", reason.message());
        // A new leader gives the Lease a full duration from when it started leading.
        assert_eq!(
            release(&c, Some(&l), at(210), at(200), LEASE),
            Release::NotBefore(at(240))
        );
        // Registered, but no Lease: one duration from creation (or leading).
        assert_eq!(
            release(&c, None, at(20), at(0), LEASE),
            Release::NotBefore(at(40))
        );
        assert!(matches!(
            release(&c, None, at(40), at(0), LEASE),
            Release::Now(ReleaseReason::LeaseExpired { .. })
        ));
    }

    #[test]
    fn a_cluster_nobody_registered_goes_at_once() {
        let c = deleted(0, 100, false);
        assert_eq!(
            release(&c, None, at(100), at(0), LEASE),
            Release::Now(ReleaseReason::NeverRegistered)
        );
    }

    fn token(cluster: Option<&str>, created: i64) -> Secret {
        let mut data = std::collections::BTreeMap::new();
        data.insert("token".to_string(), ByteString(b"x".to_vec()));
        if let Some(c) = cluster {
            data.insert(
                BOOTSTRAP_CLUSTER_NAME_KEY.to_string(),
                ByteString(c.as_bytes().to_vec()),
            );
        }
        Secret {
            metadata: ObjectMeta {
                creation_timestamp: Some(Time(at(created))),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..Secret::default()
        }
    }

    #[test]
    fn only_tokens_bound_to_the_cluster_and_older_than_the_deletion_are_revoked() {
        let deletion = Some(at(100));
        assert!(bound_before(
            &token(Some("gpu-east"), 50),
            "gpu-east",
            deletion
        ));
        assert!(bound_before(
            &token(Some("gpu-east"), 100),
            "gpu-east",
            deletion
        ));
        // minted after the deletion: for joining again
        assert!(!bound_before(
            &token(Some("gpu-east"), 101),
            "gpu-east",
            deletion
        ));
        assert!(!bound_before(
            &token(Some("gpu-west"), 50),
            "gpu-east",
            deletion
        ));
        // unbound tokens register new names only; they stay
        assert!(!bound_before(&token(None, 50), "gpu-east", deletion));
    }
}
