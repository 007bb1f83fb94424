//! Watches that keep the caches current and trigger reconciles: AppWrappers, pods with the
//! AppWrapper label, nodes (health), and, started on first use, the wrapped objects of every kind
//! AppWrappers use. Failures are noticed from these watches, not from a periodic poll. Each
//! watch reports its initial sync to the process's readiness.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use lifeboat_api::appwrapper::AppWrapper;
use lifeboat_api::appwrapper::constants::APPWRAPPER_LABEL;
use lifeboat_api::stages;
use lifeboat_runtime::cache::Cache;
use lifeboat_runtime::readiness::{Readiness, WatchSync};
use tokio::task::AbortHandle;

use crate::index::{AwKey, ComponentIndex, PodIndex};
use crate::node_health::NodeHealthIndex;

/// Asks for reconciles; each request carries when it was made (for the queue wait metric).
pub type Trigger = UnboundedSender<(ObjectRef<AppWrapper>, Instant)>;

pub fn trigger(tx: &Trigger, keys: impl IntoIterator<Item = AwKey>) {
    let now = Instant::now();
    for key in keys {
        let _ = tx.unbounded_send((ObjectRef::new(&key.name).within(&key.namespace), now));
    }
}

/// Applies one watcher event to an index, buffering a re-list until it is complete.
pub struct Feeder<K> {
    buffer: Option<Vec<K>>,
}

impl<K> Default for Feeder<K> {
    fn default() -> Self {
        Self { buffer: None }
    }
}

impl<K> Feeder<K> {
    /// Returns what to do: `Some(Reset(objs))`, `Some(Apply(obj))`, `Some(Delete(obj))`.
    pub fn feed(&mut self, event: watcher::Event<K>) -> Option<Change<K>> {
        match event {
            watcher::Event::Init => {
                self.buffer = Some(Vec::new());
                None
            }
            watcher::Event::InitApply(obj) => {
                self.buffer.get_or_insert_with(Vec::new).push(obj);
                None
            }
            watcher::Event::InitDone => Some(Change::Reset(self.buffer.take().unwrap_or_default())),
            watcher::Event::Apply(obj) => Some(Change::Apply(obj)),
            watcher::Event::Delete(obj) => Some(Change::Delete(obj)),
        }
    }
}

pub enum Change<K> {
    Reset(Vec<K>),
    Apply(K),
    Delete(K),
}

fn labelled() -> watcher::Config {
    watcher::Config::default().labels(APPWRAPPER_LABEL)
}

async fn run<K, S>(
    name: &'static str,
    stream: S,
    sync: WatchSync,
    mut on_change: impl FnMut(Change<K>),
) where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut feeder = Feeder::default();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                if let Some(change) = feeder.feed(event) {
                    let initial_list = matches!(change, Change::Reset(_));
                    on_change(change);
                    if initial_list {
                        sync.synced();
                    }
                }
            }
            Err(e) => {
                tracing::warn!(watch = name, error = %e, "watch error; retrying with backoff")
            }
        }
    }
}

/// The watches every controller starts, registered with the process's readiness before they
/// run (so that `/readyz` is not ready before the controller has even started).
pub struct CoreWatches {
    pub appwrappers: WatchSync,
    pub pods: WatchSync,
    pub nodes: WatchSync,
}

impl CoreWatches {
    pub fn expect(readiness: &Readiness) -> Self {
        Self {
            appwrappers: readiness.expect("appwrappers"),
            pods: readiness.expect("pods"),
            nodes: readiness.expect("nodes"),
        }
    }
}

/// Watches AppWrappers into the controller's cache (without managed fields, the largest part of
/// an object that the controller never reads) and asks for a reconcile of each one that changed.
/// It runs whether or not this replica leads, so a standby's cache is warm.
pub async fn watch_appwrappers(
    client: kube::Client,
    writer: reflector::store::Writer<AppWrapper>,
    tx: Trigger,
    sync: WatchSync,
) {
    let api: Api<AppWrapper> = Api::all(client);
    Cache::with_writer(api, "appwrappers", writer)
        .without_managed_fields()
        .report_sync(sync)
        .run(|event| {
            if let watcher::Event::Apply(aw) | watcher::Event::InitApply(aw) = event {
                let key = AwKey::new(aw.namespace().unwrap_or_default(), aw.name_any());
                trigger(&tx, [key]);
            }
        })
        .await;
}

/// Watches the AppWrapper-labelled pods of the cluster.
pub async fn watch_pods(
    client: kube::Client,
    cluster: String,
    pods: Arc<RwLock<PodIndex>>,
    tx: Trigger,
    sync: WatchSync,
) {
    let api: Api<Pod> = Api::all(client);
    let stream = lifeboat_runtime::watch::backoff(watcher(api, labelled()));
    run("pods", stream, sync, |change| {
        let mut index = pods.write().unwrap_or_else(|e| e.into_inner());
        let mut failed = false;
        let touched = match change {
            Change::Reset(objs) => index.reset(objs),
            Change::Apply(pod) => {
                failed = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed");
                index.apply(pod)
            }
            Change::Delete(pod) => index.delete(&pod),
        };
        drop(index);
        if failed {
            // A failed pod whose summary changed: a failover's first stage.
            for key in &touched {
                tracing::debug!(target: stages::TARGET, stage = stages::POD_FAILED_SEEN,
                    cluster = %cluster, namespace = %key.namespace, appwrapper = %key.name);
            }
        }
        trigger(&tx, touched);
    })
    .await;
}

