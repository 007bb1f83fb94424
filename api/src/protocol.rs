//! The agent ↔ hub protocol, version `v1`: JSON over HTTPS, the agent dials out (pull mode, so
//! member credentials never leave the member).
//!
//! | call | path | credential |
//! |---|---|---|
//! | register | `POST {API_PREFIX}/register` | bootstrap token |
//! | heartbeat (renews the cluster's Lease, carries inventory) | `POST {API_PREFIX}/clusters/{cluster}/heartbeat` | cluster token |
//! | desired work, a resumable stream (NDJSON of [`WorkEvent`]) | `GET {API_PREFIX}/clusters/{cluster}/work?since={epoch}:{revision}` | cluster token |
//! | batched status reports | `POST {API_PREFIX}/clusters/{cluster}/status` | cluster token |
//!
//! Credentials go in `Authorization: Bearer <token>`. A cluster token only works for its own
//! cluster's paths (403 otherwise); an unknown or revoked token gets 401; a malformed body 400;
//! a body over [`MAX_BODY_BYTES`] 413. A standby hub answers 503 with `Retry-After` and, when it
//! knows it, the leader's URL in [`LEADER_HEADER`].
//!
//! The work stream is resumable: every change of the cluster's desired work gets the next
//! revision of the hub's epoch (a new epoch per leader term). A reconnect with `since` in the
//! current epoch gets only the changes after that revision; otherwise (new epoch, or a revision
//! the hub no longer holds) it gets [`WorkEvent::Reset`], the full set, then [`WorkEvent::Synced`]:
//! the agent removes what the full set does not name.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use crate::cluster::{ApiEnablement, NodeGroup, NodeHealthSummary, NodeSummary, ResourceSummary};
use crate::policy::PurgeMode;

/// Path prefix of every call.
pub const API_PREFIX: &str = "/apis/agent.lifeboat.dev/v1";
/// Protocol version the agent speaks (sent at registration).
pub const PROTOCOL_VERSION: &str = "v1";
/// The largest request body the hub reads (413 above).
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// The most status items one report may carry (400 above).
pub const MAX_STATUS_ITEMS: usize = 5_000;
/// Response header of a standby hub naming the leader's agent API URL.
pub const LEADER_HEADER: &str = "x-lifeboat-leader";

pub fn register_path() -> String {
    format!("{API_PREFIX}/register")
}

pub fn heartbeat_path(cluster: &str) -> String {
    format!("{API_PREFIX}/clusters/{cluster}/heartbeat")
}

pub fn work_path(cluster: &str) -> String {
    format!("{API_PREFIX}/clusters/{cluster}/work")
}

pub fn status_path(cluster: &str) -> String {
    format!("{API_PREFIX}/clusters/{cluster}/status")
}

/// Register a cluster's agent with a bootstrap token; the answer carries the cluster token.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RegisterRequest {
    /// The member cluster's name on the hub (a DNS label).
    pub cluster_name: String,
    /// The agent replica (hostname and pid).
    pub identity: String,
    /// The agent's version.
    pub agent_version: String,
    /// Always [`PROTOCOL_VERSION`].
    pub protocol_version: String,
    /// The agent's fencing period: how long it tolerates losing the hub before it suspends
    /// workloads whose purge mode is Directly. Must match the hub's setting for the cluster.
    pub fencing_period_seconds: i32,
    /// Topology to record on a Cluster the hub creates at first registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// The answer to a registration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RegisterResponse {
    pub cluster_name: String,
    /// The cluster's credential: keep it (the hub stores only its hash) and send it as bearer
    /// token on every further call. A new registration replaces it.
    pub token: String,
    /// The cluster is lost when its lease is not renewed for this long.
    pub lease_duration_seconds: i32,
    /// How often to send a heartbeat.
    pub heartbeat_interval_seconds: i32,
    /// The fencing period the hub uses for this cluster (equal to the agent's).
    pub fencing_period_seconds: i32,
}

