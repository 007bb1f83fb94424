//! A watch-fed cache: a `kube::runtime` reflector store kept current by a watch, the one way
//! every Lifeboat process keeps a cache of a kind.
//!
//! [`Cache`] puts together what each cache needs:
//!
//! - the watch retries as [`crate::watch`] says (within a second; a `410 Expired` re-lists at
//!   once, and the re-list replaces the store's content when it completes);
//! - optionally without managed fields ([`Cache::without_managed_fields`]), which no Lifeboat
//!   component reads and which would double the cache;
//! - optionally a [`WatchSync`] marked synced at the end of the initial list
//!   ([`Cache::report_sync`]), so `/readyz` waits for it; a later re-list does not make the
//!   process unready (see [`crate::readiness`]);
//! - a callback that sees each event after the store took it (to queue a reconcile, wake a loop,
//!   count the kinds listed), and a warning logged per watch error
//!   (`watch`, `error`: "watch error; retrying with backoff").
//!
//! [`Cache::run`] is the watch loop as a future (for a caller's task set), [`Cache::spawn`] runs it
//! in a task of its own. [`Cache::store`] is the reader, available before the watch starts.

use std::borrow::Cow;
use std::fmt::Debug;
use std::hash::Hash;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use crate::readiness::WatchSync;

/// A cache of one kind fed by a watch (see the module).
pub struct Cache<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    api: Api<K>,
    config: watcher::Config,
    what: Cow<'static, str>,
    writer: Writer<K>,
    strip_managed_fields: bool,
    sync: Option<WatchSync>,
}

impl<K> Cache<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    /// A cache of every object `api` lists (narrow it with [`Cache::config`]); `what` names the
    /// watch in logs ("Clusters", "bootstrap token Secrets").
    pub fn new(api: Api<K>, what: impl Into<Cow<'static, str>>) -> Self {
        Self::with_writer(api, what, Writer::default())
    }
}

impl<K> Cache<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    /// A cache fed into `writer`: for kinds whose type is known at run time only
    /// (`Writer::new(api_resource)` for a `DynamicObject`).
    pub fn with_writer(api: Api<K>, what: impl Into<Cow<'static, str>>, writer: Writer<K>) -> Self {
        Self {
            api,
            config: watcher::Config::default(),
            what: what.into(),
            writer,
            strip_managed_fields: false,
            sync: None,
        }
    }

    /// Which objects to watch (label or field selectors).
    pub fn config(mut self, config: watcher::Config) -> Self {
        self.config = config;
        self
    }

    /// Objects are cached without `metadata.managedFields`.
    pub fn without_managed_fields(mut self) -> Self {
        self.strip_managed_fields = true;
        self
    }

    /// `sync` is marked synced once the initial list is in the store.
    pub fn report_sync(mut self, sync: WatchSync) -> Self {
        self.sync = Some(sync);
        self
    }

    /// The store's reader (empty until the initial list is in).
    pub fn store(&self) -> Store<K> {
        self.writer.as_reader()
    }

    /// Watches and caches until dropped; `on_event` sees each event after the store took it.
    pub async fn run(self, on_event: impl FnMut(&watcher::Event<K>) + Send) {
        let Cache {
            api,
            config,
            what,
            writer,
            strip_managed_fields,
            sync,
        } = self;
        let events = watcher(api, config);
        feed(events, &what, writer, strip_managed_fields, sync, on_event).await;
    }

    /// [`Cache::run`] in a task of its own (aborted with the returned handle).
    pub fn spawn(
        self,
        on_event: impl FnMut(&watcher::Event<K>) + Send + 'static,
    ) -> (Store<K>, JoinHandle<()>) {
        let store = self.store();
        (store, tokio::spawn(self.run(on_event)))
    }
}

