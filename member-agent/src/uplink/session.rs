//! One leadership term of hub mode: the credential, the heartbeat, the work stream, the applier
//! and the status reporter, all started together and all dropped together when leadership is
//! lost. Every failure inside is retried; the term ends by itself only when the hub answers a
//! heartbeat with `stop` (the cluster was deleted on the hub): the agent then removes the hub's
//! work, marks its credential Secret removed-from-hub and says so in a last heartbeat.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lifeboat_api::protocol::{
    Cursor, FencingCredential, HeartbeatRequest, HeartbeatResponse, Inventory, PROTOCOL_VERSION,
    RegisterRequest, WorkKey, heartbeat_path, work_path,
};
use lifeboat_api::stages;
use tokio::sync::watch;

use super::HubMode;
use super::applier::{Applier, ApplierParts};
use super::backoff::Backoff;
use super::catalog::ApiCatalog;
use super::client::CallError;
use super::credential::Credentials;
use super::fencer::{self, FencerBinding};
use super::fencing::{Fence, FenceChange};
use super::member_api::{self, MemberApi};
use super::namespaces::Namespaces;
use super::observe::{self, ClusterState};
use super::reporter::{self, SharedBook};
use super::work::{Step, StreamState};
use crate::node_health::NodeHealthIndex;

/// How often the fencing credential's objects are applied again (a deleted token Secret comes
/// back, and its new token goes to the hub).
const FENCING_CREDENTIAL_REFRESH: Duration = Duration::from_secs(300);

/// The term ended because the hub deleted this cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped;

