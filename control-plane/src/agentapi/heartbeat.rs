//! Heartbeats: each renews the cluster's Lease (the hub's clock, so agent clock skew does not
//! matter) and, when it changed, writes the inventory into the Cluster status. The status is
//! written by server-side apply as [`FIELD_MANAGER`], which owns the inventory fields,
//! `lastHeartbeatTime` and `agent`; the `Ready` condition and the unreachable taint belong to the
//! cluster health monitor ([`crate::clusters::health`]), which follows the Lease.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use lifeboat_api::cluster::{AgentInfo, Cluster, ClusterStatus};
use lifeboat_api::protocol::{HeartbeatRequest, HeartbeatResponse, Inventory, WorkKey};
use tracing::Instrument;

use super::{ApiError, FIELD_MANAGER, Shared, json_body};
use crate::clusters::removal::ANNOTATION_AGENT_STOPPED;
use lifeboat_api::cluster::{
    ANNOTATION_MEMBER_API_UNREACHABLE_SINCE, CLUSTER_NAME_LABEL, lease_name,
};

/// The Cluster status fields the agent API owns.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct AgentStatusFields {
    pub agent: Option<AgentInfo>,
    pub last_heartbeat: Option<Time>,
    pub inventory: Option<Inventory>,
}

impl AgentStatusFields {
    /// What a Cluster's status holds of these fields.
    pub fn from_status(status: Option<&ClusterStatus>) -> AgentStatusFields {
        let Some(status) = status else {
            return AgentStatusFields::default();
        };
        let has_inventory = status.kubernetes_version.is_some()
            || !status.api_enablements.is_empty()
            || status.node_summary.is_some()
            || status.resource_summary.is_some()
            || !status.node_groups.is_empty()
            || status.node_health.is_some();
        AgentStatusFields {
            agent: status.agent.clone(),
            last_heartbeat: status.last_heartbeat_time.clone(),
            inventory: has_inventory.then(|| Inventory {
                kubernetes_version: status.kubernetes_version.clone(),
                api_enablements: status.api_enablements.clone(),
                node_summary: status.node_summary.clone().unwrap_or_default(),
                resource_summary: status.resource_summary.clone().unwrap_or_default(),
                node_groups: status.node_groups.clone(),
                node_health: status.node_health.clone().unwrap_or_default(),
            }),
        }
    }

    /// The server-side apply body: every field this manager owns (a field left out would be
    /// removed).
    pub fn apply_body(&self, cluster: &str) -> serde_json::Value {
        let mut status = ClusterStatus {
            agent: self.agent.clone(),
            last_heartbeat_time: self.last_heartbeat.clone(),
            ..ClusterStatus::default()
        };
        if let Some(inventory) = &self.inventory {
            status.kubernetes_version = inventory.kubernetes_version.clone();
            status.api_enablements = inventory.api_enablements.clone();
            status.node_summary = Some(inventory.node_summary.clone());
            status.resource_summary = Some(inventory.resource_summary.clone());
            status.node_groups = inventory.node_groups.clone();
            status.node_health = Some(inventory.node_health.clone());
        }
        serde_json::json!({
            "apiVersion": Cluster::api_version(&()),
            "kind": Cluster::kind(&()),
            "metadata": {"name": cluster},
            "status": status,
        })
    }

    /// The fields after a heartbeat at `now`: the inventory when sent, `lastHeartbeatTime` when
    /// it is older than `refresh` (a quarter of the lease: fewer writes, still fresh enough to
    /// read).
    pub fn after_heartbeat(
        &self,
        inventory: Option<&Inventory>,
        now: Timestamp,
        refresh: std::time::Duration,
    ) -> AgentStatusFields {
        let mut next = self.clone();
        if let Some(inventory) = inventory {
            next.inventory = Some(inventory.clone());
        }
        let stale = self.last_heartbeat.as_ref().is_none_or(|last| {
            now.duration_since(last.0)
                .try_into()
                .is_ok_and(|age: std::time::Duration| age >= refresh)
                || last.0 > now
        });
        if stale {
            next.last_heartbeat = Some(Time(whole_seconds(now)));
        }
        next
    }
}