/// A heartbeat: renews the cluster's lease; carries the inventory when it changed (or at least
/// every minute).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatRequest {
    pub identity: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<Inventory>,
    /// Works the agent has suspended because it lost the hub for longer than its fencing
    /// period (reported once it is back).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fenced: Vec<WorkKey>,
    /// How long the member cluster's kube-apiserver has not answered the agent, in whole
    /// seconds; sent only once that reached the agent's bound (`--member-api-timeout`), absent
    /// while it answers. The hub then marks the Cluster `Ready=False`
    /// ([`crate::cluster::REASON_MEMBER_API_UNREACHABLE`]): the agent reaches the hub but can do
    /// nothing in its cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_api_unreachable_seconds: Option<u64>,
    /// The fencing credential (see [`FencingCredential`]): sent when the hub's answer shows it
    /// holds another one (or none), so a dead agent's member can still be fenced by the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_credential: Option<FencingCredential>,
    /// The agent's last heartbeat, after one was answered [`HeartbeatResponse::stop`]: it has
    /// removed the hub's work from its cluster and stopped for good; the hub then lets the
    /// deleted Cluster go.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

/// A narrowly scoped credential for the member cluster's kube-apiserver, given to the hub so that
/// it can itself make sure a workload is no longer running there when the agent cannot say so
/// (the agent is dead, or cut off from the hub): it may only delete objects Lifeboat placed (the
/// member's RBAC grants `delete` only, and a ValidatingAdmissionPolicy refuses any object without
/// the binding labels). The hub keeps it in a Secret owned by the Cluster.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FencingCredential {
    /// The member's kube-apiserver as the hub reaches it (`https://...`).
    pub server: String,
    /// PEM CA bundle of that server (empty: the hub's trust store).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub certificate_authority: String,
    /// Bearer token of the member's fencing ServiceAccount.
    pub token: String,
}

impl FencingCredential {
    /// A digest that names this credential without revealing it (hex SHA-256 of its fields).
    pub fn digest(&self) -> String {
        let mut h = ring::digest::Context::new(&ring::digest::SHA256);
        for part in [&self.server, &self.certificate_authority, &self.token] {
            h.update(&(part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        h.finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl std::fmt::Debug for FencingCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencingCredential")
            .field("server", &self.server)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// What the hub says back to a heartbeat.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatResponse {
    pub lease_duration_seconds: i32,
    /// The Cluster is being deleted on the hub: the agent must remove the hub's work, stop and
    /// say so in a last heartbeat with [`HeartbeatRequest::stopped`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop: bool,
    /// [`FencingCredential::digest`] of the fencing credential the hub holds for this cluster
    /// (absent: none). The agent sends its own when they differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_credential_digest: Option<String>,
}

/// What a member cluster has: the parts of [`crate::cluster::ClusterStatus`] the agent observes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_enablements: Vec<ApiEnablement>,
    #[serde(default)]
    pub node_summary: NodeSummary,
    #[serde(default)]
    pub resource_summary: ResourceSummary,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_groups: Vec<NodeGroup>,
    #[serde(default)]
    pub node_health: NodeHealthSummary,
}

/// The identity of one piece of work: its binding.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct WorkKey {
    /// The binding's namespace (also the workload's namespace).
    pub namespace: String,
    /// The binding's name.
    pub name: String,
}

impl std::fmt::Display for WorkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One workload the hub wants in the cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Work {
    pub key: WorkKey,
    /// The binding's UID: an object labelled with another UID belongs to an older binding.
    pub binding_uid: String,
    /// The revision of this work item in the hub's epoch.
    pub revision: i64,
    /// The object to apply (server-side apply, field manager `lifeboat`), labelled with its
    /// binding.
    pub manifest: serde_json::Value,
    /// The purge mode of the workload's cluster failover (`failover.cluster.purgeMode`); the
    /// agent suspends `Directly` workloads once it has lost the hub for its fencing period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge_mode: Option<PurgeMode>,
    /// In-place reset requests: a higher generation than the agent last acted on asks for one
    /// delete-and-recreate of the workload, after `pauseSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<ResetRequest>,
}

/// A request to delete and recreate the workload in place.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ResetRequest {
    pub generation: i64,
    #[serde(default)]
    pub pause_seconds: i32,
}

/// A cursor into the work stream: `{epoch}:{revision}`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    pub epoch: String,
    pub revision: i64,
}