/// Watches nodes; when a node's health changes, the AppWrappers with pods on it are reconciled.
pub async fn watch_nodes(
    client: kube::Client,
    nodes: Arc<RwLock<NodeHealthIndex>>,
    pods: Arc<RwLock<PodIndex>>,
    tx: Trigger,
    sync: WatchSync,
) {
    let api: Api<Node> = Api::all(client);
    let stream = lifeboat_runtime::watch::backoff(watcher(api, watcher::Config::default()));
    run("nodes", stream, sync, |change| {
        let mut index = nodes.write().unwrap_or_else(|e| e.into_inner());
        let affected: Vec<String> = match change {
            Change::Reset(objs) => {
                let before: Vec<String> = index.unhealthy_nodes().map(|(n, _)| n.clone()).collect();
                index.reset(objs.iter());
                before
                    .into_iter()
                    .chain(index.unhealthy_nodes().map(|(n, _)| n.clone()))
                    .collect()
            }
            Change::Apply(node) => {
                if index.apply(&node) {
                    node.metadata.name.into_iter().collect()
                } else {
                    vec![]
                }
            }
            Change::Delete(node) => {
                let name = node.metadata.name.unwrap_or_default();
                index.delete(&name);
                vec![name]
            }
        };
        drop(index);
        if affected.is_empty() {
            return;
        }
        let pods = pods.read().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<AwKey> = affected
            .iter()
            .flat_map(|n| pods.appwrappers_on_node(n))
            .collect();
        drop(pods);
        trigger(&tx, keys);
    })
    .await;
}

/// Why a kind cannot be watched (not installed, discovery failed).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{api_version} {kind}: {reason}")]
pub struct KindError {
    pub api_version: String,
    pub kind: String,
    pub reason: String,
    /// The kind does not exist on the API server (a fatal create error).
    pub not_found: bool,
}

struct KindWatch {
    resource: ApiResource,
    index: Arc<RwLock<ComponentIndex>>,
    task: AbortHandle,
}

/// Watches of wrapped kinds, started the first time an AppWrapper uses a kind; stopped when
/// this is dropped.
pub struct ComponentWatches {
    client: kube::Client,
    tx: Trigger,
    readiness: Readiness,
    kinds: Mutex<HashMap<(String, String), Arc<KindWatch>>>,
    /// Kinds discovery did not find, and when; retried after a minute (a CRD may be installed).
    missing: Mutex<HashMap<(String, String), Instant>>,
}

impl ComponentWatches {
    pub fn new(client: kube::Client, tx: Trigger, readiness: Readiness) -> Self {
        Self {
            client,
            tx,
            readiness,
            kinds: Mutex::new(HashMap::new()),
            missing: Mutex::new(HashMap::new()),
        }
    }

    /// The API resource and index of a kind, starting its watch if needed.
    pub async fn kind(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, Arc<RwLock<ComponentIndex>>), KindError> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(w) = self
            .kinds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok((w.resource.clone(), w.index.clone()));
        }
        let err = |reason: String, not_found: bool| KindError {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            reason,
            not_found,
        };
        if let Some(when) = self
            .missing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            && when.elapsed() < Duration::from_secs(60)
        {
            return Err(err("no such kind on the API server".into(), true));
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let resource = match kube::discovery::pinned_kind(&self.client, &gvk).await {
            Ok((resource, _)) => resource,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                self.missing
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, Instant::now());
                return Err(err("no such kind on the API server".into(), true));
            }
            Err(kube::Error::Discovery(e)) => {
                self.missing
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, Instant::now());
                return Err(err(e.to_string(), true));
            }
            Err(e) => return Err(err(e.to_string(), false)),
        };
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        let watch = kinds
            .entry(key)
            .or_insert_with(|| {
                let index = Arc::new(RwLock::new(ComponentIndex::new(api_version, kind)));
                let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
                let stream = lifeboat_runtime::watch::backoff(watcher(api, labelled()));
                let (index2, tx) = (index.clone(), self.tx.clone());
                let name = format!("{api_version} {kind}");
                let sync = self.readiness.expect(name.clone());
                let task = tokio::spawn(async move {
                    tracing::info!(kind = %name, "watching wrapped kind");
                    run("components", stream, sync, |change| {
                        let mut index = index2.write().unwrap_or_else(|e| e.into_inner());
                        let touched = match change {
                            Change::Reset(objs) => index.reset(objs),
                            Change::Apply(obj) => index.apply(obj),
                            Change::Delete(obj) => index.delete(&obj),
                        };
                        drop(index);
                        trigger(&tx, touched);
                    })
                    .await;
                });
                Arc::new(KindWatch {
                    resource: resource.clone(),
                    index,
                    task: task.abort_handle(),
                })
            })
            .clone();
        Ok((watch.resource.clone(), watch.index.clone()))
    }
}

impl Drop for ComponentWatches {
    fn drop(&mut self) {
        for watch in self
            .kinds
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            watch.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feeder_buffers_a_relist_until_done() {
        let mut f: Feeder<u32> = Feeder::default();
        assert!(f.feed(watcher::Event::Init).is_none());
        assert!(f.feed(watcher::Event::InitApply(1)).is_none());
        assert!(f.feed(watcher::Event::InitApply(2)).is_none());
        match f.feed(watcher::Event::InitDone) {
            Some(Change::Reset(v)) => assert_eq!(v, vec![1, 2]),
            _ => panic!("expected a reset"),
        }
        assert!(matches!(
            f.feed(watcher::Event::Apply(3)),
            Some(Change::Apply(3))
        ));
        assert!(matches!(
            f.feed(watcher::Event::Delete(3)),
            Some(Change::Delete(3))
        ));
        // An empty relist resets to nothing.
        f.feed(watcher::Event::Init);
        assert!(matches!(f.feed(watcher::Event::InitDone), Some(Change::Reset(v)) if v.is_empty()));
    }
}
