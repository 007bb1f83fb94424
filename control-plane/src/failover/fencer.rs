//! The hub's own fence: evidence that a `Directly` eviction's old copy no longer runs when its
//! cluster's agent cannot give it (dead, or cut off from the hub).
//!
//! The failover decision creates the new copy only on evidence ([`crate::failover::decide::PurgeEvidence`]);
//! while the old copy's cluster is not Ready it says `WaitingForFence` and the binder asks the
//! fencer here. With the fencing credential the cluster's agent gave ahead of time (a token that
//! may only delete objects Lifeboat placed, [`lifeboat_api::fencing`]), the fencer deletes the
//! copy through the member's kube-apiserver with foreground propagation and asks again until the
//! copy is gone ([`outcome`]); then it hands a gone report to the status processor, marked as
//! the hub's, exactly as an agent's would go. Nothing is taken on time: a member whose
//! apiserver does not answer (the whole cluster lost) keeps the failover waiting until its agent
//! is back, the apiserver answers, or an operator confirms (`lifeboatctl confirm-purge`).
//!
//! Requests are deduplicated per (cluster, work) and retried with a backoff while the hub still
//! awaits that purge ([`WorkStore::awaited_purge`]); a cluster whose apiserver does not answer is
//! backed off as a whole. Only the leader fences.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind};
use kube::config::{
    AuthInfo, Cluster as KubeconfigCluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo,
    NamedCluster, NamedContext,
};
use kube::core::ApiResource;
use kube::discovery::Scope;
use kube::runtime::reflector::{ObjectRef, Store};
use lifeboat_api::binding::GoneConfirmedBy;
use lifeboat_api::fencing;
use lifeboat_api::protocol::{StatusReport, WorkKey, WorkStatus};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::leadership::LeaderState;
use crate::status::intake::{StatusBatch, StatusIntake};
use crate::work::store::WorkStore;

/// The finalizer the kube-apiserver puts on an object deleted with foreground propagation; the
/// garbage collector removes it once every dependent that blocks its owner's deletion is gone.
const FOREGROUND_DELETION: &str = "foregroundDeletion";

/// First retry of a fence that is not done yet, doubled up to [`MAX_RETRY`] after an error and
/// up to [`MAX_DELETING_RETRY`] while the copy is being deleted (a cheap call, and the failover
/// waits for its answer).
const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(10);
const MAX_DELETING_RETRY: Duration = Duration::from_secs(1);
/// Each call to a member's kube-apiserver.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Fences tried at once.
const CONCURRENCY: usize = 16;

/// The member object a `Directly` eviction left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRequest {
    pub cluster: String,
    pub key: WorkKey,
    pub binding_uid: String,
    pub api_version: String,
    pub kind: String,
    /// The object's namespace (`None`: cluster-scoped).
    pub namespace: Option<String>,
    pub name: String,
}

/// Asks the fencer for fences (cheap to clone; requests of work it already fences are merged).
#[derive(Clone, Debug)]
pub struct FenceHandle {
    tx: mpsc::UnboundedSender<FenceRequest>,
}

impl FenceHandle {
    pub fn request(&self, request: FenceRequest) {
        let _ = self.tx.send(request);
    }
}

/// What one DELETE (foreground) of the copy showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No longer served, or deleted with every dependent it blocks on gone: nothing of the copy
    /// runs.
    Gone,
    /// Still being deleted (why, for the log).
    Deleting(&'static str),
}

/// Judges the answer to a foreground DELETE of a `kind` object: `None` is 404 (or deleted at
/// once). An object still served is gone for fencing once the garbage collector has removed the
/// `foregroundDeletion` finalizer that an earlier answer showed (`saw_foreground`): its blocking
/// dependents, down to the pods, are deleted; what remains is its controller's finalizer (an
/// AppWrapper's, whose controller is the dead agent). A Pod runs by itself: only its absence
/// counts.
pub fn outcome(kind: &str, object: Option<&DynamicObject>, saw_foreground: bool) -> Outcome {
    let Some(object) = object else {
        return Outcome::Gone;
    };
    if kind == "Pod" {
        return Outcome::Deleting("the pod is terminating");
    }
    let finalizers = object.metadata.finalizers.as_deref().unwrap_or_default();
    if finalizers.iter().any(|f| f == FOREGROUND_DELETION) {
        return Outcome::Deleting("its dependents are being deleted");
    }
    if object.metadata.deletion_timestamp.is_none() {
        return Outcome::Deleting("it is not marked for deletion yet");
    }
    if saw_foreground {
        Outcome::Gone
    } else {
        Outcome::Deleting("it was deleted without foreground propagation: waiting for it to go")
    }
}