impl Cursor {
    pub fn parse(text: &str) -> Option<Cursor> {
        let (epoch, revision) = text.rsplit_once(':')?;
        if epoch.is_empty() || epoch.len() > 64 {
            return None;
        }
        Some(Cursor {
            epoch: epoch.to_string(),
            revision: revision.parse().ok()?,
        })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.epoch, self.revision)
    }
}

/// One line of the work stream.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "PascalCase")]
pub enum WorkEvent {
    /// A full snapshot follows; after [`WorkEvent::Synced`], work not named in it is removed.
    #[serde(rename_all = "camelCase")]
    Reset { epoch: String, revision: i64 },
    /// Create or update this work.
    Upsert { work: Box<Work> },
    /// This work is no longer assigned to the cluster.
    #[serde(rename_all = "camelCase")]
    Delete {
        key: WorkKey,
        revision: i64,
        /// The UID of the binding whose work this was (empty from an older hub).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        binding_uid: String,
        /// The hub waits to hear that this copy is gone before it creates the workload
        /// elsewhere (a `Directly` eviction): once the object is deleted and no longer served
        /// (its pods gone with it), the agent reports the work with [`WorkStatus::gone`] under
        /// `binding_uid`. In a snapshot, such a Delete follows the Upserts and names work the
        /// agent may have removed before (it confirms the absence again).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        confirm_gone: bool,
    },
    /// The snapshot is complete / the agent has caught up to this revision.
    #[serde(rename_all = "camelCase")]
    Synced { epoch: String, revision: i64 },
    /// Keep-alive; the cursor is unchanged.
    Bookmark,
}

/// A batch of status reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    pub items: Vec<WorkStatus>,
    /// The agent (re)sends the status of every work it holds (after a restart or reconnect).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub full: bool,
}

/// What the agent sees of one work in its cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkStatus {
    pub key: WorkKey,
    pub binding_uid: String,
    /// The work revision the agent applied last.
    pub revision: i64,
    /// Whether the manifest is applied.
    pub applied: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_message: Option<String>,
    /// The object as it is in the member (metadata trimmed to what interpreters read), absent
    /// when it does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<ObservedObject>,
    /// When the agent observed it, to the microsecond (strictly increasing per work: the hub
    /// refuses an older report and takes an equal one as a replay).
    #[serde(with = "crate::time::micro")]
    pub observed_at: Time,
    /// The reset generation the agent last completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_generation: Option<i64>,
    /// The workload is suspended by fencing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fenced: bool,
    /// The work was withdrawn with `confirm_gone` and its object is gone from the cluster
    /// (deleted, no longer served, its dependents with it). `applied` is false and `observed`
    /// absent. The hub takes it only from the cluster it withdrew the work from, under that
    /// binding UID, while it waits for it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gone: bool,
}

/// An observed object as JSON text. The wire format is the object itself; the text is kept as
/// it came so that the hub parses it only when it interprets it (most reports repeat what the
/// hub already interpreted, which it tells by hashing the text) and so that a batch of reports
/// is a few allocations, not one per field.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ObservedObject(Box<serde_json::value::RawValue>);

impl ObservedObject {
    /// The JSON text of `value`.
    pub fn from_value(value: &serde_json::Value) -> Result<ObservedObject, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(ObservedObject)
    }

    /// The JSON text, as it came.
    pub fn json(&self) -> &str {
        self.0.get()
    }

    /// The object parsed.
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }
}

/// Equal texts (a different spacing or key order of the same object is unequal: a cache that
/// keys on the text then only misses).
impl PartialEq for ObservedObject {
    fn eq(&self, other: &ObservedObject) -> bool {
        self.json() == other.json()
    }
}

/// The hub's answer to a status report.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatusResponse {
    /// How many items were taken.
    pub accepted: usize,
    /// Items refused, with why (e.g. the work is not assigned to this cluster).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<RejectedItem>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RejectedItem {
    pub key: WorkKey,
    pub reason: String,
}