/// `since` of the work stream's query: `epoch:revision`, percent-encoded.
pub fn since_query(cursor: &Cursor) -> String {
    let mut out = String::from("since=");
    for b in cursor.to_string().bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Runs one term until the hub says stop (then removes the hub's work, marks the credential
/// Secret removed and tells the hub it stopped).
pub async fn run(mode: &HubMode) -> Stopped {
    let client = mode.client.clone();
    let options = &mode.options;
    let identity = options
        .identity
        .clone()
        .unwrap_or_else(lifeboat_runtime::leader::default_identity);
    let namespaces = Arc::new(Namespaces::new(client.clone()).with_fencer(
        mode.fencing.as_ref().map(|t| FencerBinding {
            service_account_namespace: t.namespace.clone(),
        }),
    ));
    let (fencing_tx, fencing_credential) = watch::channel(None);
    let credentials = Arc::new(Credentials::new(
        client.clone(),
        mode.hub.clone(),
        options.credential_secret.clone(),
        options.bootstrap_token_file.clone(),
        RegisterRequest {
            cluster_name: mode.cluster.clone(),
            identity: identity.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            protocol_version: PROTOCOL_VERSION.to_string(),
            fencing_period_seconds: i32::try_from(options.fencing_period.as_secs())
                .unwrap_or(i32::MAX),
            provider: options.provider.clone(),
            region: options.region.clone(),
            zone: options.zone.clone(),
        },
        namespaces.clone(),
    ));
    let catalog = Arc::new(ApiCatalog::new(client.clone()));
    let book = Arc::new(SharedBook::new());
    let fence = Arc::new(Fence::new(options.fencing_period));
    mode.metrics.fenced.set(0);
    let (applier, queue) = Applier::new(ApplierParts {
        client: client.clone(),
        catalog: catalog.clone(),
        namespaces: namespaces.clone(),
        book: book.clone(),
        metrics: mode.metrics.clone(),
        cluster: mode.cluster.clone(),
        max_backoff: options.timing.max_backoff,
        fence: fence.clone(),
    });
    let cluster_state = Arc::new(ClusterState::default());
    let member_api = Arc::new(MemberApi::new(options.timing.member_api_timeout));
    mode.metrics.member_api_unreachable.set(0);
    // Dropped (and so aborted) with this future.
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(observe::watch_nodes(
        client.clone(),
        cluster_state.clone(),
        NodeHealthIndex::new(mode.autopilot.clone(), mode.reclamation_taints.clone()),
        mode.reclamation_taints.clone(),
    ));
    tasks.spawn(observe::watch_pods(client.clone(), cluster_state.clone()));
    tasks.spawn(applier.clone().run(queue, options.timing.apply_concurrency));
    tasks.spawn(reporter::run_batcher(
        book.clone(),
        mode.hub.clone(),
        credentials.clone(),
        mode.cluster.clone(),
        mode.metrics.clone(),
        options.timing.max_backoff,
    ));
    tasks.spawn(refresh_discovery(
        catalog.clone(),
        options.timing.discovery_every,
    ));
    tasks.spawn(member_api::probe(
        client.clone(),
        member_api.clone(),
        options.timing.request_timeout,
    ));
    tasks.spawn(watch_fence(
        mode.cluster.clone(),
        fence.clone(),
        applier.clone(),
        mode.metrics.clone(),
    ));
    if let Some(target) = mode.fencing.clone() {
        tasks.spawn(fencer::provide(
            client.clone(),
            target,
            namespaces.clone(),
            fencing_tx,
            FENCING_CREDENTIAL_REFRESH,
        ));
    }
    let stream = stream_work(mode, &credentials, &applier, &book, &fence);
    let heartbeat = heartbeat(
        mode,
        &identity,
        &credentials,
        &cluster_state,
        &catalog,
        &applier,
        &fence,
        &member_api,
        &fencing_credential,
    );
    tokio::select! {
        () = stream => {}
        () = heartbeat => {}
    }
    tracing::error!(cluster = %mode.cluster, "the hub deleted this cluster: removing its work; hub mode stops until the cluster is joined again");
    match applier.remove_everything().await {
        Ok(deleted) => tracing::info!(deleted, "removed the hub's work"),
        Err(e) => tracing::warn!(error = %e, "cannot remove all of the hub's work"),
    }
    // The work goes first: a restart before the mark finds the Cluster still being deleted
    // and is told to stop again; after the mark, it stays stopped.
    let at = k8s_openapi::jiff::Timestamp::now().to_string();
    let mut backoff = Backoff::new(Duration::from_millis(500), options.timing.max_backoff);
    for attempt in 1..=MARK_ATTEMPTS {
        match credentials.mark_removed(&at).await {
            Ok(()) => break,
            Err(e) if attempt == MARK_ATTEMPTS => {
                tracing::error!(secret = %options.credential_secret, error = %e, "cannot mark the credential Secret removed from the hub: a restart may register this cluster again")
            }
            Err(e) => {
                tracing::warn!(secret = %options.credential_secret, error = %e, "marking the credential Secret removed from the hub failed; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
    confirm_stopped(mode, &identity, &credentials).await;
    mode.metrics.connected.set(0);
    Stopped
}

/// Tries to mark the credential Secret removed this many times.
const MARK_ATTEMPTS: u32 = 5;

/// The last heartbeat: tells the hub that the hub's work is gone and the agent stopped, so the
/// hub lets the deleted Cluster go at once instead of after the cluster's lease. Tried until
/// the hub takes it or no longer knows the cluster (401, 403: it went meanwhile), at most for a
/// lease duration (the hub lets the Cluster go by then anyway).
async fn confirm_stopped(mode: &HubMode, identity: &str, credentials: &Credentials) {
    let Some(credential) = credentials.current() else {
        return;
    };
    let path = heartbeat_path(&mode.cluster);
    let request = HeartbeatRequest {
        identity: identity.to_string(),
        stopped: true,
        ..HeartbeatRequest::default()
    };
    let deadline = Instant::now() + credential.lease_duration;
    let mut backoff = Backoff::new(Duration::from_millis(200), mode.options.timing.max_backoff);
    loop {
        let result: Result<HeartbeatResponse, _> = mode
            .hub
            .post("heartbeat", &path, &credential.token, &request)
            .await;
        match result {
            Ok(_) => {
                tracing::info!("told the hub that this agent stopped");
                return;
            }
            Err(e @ (CallError::Unauthorized { .. } | CallError::Forbidden { .. })) => {
                tracing::info!(error = %e, "the hub no longer knows this cluster: nothing to confirm");
                return;
            }
            Err(e) if Instant::now() >= deadline => {
                tracing::warn!(error = %e, "could not tell the hub that this agent stopped; it lets the cluster go when its lease runs out");
                return;
            }
            Err(e) => {
                let wait = e.retry_after().unwrap_or_else(|| backoff.next_delay());
                tracing::warn!(error = %e, retry_in = ?wait, "telling the hub that this agent stopped failed");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

async fn refresh_discovery(catalog: Arc<ApiCatalog>, every: Duration) {
    let mut backoff = Backoff::new(Duration::from_secs(1), every);
    loop {
        match catalog.refresh_if_older(every / 2).await {
            Ok(_) => {
                backoff.reset();
                tokio::time::sleep(every).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "discovery of the member's APIs failed");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// Fences the cluster once the hub has been out of reach for the fencing period: the works
/// with purgeMode Directly are applied again, suspended, and the work stream reconnects for a
/// full snapshot (what lifts the fence with the next heartbeat).
async fn watch_fence(
    cluster: String,
    fence: Arc<Fence>,
    applier: Arc<Applier>,
    metrics: super::HubMetrics,
) {
    let every = (fence.period() / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        if fence.tick(Instant::now()) == FenceChange::Fenced {
            metrics.fenced.set(1);
            fence.set_suspended(applier.fenceable_keys());
            let works = applier.requeue_fenceable();
            tracing::warn!(%cluster, period = ?fence.period(), works, "fenced: the hub has been out of reach for the fencing period; suspending the works with purgeMode Directly");
            fence.resync.notify_waiters();
        }
    }
}

/// The fence lifted: the fenced works are applied as the hub sends them again.
fn fence_lifted(cluster: &str, applier: &Applier, metrics: &super::HubMetrics) {
    metrics.fenced.set(0);
    let works = applier.requeue_fenceable();
    tracing::info!(%cluster, works, "fence lifted: the hub is reachable and its snapshot is applied");
}

/// The least time between a heartbeat and one sent early because a node changed.
const EARLY_HEARTBEAT_SPACING: Duration = Duration::from_secs(1);

/// Whether the inventory goes with this heartbeat: the first one, a change, or the periodic
/// resend.
pub fn inventory_due(
    current: Option<&Inventory>,
    last_sent: Option<&(Inventory, Instant)>,
    every: Duration,
) -> bool {
    match (current, last_sent) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(now), Some((sent, at))) => now != sent || at.elapsed() >= every,
    }
}

/// The fencing credential to send with a heartbeat: ours, when the hub's last answer showed it
/// holds another one or none (or before any answer).
pub fn fencing_credential_due(
    ours: Option<&FencingCredential>,
    hub_digest: Option<&Option<String>>,
) -> Option<FencingCredential> {
    let ours = ours?;
    match hub_digest {
        Some(Some(digest)) if *digest == ours.digest() => None,
        _ => Some(ours.clone()),
    }
}

/// Heartbeats until the hub says stop.
#[allow(clippy::too_many_arguments)]
async fn heartbeat(
    mode: &HubMode,
    identity: &str,
    credentials: &Credentials,
    cluster_state: &ClusterState,
    catalog: &ApiCatalog,
    applier: &Applier,
    fence: &Fence,
    member_api: &MemberApi,
    fencing_credential: &watch::Receiver<Option<FencingCredential>>,
) {
    let path = heartbeat_path(&mode.cluster);
    // The digest of the fencing credential the hub holds (`None` at first: unknown).
    let mut hub_fencing_digest: Option<Option<String>> = None;
    let timing = &mode.options.timing;
    let mut backoff = Backoff::new(Duration::from_millis(500), timing.max_backoff);
    let mut last_sent: Option<(Inventory, Instant)> = None;
    let mut member_api_silent = false;
    loop {
        let credential = match credentials.get().await {
            Ok(c) => c,
            Err(e) => {
                mode.metrics.connected.set(0);
                let wait = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?wait, "no credential for the hub");
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        let inventory = cluster_state.inventory().map(|mut inventory| {
            if let Some(api) = catalog.peek() {
                inventory.kubernetes_version = api.kubernetes_version.clone();
                inventory.api_enablements = api.enablements.clone();
            }
            inventory
        });
        let send = inventory_due(
            inventory.as_ref(),
            last_sent.as_ref(),
            timing.inventory_every,
        );
        // While fenced, the heartbeat names the suspended works (the hub records it).
        let fenced = fence.suspended();
        let sent = Instant::now();
        let silent = member_api.unreachable_for(sent);
        member_api_changed(mode, silent, &mut member_api_silent);
        let fencing = fencing_credential_due(
            fencing_credential.borrow().as_ref(),
            hub_fencing_digest.as_ref(),
        );
        let request = HeartbeatRequest {
            identity: identity.to_string(),
            inventory: if send { inventory.clone() } else { None },
            fenced,
            member_api_unreachable_seconds: silent.map(|d| d.as_secs()),
            fencing_credential: fencing,
            stopped: false,
        };
        let result: Result<HeartbeatResponse, _> = mode
            .hub
            .post("heartbeat", &path, &credential.token, &request)
            .await;
        match result {
            Ok(response) => {
                mode.metrics.connected.set(1);
                backoff.reset();
                hub_fencing_digest = Some(response.fencing_credential_digest.clone());
                // Contact for the fence only while the member's apiserver answers: the hub
                // counts a cluster whose heartbeats say otherwise as not Ready (`member_api`).
                if silent.is_none() && fence.heartbeat_ok(sent) == FenceChange::Lifted {
                    fence_lifted(&mode.cluster, applier, &mode.metrics);
                }
                if send && let Some(inventory) = inventory {
                    tracing::debug!(
                        nodes = inventory.node_summary.total_num,
                        groups = inventory.node_groups.len(),
                        "inventory sent"
                    );
                    last_sent = Some((inventory, Instant::now()));
                }
                if response.stop {
                    return;
                }
                // The next heartbeat at its interval, or sooner (at least a second after this
                // one) when a node changed: its inventory tells the hub whether the workloads
                // still fit here, which decides whether a node notice moves them. At once when
                // the member's apiserver stopped or started answering: the hub acts on it.
                let next = tokio::time::Instant::now() + credential.heartbeat_interval;
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    () = member_api.changed.notified() => {}
                    () = cluster_state.nodes_changed.notified() => {
                        tokio::time::sleep_until(
                            (tokio::time::Instant::now() + EARLY_HEARTBEAT_SPACING).min(next),
                        )
                        .await;
                    }
                }
            }
            Err(e) if e.is_unauthorized() => {
                mode.metrics.connected.set(0);
                // The next heartbeat carries the inventory again: the hub may have lost it.
                last_sent = None;
                if let Err(e) = credentials.rejected(&credential.token).await {
                    let wait = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?wait, "registering again failed");
                    tokio::time::sleep(wait).await;
                }
            }
            Err(e) => {
                mode.metrics.connected.set(0);
                let wait = e
                    .retry_after()
                    .unwrap_or_else(|| backoff.next_delay())
                    .min(credential.heartbeat_interval);
                tracing::warn!(error = %e, retry_in = ?wait, "heartbeat failed");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Logs and counts when the member's apiserver stops or starts answering again.
fn member_api_changed(mode: &HubMode, silent: Option<Duration>, was_silent: &mut bool) {
    match (silent, *was_silent) {
        (Some(for_), false) => tracing::warn!(
            cluster = %mode.cluster,
            silent = ?for_,
            "the member's kube-apiserver does not answer: the heartbeats tell the hub, which marks the cluster not Ready"
        ),
        (None, true) => {
            tracing::info!(cluster = %mode.cluster, "the member's kube-apiserver answers again")
        }
        _ => {}
    }
    *was_silent = silent.is_some();
    mode.metrics
        .member_api_unreachable
        .set(i64::from(*was_silent));
}

/// Consumes the work stream forever, reconnecting from the cursor.
async fn stream_work(
    mode: &HubMode,
    credentials: &Credentials,
    applier: &Applier,
    book: &SharedBook,
    fence: &Fence,
) {
    let timing = &mode.options.timing;
    let mut state = StreamState::default();
    let mut backoff = Backoff::new(Duration::from_millis(200), timing.max_backoff);
    loop {
        let credential = match credentials.get().await {
            Ok(c) => c,
            Err(e) => {
                let wait = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?wait, "no credential for the work stream");
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        if fence.is_fenced() {
            // Only a full snapshot says which fenced works the hub still wants here.
            state.forget();
        }
        let requested = Instant::now();
        let path = match state.cursor() {
            Some(cursor) => format!("{}?{}", work_path(&mode.cluster), since_query(cursor)),
            None => work_path(&mode.cluster),
        };
        match mode
            .hub
            .open_stream(&path, &credential.token, timing.stream_idle_timeout)
            .await
        {
            Ok(mut stream) => {
                tracing::info!(since = ?state.cursor().map(|c| c.to_string()), "work stream open");
                let mut progressed = false;
                let reason = 'read: loop {
                    let next = tokio::select! {
                        next = stream.next() => next,
                        () = fence.resync.notified() => {
                            state.forget();
                            break 'read "fenced: reconnecting for a full snapshot".to_string();
                        }
                    };
                    match next {
                        Ok(Some(events)) => {
                            for event in events {
                                progressed = true;
                                match state.on_event(event) {
                                    Ok(Step::SnapshotComplete { keys }) => {
                                        complete_snapshot(keys, applier, book).await;
                                        if fence.snapshot_complete(requested) == FenceChange::Lifted
                                        {
                                            fence_lifted(&mode.cluster, applier, &mode.metrics);
                                        }
                                    }
                                    Ok(step) => handle(step, applier, book).await,
                                    Err(e) => {
                                        // Start over from a full snapshot.
                                        state.forget();
                                        break 'read e.to_string();
                                    }
                                }
                            }
                        }
                        Ok(None) => break "the hub ended the stream".to_string(),
                        Err(e) => break e.to_string(),
                    }
                };
                state.interrupted();
                if progressed {
                    backoff.reset();
                }
                tracing::info!(%reason, "work stream closed; reconnecting");
            }
            Err(e) if e.is_unauthorized() => {
                if let Err(e) = credentials.rejected(&credential.token).await {
                    tracing::warn!(error = %e, "registering again failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot open the work stream"),
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

async fn handle(step: Step, applier: &Applier, book: &SharedBook) {
    match step {
        Step::Apply(work) => {
            tracing::debug!(target: stages::TARGET, stage = stages::WORK_RECEIVED,
                cluster = %applier.cluster(), work = %work.key, revision = work.revision);
            applier.upsert(work)
        }
        Step::Remove { key, confirm } => applier.remove(&key, confirm),
        Step::SnapshotComplete { keys } => complete_snapshot(keys, applier, book).await,
        Step::Nothing => {}
    }
}

/// A full snapshot arrived: works not in it go; every labelled object no work names is
/// deleted (what the agent made before a restart is adopted by the applies of the same names);
/// the next status report is full.
async fn complete_snapshot(keys: BTreeSet<WorkKey>, applier: &Applier, book: &SharedBook) {
    for key in applier.keys() {
        if !keys.contains(&key) {
            applier.remove(&key, None);
        }
    }
    if let Err(e) = applier.sweep(&keys).await {
        tracing::warn!(error = %e, "sweep after the snapshot failed; the next snapshot retries it");
    }
    reporter::request_full(book);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_goes_in_the_query_encoded() {
        let cursor = Cursor {
            epoch: "a1b2".into(),
            revision: 42,
        };
        assert_eq!(since_query(&cursor), "since=a1b2:42");
        let odd = Cursor {
            epoch: "e 1/&".into(),
            revision: 7,
        };
        assert_eq!(since_query(&odd), "since=e%201%2F%26:7");
    }

    #[test]
    fn the_fencing_credential_goes_until_the_hub_holds_it() {
        let ours = FencingCredential {
            server: "https://m1:6443".into(),
            certificate_authority: String::new(),
            token: "t".into(),
        };
        // none yet: nothing to send
        assert_eq!(fencing_credential_due(None, None), None);
        // no answer yet, the hub holds none, or another one: send it
        assert_eq!(
            fencing_credential_due(Some(&ours), None),
            Some(ours.clone())
        );
        assert_eq!(
            fencing_credential_due(Some(&ours), Some(&None)),
            Some(ours.clone())
        );
        assert_eq!(
            fencing_credential_due(Some(&ours), Some(&Some("other".into()))),
            Some(ours.clone())
        );
        // the hub holds it: not again
        assert_eq!(
            fencing_credential_due(Some(&ours), Some(&Some(ours.digest()))),
            None
        );
    }

    #[test]
    fn the_inventory_goes_when_new_changed_or_due() {
        let every = Duration::from_secs(60);
        let a = Inventory::default();
        let mut b = Inventory::default();
        b.node_summary.total_num = 1;
        assert!(!inventory_due(None, None, every), "not synced yet");
        assert!(inventory_due(Some(&a), None, every), "first");
        let fresh = (a.clone(), Instant::now());
        assert!(!inventory_due(Some(&a), Some(&fresh), every), "unchanged");
        assert!(inventory_due(Some(&b), Some(&fresh), every), "changed");
        let old = (a.clone(), Instant::now() - Duration::from_secs(61));
        assert!(
            inventory_due(Some(&a), Some(&old), every),
            "a minute passed"
        );
    }
}
