//! Settling eviction tasks, pure: the evidence that a `Directly` eviction's old copy no longer
//! runs, what a task still waits for, when the new placement is healthy, where the new copy may
//! be created.

use super::*;

/// What shows that a `Directly` eviction's old copy no longer runs. Time alone never does: a
/// cluster that has been silent for long may still run its pods (a dead agent suspends
/// nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeEvidence {
    /// The cluster's agent deleted the copy and saw it gone.
    Agent,
    /// The hub deleted it through the member's kube-apiserver (the cluster's fencing
    /// credential) and saw it gone.
    Hub,
    /// An operator confirmed it (`lifeboatctl confirm-purge`).
    Operator,
    /// The Cluster was deleted on the hub.
    ClusterDeleted,
}

impl PurgeEvidence {
    /// For the ledger and Events.
    pub fn as_str(self) -> &'static str {
        match self {
            PurgeEvidence::Agent => "agent",
            PurgeEvidence::Hub => "hub-fence",
            PurgeEvidence::Operator => "operator",
            PurgeEvidence::ClusterDeleted => "cluster-deleted",
        }
    }
}

/// A change to an eviction task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskChange {
    /// The old copy is confirmed gone: the new copy may be created.
    Purged {
        cluster: String,
        evidence: PurgeEvidence,
    },
    /// The task is done: its old copy (if kept) is removed now.
    Remove { cluster: String, why: String },
}

/// Settles the binding's eviction tasks. `confirmed` lists clusters whose purge a human
/// confirmed (purgeMode Never).
pub fn settle_tasks(
    binding: &ResourceBinding,
    ctx: &Context<'_>,
    confirmed: &BTreeSet<String>,
    decision: &mut Decision,
) -> Vec<TaskChange> {
    let now = ctx.now;
    let new_placement_healthy = new_placement_healthy(binding);
    let mut changes = Vec::new();
    for task in &binding.spec.graceful_eviction_tasks {
        let cluster = task.from_cluster.clone();
        let created = task
            .creation_timestamp
            .clone()
            .unwrap_or_else(|| now.clone());
        let timeout = task
            .grace_period_seconds
            .map(i64::from)
            .unwrap_or(DEFAULT_EVICTION_TIMEOUT.as_secs() as i64);
        let expires = plus(&created, timeout);
        match task.purge_mode.unwrap_or_default() {
            PurgeMode::Never => {
                if task.suppress_deletion == Some(false) || confirmed.contains(&cluster) {
                    changes.push(TaskChange::Remove {
                        cluster,
                        why: "the purge was confirmed".into(),
                    });
                } else {
                    decision.blocked.push(Blocked {
                        cluster: cluster.clone(),
                        reason: BLOCKED_WAITING_FOR_PURGE_CONFIRMATION,
                        message: format!(
                            "the old copy in {cluster} stays until `lifeboatctl confirm-purge` (purgeMode Never)"
                        ),
                    });
                }
            }
            PurgeMode::Gracefully => {
                if new_placement_healthy {
                    changes.push(TaskChange::Remove {
                        cluster,
                        why: "the new placement is Healthy".into(),
                    });
                } else if reached(now, &expires) {
                    changes.push(TaskChange::Remove {
                        cluster,
                        why: format!("the grace period of {timeout}s is over"),
                    });
                } else {
                    decision.wake_at(expires);
                }
            }
            PurgeMode::Directly => {
                if task.purged_at.is_none() {
                    let state = ctx.clusters.get(&cluster);
                    if let Some(evidence) =
                        purge_evidence(binding, &cluster, &created, state, confirmed)
                    {
                        changes.push(TaskChange::Purged { cluster, evidence });
                    } else {
                        decision
                            .blocked
                            .push(waiting_for_purge(binding, &cluster, state));
                    }
                } else if new_placement_healthy {
                    changes.push(TaskChange::Remove {
                        cluster,
                        why: "the new placement is Healthy".into(),
                    });
                } else if reached(now, &expires) {
                    changes.push(TaskChange::Remove {
                        cluster,
                        why: format!("the eviction timeout of {timeout}s is over"),
                    });
                } else {
                    decision.wake_at(expires);
                }
            }
        }
    }
    changes
}

