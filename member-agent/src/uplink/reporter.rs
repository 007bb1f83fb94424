//! Status reporting, the IO around [`StatusBook`]: one watch per applied kind (label selector
//! on the binding label, all namespaces) feeds the book; a batcher sends a change to the hub
//! at once (after [`REPORT_COALESCE`], so that the changes of one moment go in one report;
//! the changes made while a report is on its way go in the next), and retries every
//! [`REPORT_INTERVAL`] what could not go yet. A failure is in the hub a round trip after the
//! agent saw it, not at the next tick or second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher;
use lifeboat_api::binding::LABEL_BINDING_NAME;
use lifeboat_api::protocol::{StatusResponse, WorkKey, status_path};
use lifeboat_api::stages;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::backoff::Backoff;
use super::client::HubClient;
use super::credential::Credentials;
use super::metrics::HubMetrics;
use super::work::{ObjectId, key_of};
use super::work_status::{StatusBook, trim_observed};
use crate::controller::watches::{Change, Feeder};

/// Most works in one report.
pub const MAX_BATCH: usize = 500;
/// How often the batcher looks again at what could not be sent at once (a full report waiting
/// for a snapshot's applies, a change in the microsecond of the work's last report).
pub const REPORT_INTERVAL: Duration = Duration::from_millis(200);
/// How long the batcher waits after a change before it takes a batch: bounds the reports per
/// second of an agent whose works change all the time, at a cost nobody sees.
pub const REPORT_COALESCE: Duration = Duration::from_millis(2);

/// The book, shared by the applier, the watches and the batcher.
pub struct SharedBook {
    book: Mutex<StatusBook>,
    /// Woken when something new waits to be reported.
    wake: Notify,
}

impl Default for SharedBook {
    fn default() -> Self {
        Self::new()
    }
}

impl SharedBook {
    /// The book of a term starting now (see [`StatusBook::starting_at`]).
    pub fn new() -> Self {
        Self {
            book: Mutex::new(StatusBook::starting_at(now_micros())),
            wake: Notify::new(),
        }
    }

    /// Runs `f` on the book; wakes the batcher when `f` left more to report than before
    /// (never when it took a batch: a backlog the batcher cannot send yet must not spin it).
    pub fn with<T>(&self, f: impl FnOnce(&mut StatusBook) -> T) -> T {
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        let before = book.backlog();
        let out = f(&mut book);
        if book.backlog() > before {
            self.wake.notify_one();
        }
        out
    }
}

impl SharedBook {
    /// The applier saw the copy of a purge gone: the batcher sends the report at once (the
    /// hub's `Directly` failover waits for it), not at its next tick.
    pub fn report_gone(&self, key: &lifeboat_api::protocol::WorkKey, binding_uid: &str) {
        self.with(|b| b.gone(key, binding_uid));
        self.wake.notify_one();
    }
}

/// Now, in microseconds since the epoch (the book's time).
fn now_micros() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_microsecond()
}

/// Starts a request for a full report (after a snapshot).
pub fn request_full(book: &SharedBook) {
    book.with(|b| b.request_full(now_micros()));
}

/// The watches of applied kinds; stopped when dropped.
pub struct StatusWatches {
    client: kube::Client,
    book: Arc<SharedBook>,
    watches: Mutex<HashMap<(String, String), AbortHandle>>,
    /// Told the work of each deleted object the watches see.
    on_deleted: Arc<dyn Fn(WorkKey) + Send + Sync>,
}

impl StatusWatches {
    pub fn new(
        client: kube::Client,
        book: Arc<SharedBook>,
        on_deleted: Arc<dyn Fn(WorkKey) + Send + Sync>,
    ) -> Self {
        Self {
            client,
            book,
            watches: Mutex::new(HashMap::new()),
            on_deleted,
        }
    }