/// Metrics of the fencer.
#[derive(Clone)]
pub struct FencerMetrics {
    /// Fence attempts by result: `gone`, `deleting`, `no_credential`, `unreachable`, `refused`,
    /// `error`.
    pub attempts: prometheus::IntCounterVec,
}

const RESULTS: [&str; 6] = [
    "gone",
    "deleting",
    "no_credential",
    "unreachable",
    "refused",
    "error",
];

impl FencerMetrics {
    pub fn new(registry: &prometheus::Registry) -> Result<FencerMetrics, prometheus::Error> {
        let attempts = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "lifeboat_hub_fence_attempts_total",
                "The hub's attempts to delete a Directly eviction's old copy through its member's kube-apiserver (the cluster's fencing credential), by result: gone, deleting, no_credential, unreachable, refused, error",
            ),
            &["result"],
        )?;
        for result in RESULTS {
            attempts.with_label_values(&[result]);
        }
        registry.register(Box::new(attempts.clone()))?;
        Ok(FencerMetrics { attempts })
    }
}

/// What the fencer needs from the rest of the hub.
pub struct FencerDeps {
    /// The fencing credential Secrets (the agent API keeps them, from the agents' heartbeats).
    pub credentials: Store<Secret>,
    /// Where each cluster's fencing credential Secret lives.
    pub namespace: String,
    pub work: Arc<WorkStore>,
    pub intake: StatusIntake,
    pub leadership: watch::Receiver<LeaderState>,
    pub metrics: FencerMetrics,
}

/// Starts the fencer; it runs until every handle is dropped.
pub fn spawn(deps: FencerDeps) -> FenceHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(deps, rx));
    FenceHandle { tx }
}

/// A fence not done yet.
struct Pending {
    request: FenceRequest,
    due: Instant,
    retry: Duration,
    saw_foreground: bool,
    in_flight: bool,
}

/// A member's kube-apiserver as the fencing credential reaches it.
struct MemberClient {
    digest: String,
    client: kube::Client,
    resources: HashMap<GroupVersionKind, (ApiResource, Scope)>,
}

/// Why one attempt did not end the fence.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error("cluster {0} gave the hub no fencing credential")]
    NoCredential(String),
    #[error("the fencing credential of cluster {cluster} is unusable: {why}")]
    BadCredential { cluster: String, why: String },
    #[error("the member's kube-apiserver does not answer: {0}")]
    Unreachable(kube::Error),
    #[error("the member refused the deletion: {0}")]
    Refused(kube::Error),
    #[error("{0}")]
    Kube(kube::Error),
}

impl AttemptError {
    fn metric_label(&self) -> &'static str {
        match self {
            AttemptError::NoCredential(_) | AttemptError::BadCredential { .. } => "no_credential",
            AttemptError::Unreachable(_) => "unreachable",
            AttemptError::Refused(_) => "refused",
            AttemptError::Kube(_) => "error",
        }
    }

    fn of(error: kube::Error) -> AttemptError {
        match &error {
            kube::Error::Api(s) if s.code == 401 || s.code == 403 => AttemptError::Refused(error),
            kube::Error::Api(_) => AttemptError::Kube(error),
            _ => AttemptError::Unreachable(error),
        }
    }
}

type Key = (String, WorkKey);