/// `metav1.Time` is stored with second precision: keep what the apiserver will give back, so a
/// cached value compares equal to a read one.
pub(crate) fn whole_seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// Since when (whole seconds of the hub's clock at `now`) a heartbeat says the member's
/// kube-apiserver has not answered its agent.
pub(crate) fn member_api_unreachable_since(
    now: Timestamp,
    unreachable_seconds: Option<u64>,
) -> Option<Timestamp> {
    let seconds = i64::try_from(unreachable_seconds?).unwrap_or(i64::MAX);
    Some(
        whole_seconds(now)
            .checked_sub(SignedDuration::from_secs(seconds))
            .unwrap_or(Timestamp::MIN),
    )
}

/// What a Lease renewal records beside the renewal itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LeaseNotes {
    /// Since when the agent reports its member's kube-apiserver silent.
    pub member_api_silent_since: Option<Timestamp>,
    /// When the agent of a Cluster being deleted confirmed that it stopped.
    pub agent_stopped_at: Option<Timestamp>,
}

/// A cached copy of what was written, for the Cluster with this UID.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    uid: Option<String>,
    fields: AgentStatusFields,
}

impl Shared {
    /// Changes the agent-owned status fields of `cluster` with `update` and writes them when they
    /// differ from what was last written. Returns whether it wrote.
    pub(crate) async fn write_agent_status(
        &self,
        cluster: &Cluster,
        update: impl FnOnce(&AgentStatusFields) -> AgentStatusFields,
    ) -> Result<bool, ApiError> {
        let name = cluster.name_any();
        let uid = cluster.metadata.uid.clone();
        let (current, desired) = {
            let cache = self.agent_status.lock().unwrap_or_else(|e| e.into_inner());
            let current = cache
                .get(&name)
                .filter(|w| w.uid == uid)
                .map(|w| w.fields.clone())
                .unwrap_or_else(|| AgentStatusFields::from_status(cluster.status.as_ref()));
            let desired = update(&current);
            (current, desired)
        };
        let wrote = current != desired;
        if wrote {
            Api::<Cluster>::all(self.client.clone())
                .patch_status(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(desired.apply_body(&name)),
                )
                .await
                .map_err(|e| ApiError::from_kube(&format!("writing Cluster {name} status"), e))?;
        }
        self.agent_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                name,
                Written {
                    uid,
                    fields: desired,
                },
            );
        Ok(wrote)
    }

    /// Renews (or creates) the cluster's Lease: holder `identity`, the hub's lease duration,
    /// renewed now, and the annotations of `notes` ([`ANNOTATION_MEMBER_API_UNREACHABLE_SINCE`]
    /// while the agent reports its member's kube-apiserver silent, [`ANNOTATION_AGENT_STOPPED`]
    /// once the agent of a Cluster being deleted confirmed it stopped; the apply removes those
    /// not given). The Lease is owned by the Cluster.
    pub(crate) async fn renew_lease(
        &self,
        cluster: &Cluster,
        identity: &str,
        notes: LeaseNotes,
    ) -> Result<(), ApiError> {
        let name = cluster.name_any();
        let annotations: std::collections::BTreeMap<String, String> = [
            (
                ANNOTATION_MEMBER_API_UNREACHABLE_SINCE,
                notes.member_api_silent_since,
            ),
            (ANNOTATION_AGENT_STOPPED, notes.agent_stopped_at),
        ]
        .into_iter()
        .filter_map(|(key, at)| at.map(|at| (key.to_string(), at.to_string())))
        .collect();
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(lease_name(&name)),
                namespace: Some(self.config.namespace.clone()),
                labels: Some([(CLUSTER_NAME_LABEL.to_string(), name.clone())].into()),
                annotations: (!annotations.is_empty()).then_some(annotations),
                owner_references: cluster.owner_ref(&()).map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.to_string()),
                lease_duration_seconds: Some(self.config.lease_seconds()),
                renew_time: Some(MicroTime(self.now())),
                ..LeaseSpec::default()
            }),
        };
        Api::<Lease>::namespaced(self.client.clone(), &self.config.namespace)
            .patch(
                &lease_name(&name),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&lease),
            )
            .await
            .map_err(|e| {
                ApiError::from_kube(&format!("renewing Lease {}", lease_name(&name)), e)
            })?;
        Ok(())
    }
}