/// Every error answer: a Kubernetes-like Status body.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ErrorResponse {
    pub code: u16,
    /// A CamelCase reason: `Unauthorized`, `Forbidden`, `BadRequest`, `RequestEntityTooLarge`,
    /// `NotLeader`, `NotFound`.
    pub reason: String,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_observed_object_is_the_object_on_the_wire() {
        let object =
            json!({"kind": "AppWrapper", "status": {"phase": "Running", "conditions": []}});
        let observed = ObservedObject::from_value(&object).unwrap();
        assert_eq!(observed.to_value().unwrap(), object);
        // In a report, the field is the object itself, both ways.
        let item = json!({
            "key": {"namespace": "ml", "name": "train-appwrapper"}, "bindingUid": "u1",
            "revision": 3, "applied": true, "observedAt": "2026-05-01T12:00:00.250000Z",
            "observed": object,
        });
        let status: WorkStatus = serde_json::from_value(item.clone()).unwrap();
        assert_eq!(
            status.observed.as_ref().unwrap().to_value().unwrap(),
            object
        );
        assert_eq!(serde_json::to_value(&status).unwrap(), item);
        let from_text: WorkStatus = serde_json::from_str(&item.to_string()).unwrap();
        assert_eq!(from_text, status);
        // Not an object: still JSON, kept as it came.
        let text: ObservedObject = serde_json::from_str(" [1, 2] ").unwrap();
        assert_eq!(text.json(), "[1, 2]");
        assert!(serde_json::from_str::<ObservedObject>("{").is_err());
    }

    #[test]
    fn work_events_are_tagged_lines() {
        let ev = WorkEvent::Delete {
            key: WorkKey {
                namespace: "ml".into(),
                name: "train-appwrapper".into(),
            },
            revision: 7,
            binding_uid: String::new(),
            confirm_gone: false,
        };
        let line = serde_json::to_string(&ev).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&line).unwrap(),
            json!({"type": "Delete", "key": {"namespace": "ml", "name": "train-appwrapper"}, "revision": 7})
        );
        assert_eq!(serde_json::from_str::<WorkEvent>(&line).unwrap(), ev);
        let reset: WorkEvent =
            serde_json::from_value(json!({"type": "Reset", "epoch": "e1", "revision": 3})).unwrap();
        assert_eq!(
            reset,
            WorkEvent::Reset {
                epoch: "e1".into(),
                revision: 3
            }
        );
    }

    #[test]
    fn a_delete_awaiting_the_gone_report_names_its_binding() {
        let line = json!({"type": "Delete", "key": {"namespace": "ml", "name": "train-appwrapper"},
                          "revision": 9, "bindingUid": "rb-1", "confirmGone": true});
        let ev: WorkEvent = serde_json::from_value(line.clone()).unwrap();
        assert!(matches!(
            &ev,
            WorkEvent::Delete { binding_uid, confirm_gone: true, .. } if binding_uid == "rb-1"
        ));
        assert_eq!(serde_json::to_value(&ev).unwrap(), line);
        // A gone report: only the flag is new on the wire.
        let item: WorkStatus = serde_json::from_value(json!({
            "key": {"namespace": "ml", "name": "train-appwrapper"}, "bindingUid": "rb-1",
            "revision": 0, "applied": false, "observedAt": "2026-11-23T10:00:00Z", "gone": true}))
        .unwrap();
        assert!(item.gone && !item.applied && item.observed.is_none());
    }

    #[test]
    fn a_heartbeat_names_an_unanswering_member_api_only_when_there_is_one() {
        let quiet = HeartbeatRequest {
            identity: "agent-0".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&quiet).unwrap(),
            json!({"identity": "agent-0"})
        );
        let silent = HeartbeatRequest {
            member_api_unreachable_seconds: Some(31),
            ..quiet
        };
        let wire = serde_json::to_value(&silent).unwrap();
        assert_eq!(
            wire,
            json!({"identity": "agent-0", "memberApiUnreachableSeconds": 31})
        );
        assert_eq!(
            serde_json::from_value::<HeartbeatRequest>(wire).unwrap(),
            silent
        );
    }

    #[test]
    fn cursors_parse() {
        let c = Cursor::parse("a1b2:42").unwrap();
        assert_eq!((c.epoch.as_str(), c.revision), ("a1b2", 42));
        assert_eq!(c.to_string(), "a1b2:42");
        assert!(Cursor::parse("42").is_none());
        assert!(Cursor::parse(":42").is_none());
        assert!(Cursor::parse("e:x").is_none());
    }
}