/// The cache's loop over a watcher's events (a stream in tests).
async fn feed<K, S>(
    events: S,
    what: &str,
    writer: Writer<K>,
    strip_managed_fields: bool,
    sync: Option<WatchSync>,
    mut on_event: impl FnMut(&watcher::Event<K>),
) where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let events = crate::watch::backoff(events).modify(move |o| {
        if strip_managed_fields {
            o.meta_mut().managed_fields = None;
        }
    });
    let mut events = std::pin::pin!(reflector::reflector(writer, events));
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if let (watcher::Event::InitDone, Some(sync)) = (&event, &sync) {
                    sync.synced();
                }
                on_event(&event);
            }
            Err(error) => {
                tracing::warn!(watch = what, %error, "watch error; retrying with backoff")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readiness::Readiness;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use kube::core::{ObjectMeta, Status};
    use std::sync::{Arc, Mutex};
    use tokio::time::{Duration, Instant};

    fn map(name: &str, data: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("kubectl".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            data: Some([("k".to_string(), data.to_string())].into()),
            ..Default::default()
        }
    }

    fn refused() -> watcher::Error {
        watcher::Error::WatchFailed(kube::Error::Service(Box::new(std::io::Error::other(
            "connection refused",
        ))))
    }

    fn expired() -> watcher::Error {
        watcher::Error::WatchError(Box::new(
            Status::failure("too old resource version", "Expired").with_code(410),
        ))
    }

    fn names(store: &Store<ConfigMap>) -> Vec<String> {
        let mut names: Vec<String> = store
            .state()
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        names.sort();
        names
    }

    /// What the callback saw, with the store's content and the readiness at that moment.
    type Seen = Vec<(&'static str, Vec<String>, bool)>;

    fn kind(event: &watcher::Event<ConfigMap>) -> &'static str {
        match event {
            watcher::Event::Init => "init",
            watcher::Event::InitApply(_) => "init-apply",
            watcher::Event::InitDone => "init-done",
            watcher::Event::Apply(_) => "apply",
            watcher::Event::Delete(_) => "delete",
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_store_follows_the_watch_through_an_expiry_and_the_callback_sees_each_event() {
        use watcher::Event::*;
        let readiness = Readiness::new();
        let sync = readiness.expect("configmaps");
        let writer: Writer<ConfigMap> = Writer::default();
        let store = writer.as_reader();
        let events = futures::stream::iter(vec![
            Ok(Init),
            Ok(InitApply(map("a", "1"))),
            Ok(InitApply(map("b", "1"))),
            Ok(InitDone),
            Ok(Apply(map("c", "1"))),
            Err(refused()),
            Err(expired()),
            // The re-list after the 410: `a` and `c` were deleted meanwhile.
            Ok(Init),
            Ok(InitApply(map("b", "2"))),
            Ok(InitDone),
        ]);
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let start = Instant::now();
        feed(events, "configmaps", writer, true, Some(sync), {
            let (seen, store, readiness) = (seen.clone(), store.clone(), readiness.clone());
            move |event| {
                seen.lock()
                    .unwrap()
                    .push((kind(event), names(&store), readiness.is_ready()))
            }
        })
        .await;
        let seen = seen.lock().unwrap().clone();
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            seen,
            [
                ("init", s(&[]), false),
                ("init-apply", s(&[]), false),
                ("init-apply", s(&[]), false),
                // The initial list lands in the store at once, and readiness with it.
                ("init-done", s(&["a", "b"]), true),
                ("apply", s(&["a", "b", "c"]), true),
                ("init", s(&["a", "b", "c"]), true),
                ("init-apply", s(&["a", "b", "c"]), true),
                // The re-list replaces the content; readiness stays.
                ("init-done", s(&["b"]), true),
            ]
        );
        // 100 ms after the refusal, none after the 410 (`crate::watch`).
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        let b = store.state().into_iter().next().unwrap();
        assert_eq!(b.data.as_ref().unwrap()["k"], "2");
        assert_eq!(b.metadata.managed_fields, None);
    }

    #[tokio::test]
    async fn managed_fields_stay_unless_stripped_and_no_sync_is_needed() {
        use watcher::Event::*;
        let writer: Writer<ConfigMap> = Writer::default();
        let store = writer.as_reader();
        let events =
            futures::stream::iter(vec![Ok(Init), Ok(InitApply(map("a", "1"))), Ok(InitDone)]);
        let mut count = 0;
        feed(events, "configmaps", writer, false, None, |_| count += 1).await;
        assert_eq!(count, 3);
        let a = store.state().into_iter().next().unwrap();
        assert_eq!(a.metadata.managed_fields.as_ref().map(Vec::len), Some(1));
    }
}