/// The agent is back after a fence: a Warning Event on its Cluster names what it suspended
/// (the works the hub still wants there resume; the others it deletes).
async fn report_fenced(shared: &Shared, cluster: &Cluster, works: &[WorkKey]) {
    let names: Vec<String> = works.iter().map(|k| k.to_string()).collect();
    tracing::warn!(
        fenced = names.len(),
        works = %names.join(","),
        "the agent suspended work with purgeMode Directly while it was cut off from the hub"
    );
    let recorder = Recorder::new(
        shared.client.clone(),
        Reporter {
            controller: "lifeboat-hub".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let mut note = format!(
        "the agent was cut off from the hub for its fencing period and suspended {} work(s) with purgeMode Directly: {}",
        names.len(),
        names.join(", ")
    );
    if note.len() > 1000 {
        let mut end = 997;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    let event = Event {
        type_: EventType::Warning,
        reason: "Fenced".into(),
        note: Some(note),
        action: "Fence".into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &cluster.object_ref(&())).await {
        tracing::warn!(%error, "publishing the Fenced Event failed");
    }
}

pub(super) async fn heartbeat(
    State(shared): State<Arc<Shared>>,
    Path(cluster): Path<String>,
    request: Request,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let span = tracing::info_span!("heartbeat", cluster = %cluster);
    async move {
        let caller = shared.authenticate(request.headers(), &cluster).await?;
        let body: HeartbeatRequest =
            json_body(request, "heartbeat", shared.config.body_limit).await?;
        if body.identity.trim().is_empty() {
            return Err(ApiError::BadRequest(
                "identity: must name the agent replica, got an empty string".into(),
            ));
        }
        let lease_duration_seconds = shared.config.lease_seconds();
        if caller.object.metadata.deletion_timestamp.is_some() {
            if body.stopped {
                // The agent removed the hub's work and stopped: the cluster health monitor
                // lets the Cluster go once the Lease says so (`cluster_removal`).
                tracing::info!(identity = %body.identity, "the agent of the deleted Cluster stopped");
                let notes = LeaseNotes {
                    agent_stopped_at: Some(shared.now()),
                    ..LeaseNotes::default()
                };
                shared
                    .renew_lease(&caller.object, &body.identity, notes)
                    .await?;
            } else {
                tracing::info!("the Cluster is being deleted: telling its agent to stop");
            }
            return Ok(Json(HeartbeatResponse {
                lease_duration_seconds,
                stop: true,
                fencing_credential_digest: None,
            }));
        }
        if body.stopped {
            // Only the hub ends a cluster's membership: a stop nobody asked for changes nothing.
            tracing::warn!(identity = %body.identity, "the agent says it stopped, but its Cluster is not being deleted");
        }
        let now = shared.now();
        let member_api_silent_since =
            member_api_unreachable_since(now, body.member_api_unreachable_seconds);
        if let Some(since) = member_api_silent_since {
            tracing::debug!(%since, "the agent reports that its member's kube-apiserver does not answer");
        }
        let notes = LeaseNotes {
            member_api_silent_since,
            ..LeaseNotes::default()
        };
        shared
            .renew_lease(&caller.object, &body.identity, notes)
            .await?;
        let refresh = shared.config.lease_duration / 4;
        shared
            .write_agent_status(&caller.object, |current| {
                current.after_heartbeat(body.inventory.as_ref(), now, refresh)
            })
            .await?;
        if !body.fenced.is_empty() {
            report_fenced(&shared, &caller.object, &body.fenced).await;
        }
        let mut fencing_credential_digest = shared.fencing_digest(&cluster);
        if let Some(credential) = &body.fencing_credential {
            let digest = credential.digest();
            if fencing_credential_digest.as_deref() != Some(digest.as_str()) {
                shared
                    .store_fencing_credential(&caller.object, credential)
                    .await?;
            }
            fencing_credential_digest = Some(digest);
        }
        Ok(Json(HeartbeatResponse {
            lease_duration_seconds,
            stop: false,
            fencing_credential_digest,
        }))
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeboat_api::cluster::{NodeSummary, Quantity, ResourceSummary};
    use std::time::Duration;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn inventory(gpus: &str) -> Inventory {
        Inventory {
            kubernetes_version: Some("v1.36.3".into()),
            node_summary: NodeSummary {
                total_num: 4,
                ready_num: 4,
            },
            resource_summary: ResourceSummary {
                allocatable: [("nvidia.com/gpu".to_string(), Quantity(gpus.into()))].into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_silent_member_api_is_dated_back_from_the_heartbeat() {
        let now = at("2026-05-01T12:00:40.700Z");
        assert_eq!(member_api_unreachable_since(now, None), None);
        assert_eq!(
            member_api_unreachable_since(now, Some(31)),
            Some(at("2026-05-01T12:00:09Z"))
        );
        assert_eq!(
            member_api_unreachable_since(now, Some(u64::MAX)),
            Some(Timestamp::MIN)
        );
    }

    #[test]
    fn a_heartbeat_changes_the_status_only_when_something_is_new() {
        let refresh = Duration::from_secs(10);
        let t0 = at("2026-05-01T12:00:00.250Z");
        let first =
            AgentStatusFields::default().after_heartbeat(Some(&inventory("32")), t0, refresh);
        assert_eq!(first.last_heartbeat, Some(Time(at("2026-05-01T12:00:00Z"))));
        // same inventory 5 s later: nothing to write
        let t5 = at("2026-05-01T12:00:05Z");
        assert_eq!(
            first.after_heartbeat(Some(&inventory("32")), t5, refresh),
            first
        );
        // no inventory sent: the last one stays
        assert_eq!(first.after_heartbeat(None, t5, refresh), first);
        // a new inventory is written at once
        let changed = first.after_heartbeat(Some(&inventory("24")), t5, refresh);
        assert_ne!(changed, first);
        assert_eq!(changed.last_heartbeat, first.last_heartbeat);
        // a quarter lease later the heartbeat time moves
        let t10 = at("2026-05-01T12:00:10Z");
        let later = first.after_heartbeat(None, t10, refresh);
        assert_eq!(later.last_heartbeat, Some(Time(t10)));
    }

    #[test]
    fn the_fields_round_trip_through_the_cluster_status() {
        let fields = AgentStatusFields {
            agent: Some(AgentInfo {
                identity: "agent-0/1".into(),
                version: "0.1.0".into(),
                registered_at: Some(Time(at("2026-05-01T12:00:00Z"))),
                fencing_period_seconds: Some(60),
            }),
            last_heartbeat: Some(Time(at("2026-05-01T12:00:00Z"))),
            inventory: Some(inventory("32")),
        };
        let body = fields.apply_body("gpu-east");
        assert_eq!(body["kind"], "Cluster");
        assert_eq!(body["apiVersion"], "cluster.lifeboat.dev/v1alpha1");
        assert!(body["status"].get("conditions").is_none(), "{body}");
        let status: ClusterStatus = serde_json::from_value(body["status"].clone()).unwrap();
        assert_eq!(AgentStatusFields::from_status(Some(&status)), fields);
        assert_eq!(
            AgentStatusFields::from_status(None),
            AgentStatusFields::default()
        );
    }
}
