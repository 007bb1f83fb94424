//! Watches of the workload templates users apply to the hub, one per kind the hub places
//! ([`crate::binding::detector::TEMPLATE_KINDS`]) whose API exists on the hub. A kind whose CRD is not
//! installed yet is looked for again periodically, so installing JobSet's CRD on a running hub
//! is enough.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use lifeboat_runtime::cache::Cache;
use tokio::sync::watch;

use crate::binding::detector::{TEMPLATE_KINDS, TemplateKind};

/// How often kinds missing from the hub's API are looked for again.
const DISCOVERY_RETRY: Duration = Duration::from_secs(15);

/// One template: its kind and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TemplateKey {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for TemplateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

impl TemplateKey {
    pub fn template_kind(&self) -> Option<&'static TemplateKind> {
        TEMPLATE_KINDS.iter().find(|k| k.kind == self.kind)
    }
}

struct Watched {
    resource: ApiResource,
    store: Store<DynamicObject>,
}

/// The watched kinds and their caches.
#[derive(Default)]
pub struct Templates {
    kinds: RwLock<HashMap<&'static str, Watched>>,
}

impl Templates {
    pub fn new() -> Templates {
        Templates::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<&'static str, Watched>> {
        self.kinds.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The template, if its kind is watched and it exists.
    pub fn get(&self, key: &TemplateKey) -> Option<Arc<DynamicObject>> {
        let kinds = self.read();
        let watched = kinds.get(key.kind)?;
        watched
            .store
            .get(&ObjectRef::new_with(&key.name, watched.resource.clone()).within(&key.namespace))
    }

    /// A reference to the template (for its Events), as served on the hub.
    pub fn object_ref(
        &self,
        key: &TemplateKey,
    ) -> Option<k8s_openapi::api::core::v1::ObjectReference> {
        let kinds = self.read();
        let watched = kinds.get(key.kind)?;
        let template = watched.store.get(
            &ObjectRef::new_with(&key.name, watched.resource.clone()).within(&key.namespace),
        )?;
        Some(kube::Resource::object_ref(
            template.as_ref(),
            &watched.resource,
        ))
    }

    /// Every cached template's key.
    pub fn keys(&self) -> Vec<TemplateKey> {
        let kinds = self.read();
        let mut keys: Vec<TemplateKey> = kinds
            .iter()
            .flat_map(|(kind, watched)| {
                watched.store.state().into_iter().map(move |o| TemplateKey {
                    kind,
                    namespace: o.namespace().unwrap_or_default(),
                    name: o.name_any(),
                })
            })
            .collect();
        keys.sort();
        keys
    }

    /// The API of a watched kind in a namespace.
    pub fn api(
        &self,
        client: &kube::Client,
        kind: &str,
        namespace: &str,
    ) -> Option<Api<DynamicObject>> {
        let kinds = self.read();
        let watched = kinds.get(kind)?;
        Some(Api::namespaced_with(
            client.clone(),
            namespace,
            &watched.resource,
        ))
    }

    /// Holds `objects` of `kind` as if its watch had listed them (request-level tests of the
    /// writes that read templates).
    #[cfg(test)]
    pub fn holding(kind: &'static TemplateKind, objects: Vec<DynamicObject>) -> Templates {
        let resource = ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(kind.group, kind.version, kind.kind),
            kind.plural,
        );
        let mut writer = reflector::store::Writer::new(resource.clone());
        for object in objects {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(object));
        }
        let templates = Templates::new();
        templates
            .kinds
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                kind.kind,
                Watched {
                    resource,
                    store: writer.as_reader(),
                },
            );
        templates
    }

    /// The kinds being watched.
    pub fn watched_kinds(&self) -> Vec<&'static str> {
        let mut kinds: Vec<&'static str> = self.read().keys().copied().collect();
        kinds.sort();
        kinds
    }
}

/// The key of a template object of `kind`.
pub fn key_of(kind: &'static TemplateKind, object: &DynamicObject) -> TemplateKey {
    TemplateKey {
        kind: kind.kind,
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    }
}

/// A hash of what a binder pass reads of a template: all of it but its status and the object's
/// bookkeeping (resourceVersion, managed fields). The hub writes each template's status from
/// its binding (`crate::binding::template_status`) after every failover; deciding again on that echo
/// was one binder pass per failover that could change nothing.
pub fn binder_view(object: &DynamicObject) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let meta = &object.metadata;
    (
        &meta.uid,
        &meta.generation,
        &meta.labels,
        &meta.annotations,
        &meta.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
        &meta.finalizers,
    )
        .hash(&mut hasher);
    if let Some(owners) = &meta.owner_references {
        for owner in owners {
            owner.uid.hash(&mut hasher);
        }
    }
    match object.data.as_object() {
        Some(fields) => {
            for (field, value) in fields.iter().filter(|(f, _)| f.as_str() != "status") {
                field.hash(&mut hasher);
                value.to_string().hash(&mut hasher);
            }
        }
        None => object.data.to_string().hash(&mut hasher),
    }
    hasher.finish()
}