async fn run(deps: FencerDeps, mut rx: mpsc::UnboundedReceiver<FenceRequest>) {
    let mut pending: BTreeMap<Key, Pending> = BTreeMap::new();
    let mut clients: HashMap<String, MemberClient> = HashMap::new();
    // A cluster whose apiserver did not answer is left alone until then.
    let mut cluster_backoff: HashMap<String, (Instant, Duration)> = HashMap::new();
    let mut attempts: tokio::task::JoinSet<(
        Key,
        Option<MemberClient>,
        Result<AttemptResult, AttemptError>,
    )> = tokio::task::JoinSet::new();
    loop {
        let next = pending
            .values()
            .filter(|p| !p.in_flight)
            .map(|p| {
                cluster_backoff
                    .get(&p.request.cluster)
                    .map_or(p.due, |(until, _)| p.due.max(*until))
            })
            .min();
        tokio::select! {
            request = rx.recv() => {
                let Some(request) = request else { return };
                let key = (request.cluster.clone(), request.key.clone());
                match pending.get_mut(&key) {
                    Some(p) if p.request.binding_uid == request.binding_uid => {}
                    _ => {
                        tracing::info!(cluster = %request.cluster, binding = %request.key, "fencing the old copy through the member's kube-apiserver");
                        pending.insert(key, Pending {
                            request,
                            due: Instant::now(),
                            retry: FIRST_RETRY,
                            saw_foreground: false,
                            in_flight: false,
                        });
                    }
                }
            }
            Some(done) = attempts.join_next(), if !attempts.is_empty() => {
                let Ok((key, client, result)) = done else { continue };
                let key: Key = key;
                let cluster: &String = &key.0;
                if let Some(client) = client {
                    clients.insert(cluster.clone(), client);
                }
                let Some(p) = pending.get_mut(&key) else { continue };
                p.in_flight = false;
                match result {
                    Ok(AttemptResult::Reported) => {
                        deps.metrics.attempts.with_label_values(&["gone"]).inc();
                        cluster_backoff.remove(cluster);
                        pending.remove(&key);
                    }
                    Ok(AttemptResult::NotAwaited) => {
                        pending.remove(&key);
                    }
                    Ok(AttemptResult::Deleting { why, saw_foreground }) => {
                        deps.metrics.attempts.with_label_values(&["deleting"]).inc();
                        cluster_backoff.remove(cluster);
                        tracing::debug!(cluster = %cluster, binding = %p.request.key, why, "the old copy is still being deleted");
                        p.saw_foreground |= saw_foreground;
                        p.retry = p.retry.min(MAX_DELETING_RETRY);
                        p.due = Instant::now() + p.retry;
                        p.retry = (p.retry * 2).min(MAX_DELETING_RETRY);
                    }
                    Err(error) => {
                        deps.metrics.attempts.with_label_values(&[error.metric_label()]).inc();
                        tracing::warn!(cluster = %cluster, binding = %p.request.key, %error, "cannot fence the old copy yet");
                        if matches!(error, AttemptError::Unreachable(_)) {
                            let backoff = cluster_backoff
                                .get(cluster)
                                .map_or(FIRST_RETRY, |(_, b)| (*b * 2).min(MAX_RETRY));
                            cluster_backoff.insert(cluster.clone(), (Instant::now() + backoff, backoff));
                        }
                        // A missing credential may come with the agent's next heartbeat, a
                        // refusal may be mended by an operator: keep asking, slowly.
                        p.due = Instant::now() + p.retry;
                        p.retry = (p.retry * 2).min(MAX_RETRY);
                    }
                }
            }
            () = sleep_until(next) => {
                let now = Instant::now();
                if !deps.leadership.borrow().is_leader {
                    // A standby fences nothing; the next leader is asked by its own binder.
                    pending.clear();
                    continue;
                }
                let due: Vec<Key> = pending
                    .iter()
                    .filter(|(_, p)| !p.in_flight && p.due <= now)
                    .filter(|(k, _)| cluster_backoff.get(&k.0).is_none_or(|(until, _)| *until <= now))
                    .map(|(k, _)| k.clone())
                    .take(CONCURRENCY.saturating_sub(attempts.len()))
                    .collect();
                for key in due {
                    let Some(p) = pending.get_mut(&key) else { continue };
                    p.in_flight = true;
                    let request = p.request.clone();
                    let client = clients.remove(&key.0);
                    let credential = deps
                        .credentials
                        .get(&ObjectRef::new(&fencing::credential_secret_name(&request.cluster)).within(&deps.namespace));
                    let work = deps.work.clone();
                    let intake = deps.intake.clone();
                    let saw_foreground = p.saw_foreground;
                    attempts.spawn(async move {
                        let mut client = client;
                        let result = attempt(&request, credential.as_deref(), &mut client, &work, &intake, saw_foreground).await;
                        (key, client, result)
                    });
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

enum AttemptResult {
    /// The copy is gone and the processor took the report.
    Reported,
    /// The hub no longer awaits this purge (it was confirmed otherwise, or the eviction ended).
    NotAwaited,
    Deleting {
        why: &'static str,
        saw_foreground: bool,
    },
}

/// One try: delete the copy (foreground) and judge the answer; once it is gone, report it.
async fn attempt(
    request: &FenceRequest,
    credential: Option<&Secret>,
    client: &mut Option<MemberClient>,
    work: &WorkStore,
    intake: &StatusIntake,
    saw_foreground: bool,
) -> Result<AttemptResult, AttemptError> {
    if work
        .awaited_purge(&request.cluster, &request.key)
        .as_deref()
        != Some(request.binding_uid.as_str())
    {
        return Ok(AttemptResult::NotAwaited);
    }
    let credential =
        credential.ok_or_else(|| AttemptError::NoCredential(request.cluster.clone()))?;
    let digest = read_key(credential, fencing::KEY_DIGEST).unwrap_or_default();
    if client.as_ref().is_none_or(|c| c.digest != digest) {
        *client = Some(MemberClient {
            client: member_client(credential)
                .await
                .map_err(|why| AttemptError::BadCredential {
                    cluster: request.cluster.clone(),
                    why,
                })?,
            digest,
            resources: HashMap::new(),
        });
    }
    let Some(member) = client.as_mut() else {
        return Err(AttemptError::NoCredential(request.cluster.clone()));
    };
    let (group, version) = match request.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", request.api_version.as_str()),
    };
    let gvk = GroupVersionKind::gvk(group, version, &request.kind);
    let (resource, scope) = match member.resources.get(&gvk) {
        Some(found) => found.clone(),
        None => {
            let (resource, capabilities) = kube::discovery::pinned_kind(&member.client, &gvk)
                .await
                .map_err(AttemptError::of)?;
            member
                .resources
                .insert(gvk.clone(), (resource.clone(), capabilities.scope.clone()));
            (resource, capabilities.scope)
        }
    };
    let api: Api<DynamicObject> = match (&scope, &request.namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(member.client.clone(), ns, &resource),
        _ => Api::all_with(member.client.clone(), &resource),
    };
    // The first DELETE asks for foreground propagation (the apiserver adds the
    // `foregroundDeletion` finalizer, also to an object already being deleted). Later ones ask
    // for nothing: a foreground request would add the finalizer again each time, and its answer
    // would never show the garbage collector done; without a policy the apiserver keeps the
    // object's finalizers as they are and the answer shows them.
    let params = if saw_foreground {
        DeleteParams::default()
    } else {
        DeleteParams::foreground()
    };
    let answer = match api.delete(&request.name, &params).await {
        Ok(either) => either.left(),
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(error) => return Err(AttemptError::of(error)),
    };
    let shows_foreground = answer.as_ref().is_some_and(|o| {
        o.metadata
            .finalizers
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|f| f == FOREGROUND_DELETION)
    });
    match outcome(&request.kind, answer.as_ref(), saw_foreground) {
        Outcome::Deleting(why) => Ok(AttemptResult::Deleting {
            why,
            saw_foreground: shows_foreground,
        }),
        Outcome::Gone => report_gone(request, work, intake).await,
    }
}

/// Hands the hub's gone report to the status processor, as the agent's would go.
async fn report_gone(
    request: &FenceRequest,
    work: &WorkStore,
    intake: &StatusIntake,
) -> Result<AttemptResult, AttemptError> {
    let report = StatusReport {
        items: vec![WorkStatus {
            key: request.key.clone(),
            binding_uid: request.binding_uid.clone(),
            revision: work.revision(&request.cluster),
            applied: false,
            applied_message: None,
            observed: None,
            observed_at: Time(k8s_openapi::jiff::Timestamp::now()),
            reset_generation: None,
            fenced: false,
            gone: true,
        }],
        full: false,
    };
    let batch = StatusBatch {
        cluster: request.cluster.clone(),
        report,
        gone_confirmed_by: GoneConfirmedBy::Hub,
    };
    match intake.submit(batch).await {
        Ok(response) if response.rejected.is_empty() => {
            tracing::info!(cluster = %request.cluster, binding = %request.key, "the old copy is gone: fenced by the hub through the member's kube-apiserver");
            Ok(AttemptResult::Reported)
        }
        Ok(response) => {
            let why: Vec<&str> = response
                .rejected
                .iter()
                .map(|r| r.reason.as_str())
                .collect();
            tracing::info!(cluster = %request.cluster, binding = %request.key, why = %why.join("; "), "the hub's gone report was not taken");
            Ok(AttemptResult::NotAwaited)
        }
        // The processor stopped (this hub is shutting down or lost leadership).
        Err(_) => Ok(AttemptResult::NotAwaited),
    }
}

fn read_key(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
}

/// A client for the member's kube-apiserver with the fencing credential alone.
async fn member_client(secret: &Secret) -> Result<kube::Client, String> {
    let server = read_key(secret, fencing::KEY_SERVER)
        .filter(|s| !s.is_empty())
        .ok_or("the Secret has no server")?;
    let token = read_key(secret, fencing::KEY_TOKEN)
        .filter(|s| !s.is_empty())
        .ok_or("the Secret has no token")?;
    let ca = read_key(secret, fencing::KEY_CA).unwrap_or_default();
    let kubeconfig = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "member".into(),
            cluster: Some(KubeconfigCluster {
                server: Some(server),
                certificate_authority_data: (!ca.is_empty())
                    .then(|| base64::engine::general_purpose::STANDARD.encode(ca.as_bytes())),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "fencer".into(),
            auth_info: Some(AuthInfo {
                token: Some(token.into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: "fencer".into(),
            context: Some(Context {
                cluster: "member".into(),
                user: Some("fencer".into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some("fencer".into()),
        ..Default::default()
    };
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    config.connect_timeout = Some(CALL_TIMEOUT);
    config.read_timeout = Some(CALL_TIMEOUT);
    config.write_timeout = Some(CALL_TIMEOUT);
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(finalizers: &[&str], deleting: bool) -> DynamicObject {
        let mut o: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": "w", "namespace": "ns", "finalizers": finalizers}
        }))
        .unwrap();
        if deleting {
            o.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        }
        o
    }

    #[test]
    fn a_copy_is_gone_when_not_served_or_its_foreground_deletion_finished() {
        // 404 (or deleted at once)
        assert_eq!(outcome("AppWrapper", None, false), Outcome::Gone);
        assert_eq!(outcome("Pod", None, false), Outcome::Gone);
        // the garbage collector is deleting its dependents
        let deleting = object(
            &["workload.codeflare.dev/finalizer", FOREGROUND_DELETION],
            true,
        );
        assert!(matches!(
            outcome("AppWrapper", Some(&deleting), true),
            Outcome::Deleting(_)
        ));
        // the dependents are gone: only the dead controller's finalizer holds the object
        let held = object(&["workload.codeflare.dev/finalizer"], true);
        assert_eq!(outcome("AppWrapper", Some(&held), true), Outcome::Gone);
        // ... but only after this fence saw its foreground deletion: an object deleted in the
        // background by someone else says nothing about its dependents
        assert!(matches!(
            outcome("AppWrapper", Some(&held), false),
            Outcome::Deleting(_)
        ));
        // not even marked for deletion
        assert!(matches!(
            outcome("AppWrapper", Some(&object(&[], false)), true),
            Outcome::Deleting(_)
        ));
        // a terminating pod may still run its containers
        let pod = object(&[], true);
        assert!(matches!(
            outcome("Pod", Some(&pod), true),
            Outcome::Deleting(_)
        ));
    }

    #[test]
    fn refusals_and_silence_are_told_apart() {
        let refused = AttemptError::of(kube::Error::Api(
            kube::core::Status::failure("denied by the fencing policy", "Forbidden")
                .with_code(403)
                .boxed(),
        ));
        assert_eq!(refused.metric_label(), "refused");
        let other = AttemptError::of(kube::Error::Api(
            kube::core::Status::failure("boom", "InternalError")
                .with_code(500)
                .boxed(),
        ));
        assert_eq!(other.metric_label(), "error");
    }
}
