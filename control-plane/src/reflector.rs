//! The hub's reflector helper: a watch feeding a store in a spawned task, used by the agent API
//! and the cluster health monitor.

use std::sync::Arc;

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use tokio::task::JoinHandle;

/// A reflector store fed by a watch in a spawned task (aborted with the returned handle).
/// `wake`, when given, is notified after each event (for loops that react to changes).
pub fn spawn_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    wake: Option<Arc<tokio::sync::Notify>>,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        lifeboat_runtime::watch::backoff(watcher(api, config)),
    );
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    if let Some(wake) = &wake {
                        wake.notify_one();
                    }
                }
                Err(error) => tracing::warn!(%error, "watching {what}"),
            }
        }
    });
    (store, task)
}