/// The binding is scheduled for its generation, placed somewhere, and Healthy everywhere it
/// is placed. Never true for an empty placement (karmada#7455 treats that as healthy and
/// deletes the only copy).
pub fn new_placement_healthy(binding: &ResourceBinding) -> bool {
    let spec = &binding.spec;
    if spec.clusters.is_empty() {
        return false;
    }
    let scheduled_now = binding
        .status
        .as_ref()
        .and_then(|s| s.scheduler_observed_generation)
        == binding.metadata.generation;
    scheduled_now
        && spec.clusters.iter().all(|c| {
            binding
                .cluster_status(&c.name)
                .is_some_and(|i| i.health == ResourceHealth::Healthy)
        })
}

/// The evidence that a `Directly` eviction's old copy in `cluster` no longer runs, if there is
/// any: a gone report after the eviction (from the agent, or from the hub's own fence), the
/// Cluster deleted, or an operator's confirmation.
fn purge_evidence(
    binding: &ResourceBinding,
    cluster: &str,
    evicted_at: &Time,
    state: Option<&ClusterState>,
    confirmed: &BTreeSet<String>,
) -> Option<PurgeEvidence> {
    if let Some(by) = old_copy_gone(binding, cluster, evicted_at) {
        return Some(match by {
            GoneConfirmedBy::Agent => PurgeEvidence::Agent,
            GoneConfirmedBy::Hub => PurgeEvidence::Hub,
        });
    }
    // A Cluster deleted on the hub is held by the hub's finalizer until its agent has removed
    // the hub's work and stopped (or its lease ran out): gone, it is an operator's word that
    // nothing runs there any more; while it is held, its agent is still at work.
    if state.is_none() {
        return Some(PurgeEvidence::ClusterDeleted);
    }
    confirmed
        .contains(cluster)
        .then_some(PurgeEvidence::Operator)
}

/// Why a `Directly` eviction's new copy still waits: the old copy's agent is deleting it, or
/// (its cluster not Ready) nobody there can say it is gone.
fn waiting_for_purge(
    binding: &ResourceBinding,
    cluster: &str,
    state: Option<&ClusterState>,
) -> Blocked {
    if state.is_some_and(|s| s.deleted) {
        return Blocked {
            cluster: cluster.to_string(),
            reason: BLOCKED_WAITING_FOR_PURGE,
            message: format!(
                "the new copy waits until the Cluster {cluster}, being deleted, is gone: its agent removes the hub's work and stops, or its lease runs out (purgeMode Directly)"
            ),
        };
    }
    let not_ready_since = state.and_then(|s| s.not_ready_since.as_ref());
    let Some(since) = not_ready_since else {
        return Blocked {
            cluster: cluster.to_string(),
            reason: BLOCKED_WAITING_FOR_PURGE,
            message: format!(
                "the new copy waits until the agent in {cluster} confirms the old one gone (purgeMode Directly)"
            ),
        };
    };
    let (namespace, name) = (
        binding.metadata.namespace.as_deref().unwrap_or_default(),
        binding.metadata.name.as_deref().unwrap_or_default(),
    );
    Blocked {
        cluster: cluster.to_string(),
        reason: BLOCKED_WAITING_FOR_FENCE,
        message: format!(
            "the new copy waits for evidence that the old one in {cluster} no longer runs (purgeMode Directly): \
             {cluster} is not Ready since {}, so its agent cannot confirm it; the hub deletes it through the member's \
             kube-apiserver if the cluster gave a fencing credential, or `lifeboatctl confirm-purge {namespace}/{name} {cluster}` \
             confirms it by hand",
            since.0
        ),
    }
}

/// Who reported the old copy gone after the eviction (a gone report, taken only for work the
/// hub withdrew from that cluster: an `applied: false` report of a copy whose update failed is
/// not one, its object may still run).
fn old_copy_gone(
    binding: &ResourceBinding,
    cluster: &str,
    evicted_at: &Time,
) -> Option<GoneConfirmedBy> {
    binding
        .cluster_status(cluster)
        .filter(|item| !item.applied && item.gone_at.as_ref().is_some_and(|t| t.0 >= evicted_at.0))
        .map(|item| item.gone_confirmed_by.unwrap_or(GoneConfirmedBy::Agent))
}

/// Whether the new copy may be created in `cluster`: not while a Directly eviction's old copy
/// (elsewhere) is not confirmed gone.
pub fn may_create_in(spec: &ResourceBindingSpec, cluster: &str) -> bool {
    spec.graceful_eviction_tasks.iter().all(|t| {
        t.purge_mode != Some(PurgeMode::Directly)
            || t.purged_at.is_some()
            || t.clusters_before_failover.iter().any(|c| c == cluster)
    })
}