/// Watches every available template kind until `shutdown`; calls `changed` with the key of
/// every template added, modified or deleted (and of every template at each initial list),
/// but not of one whose change a binder pass does not read ([`binder_view`]: its status).
/// `synced` counts the kinds whose initial list is complete, out of those found so far.
pub async fn run(
    client: kube::Client,
    templates: Arc<Templates>,
    changed: impl Fn(TemplateKey) + Send + Sync + Clone + 'static,
    synced: watch::Sender<KindsSynced>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut missing: Vec<&'static TemplateKind> = TEMPLATE_KINDS.iter().collect();
    let mut first_round = true;
    loop {
        let mut still_missing = Vec::new();
        for kind in missing {
            let gvk = GroupVersionKind::gvk(kind.group, kind.version, kind.kind);
            match kube::discovery::pinned_kind(&client, &gvk).await {
                Ok((resource, _caps)) => {
                    start_watch(
                        &client,
                        &templates,
                        kind,
                        resource,
                        changed.clone(),
                        synced.clone(),
                    );
                    synced.send_modify(|s| s.found += 1);
                }
                Err(e) => {
                    tracing::debug!(kind = kind.kind, error = %e, "template kind not served by the hub yet");
                    still_missing.push(kind);
                }
            }
        }
        if first_round {
            synced.send_modify(|s| s.discovered = true);
            first_round = false;
        }
        missing = still_missing;
        if missing.is_empty() {
            let _ = shutdown.wait_for(|stop| *stop).await;
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(DISCOVERY_RETRY) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// Progress of the template watches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindsSynced {
    /// The first discovery round is over.
    pub discovered: bool,
    /// Kinds being watched.
    pub found: usize,
    /// Kinds whose initial list is in the cache.
    pub listed: usize,
}

impl KindsSynced {
    /// Every kind found in the first discovery round has its initial list.
    pub fn complete(&self) -> bool {
        self.discovered && self.listed >= self.found
    }
}

fn start_watch(
    client: &kube::Client,
    templates: &Arc<Templates>,
    kind: &'static TemplateKind,
    resource: ApiResource,
    changed: impl Fn(TemplateKey) + Send + Sync + 'static,
    synced: watch::Sender<KindsSynced>,
) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let writer = reflector::store::Writer::new(resource.clone());
    let store = writer.as_reader();
    templates
        .kinds
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(kind.kind, Watched { resource, store });
    tracing::info!(kind = kind.kind, "watching templates");
    // A watch resumes within a second of its apiserver's return (`lifeboat_runtime::watch`).
    // The hub never needs who wrote which field: managed fields would double the cache.
    let cache = Cache::with_writer(api, kind.kind, writer).without_managed_fields();
    let mut listed = false;
    let mut seen: HashMap<TemplateKey, u64> = HashMap::new();
    tokio::spawn(cache.run(move |event| match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
            let key = key_of(kind, o);
            let view = binder_view(o);
            if seen.insert(key.clone(), view) != Some(view) {
                changed(key);
            }
        }
        watcher::Event::Delete(o) => {
            let key = key_of(kind, o);
            seen.remove(&key);
            changed(key);
        }
        watcher::Event::InitDone => {
            if !listed {
                listed = true;
                synced.send_modify(|s| s.listed += 1);
            }
        }
        // A re-list: every template is handed on again.
        watcher::Event::Init => seen.clear(),
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn appwrapper(status: &str, replicas: u32) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "workload.codeflare.dev/v1beta2",
            "kind": "AppWrapper",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "generation": 1,
                         "resourceVersion": status, "labels": {"team": "x"}},
            "spec": {"components": [{"template": {"spec": {"replicas": replicas}}}]},
            "status": {"phase": status}
        }))
        .unwrap()
    }

    #[test]
    fn a_status_write_leaves_the_binder_view_alone_a_spec_or_label_change_does_not() {
        let base = binder_view(&appwrapper("Running", 1));
        assert_eq!(base, binder_view(&appwrapper("Failed", 1)));
        assert_ne!(base, binder_view(&appwrapper("Running", 2)));
        let mut relabelled = appwrapper("Running", 1);
        relabelled.metadata.labels = Some([("team".to_string(), "y".to_string())].into());
        assert_ne!(base, binder_view(&relabelled));
        let mut deleting = appwrapper("Running", 1);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_ne!(base, binder_view(&deleting));
    }
}