    /// Watches the objects of `resource` carrying binding labels, if not yet.
    pub fn ensure(&self, resource: &ApiResource) {
        let mut watches = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        let kind = (resource.group.clone(), resource.kind.clone());
        if watches.contains_key(&kind) {
            return;
        }
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
        let stream = lifeboat_runtime::watch::backoff(watcher(
            api,
            watcher::Config::default().labels(LABEL_BINDING_NAME),
        ));
        let book = self.book.clone();
        let on_deleted = self.on_deleted.clone();
        let resource = resource.clone();
        let task = tokio::spawn(async move {
            tracing::info!(kind = %resource.kind, group = %resource.group, "watching applied kind for status");
            let mut feeder = Feeder::default();
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let event = match event {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(kind = %resource.kind, error = %e, "status watch error; retrying with backoff");
                        continue;
                    }
                };
                match feeder.feed(event) {
                    Some(Change::Reset(objects)) => {
                        let seen = objects
                            .iter()
                            .filter_map(|o| observation(&resource, o))
                            .collect();
                        book.with(|b| b.relist(&resource.group, &resource.kind, seen));
                    }
                    Some(Change::Apply(object)) => {
                        if let Some((id, key, value)) = observation(&resource, &object) {
                            book.with(|b| b.observe(id, Some((key, value))));
                        }
                    }
                    Some(Change::Delete(object)) => {
                        book.with(|b| b.observe(object_id(&resource, &object), None));
                        if let Some(key) = object.metadata.labels.as_ref().and_then(key_of) {
                            on_deleted(key);
                        }
                    }
                    None => {}
                }
            }
        });
        watches.insert(kind, task.abort_handle());
    }
}

impl Drop for StatusWatches {
    fn drop(&mut self) {
        for task in self
            .watches
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            task.abort();
        }
    }
}

fn object_id(resource: &ApiResource, object: &DynamicObject) -> ObjectId {
    ObjectId {
        group: resource.group.clone(),
        kind: resource.kind.clone(),
        namespace: object.metadata.namespace.clone(),
        name: object.metadata.name.clone().unwrap_or_default(),
    }
}

fn observation(
    resource: &ApiResource,
    object: &DynamicObject,
) -> Option<(ObjectId, lifeboat_api::protocol::WorkKey, serde_json::Value)> {
    let key = key_of(object.metadata.labels.as_ref()?)?;
    let value = serde_json::to_value(object).ok()?;
    Some((
        object_id(resource, object),
        key,
        trim_observed(&value, &resource.api_version, &resource.kind),
    ))
}

/// Sends the book's changes to the hub until dropped.
pub async fn run_batcher(
    book: Arc<SharedBook>,
    hub: Arc<HubClient>,
    credentials: Arc<Credentials>,
    cluster: String,
    metrics: HubMetrics,
    max_backoff: Duration,
) {
    let path = status_path(&cluster);
    let mut backoff = Backoff::new(REPORT_INTERVAL, max_backoff);
    let mut ticker = tokio::time::interval(REPORT_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = book.wake.notified() => tokio::time::sleep(REPORT_COALESCE).await,
        }
        while let Some(batch) = book.with(|b| b.take(now_micros(), MAX_BATCH)) {
            let credential = match credentials.get().await {
                Ok(c) => c,
                Err(e) => {
                    book.with(|b| b.failed(&batch));
                    tracing::warn!(error = %e, "no credential to report status with");
                    tokio::time::sleep(backoff.next_delay()).await;
                    break;
                }
            };
            let items = batch.report.items.len();
            if tracing::enabled!(target: stages::TARGET, tracing::Level::DEBUG) {
                for item in &batch.report.items {
                    tracing::debug!(target: stages::TARGET, stage = stages::REPORT_SENT,
                        cluster = %cluster, work = %item.key);
                }
            }
            let result: Result<StatusResponse, _> = hub
                .post("status", &path, &credential.token, &batch.report)
                .await;
            match result {
                Ok(response) => {
                    backoff.reset();
                    book.with(|b| b.answered(&batch));
                    metrics.status_reports.with_label_values(&["ok"]).inc();
                    tracing::debug!(
                        items,
                        full = batch.report.full,
                        accepted = response.accepted,
                        "status reported"
                    );
                    for rejected in &response.rejected {
                        tracing::info!(work = %rejected.key, reason = %rejected.reason, "the hub refused a status report");
                    }
                }
                Err(e) => {
                    metrics.status_reports.with_label_values(&["failed"]).inc();
                    book.with(|b| b.failed(&batch));
                    if e.is_unauthorized() {
                        if let Err(e) = credentials.rejected(&credential.token).await {
                            tracing::warn!(error = %e, "registering again failed");
                        }
                    } else {
                        tracing::warn!(error = %e, items, "status report failed; keeping the latest state to send again");
                    }
                    let wait = e
                        .retry_after()
                        .map(|d| d.min(max_backoff))
                        .unwrap_or_else(|| backoff.next_delay());
                    tokio::time::sleep(wait).await;
                    break;
                }
            }
        }
    }
}
