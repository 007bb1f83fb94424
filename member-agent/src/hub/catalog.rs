//! What the member's API server serves, from discovery: the resource of each kind a work names
//! (cached), the API enablements and Kubernetes version the heartbeat reports, and the
//! resources a sweep lists. Refreshed every minute, and at once (rate-limited) when a kind
//! is not found, since CRDs come and go.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use kube::api::{ApiResource, GroupVersionKind};
use kube::discovery::{ApiCapabilities, Discovery, Scope, verbs};
use lifeboat_api::cluster::{ApiEnablement, ApiResourceRef};

/// A kind that is not found is looked up again at most this often.
const MISS_REFRESH: Duration = Duration::from_secs(5);

/// API groups that are Lifeboat's own hub-side objects: never swept (a hub that is also a
/// member labels its bindings with the same labels).
pub const OWN_GROUPS: &[&str] = &[
    "work.lifeboat.dev",
    "policy.lifeboat.dev",
    "cluster.lifeboat.dev",
    "config.lifeboat.dev",
];

/// One discovery result.
pub struct ApiSnapshot {
    pub discovery: Discovery,
    pub kubernetes_version: Option<String>,
    pub enablements: Vec<ApiEnablement>,
    pub taken: Instant,
}

impl ApiSnapshot {
    /// The resource of a kind in a group version.
    pub fn resolve(&self, api_version: &str, kind: &str) -> Option<(ApiResource, ApiCapabilities)> {
        let (group, version) = split_api_version(api_version);
        self.discovery
            .resolve_gvk(&GroupVersionKind::gvk(group, version, kind))
    }

    /// The resource of a kind in a group, at the group's recommended version.
    pub fn resolve_group_kind(
        &self,
        group: &str,
        kind: &str,
    ) -> Option<(ApiResource, ApiCapabilities)> {
        self.discovery.get(group)?.recommended_kind(kind)
    }

    /// Every resource a work could have created, once per group and kind (recommended version):
    /// those that can be listed, patched and deleted, outside Lifeboat's own groups.
    pub fn sweepable(&self) -> Vec<(ApiResource, ApiCapabilities)> {
        let mut out: Vec<(ApiResource, ApiCapabilities)> = self
            .discovery
            .groups()
            .filter(|g| !OWN_GROUPS.contains(&g.name()))
            .flat_map(|g| g.recommended_resources())
            .filter(|(_, caps)| {
                [verbs::LIST, verbs::PATCH, verbs::DELETE]
                    .iter()
                    .all(|v| caps.supports_operation(v))
            })
            .collect();
        out.sort_by(|a, b| (&a.0.group, &a.0.kind).cmp(&(&b.0.group, &b.0.kind)));
        out
    }
}

/// `apps/v1` → (`apps`, `v1`); `v1` → (``, `v1`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

/// Whether a kind is namespaced.
pub fn namespaced(caps: &ApiCapabilities) -> bool {
    caps.scope == Scope::Namespaced
}

/// Every group version and its resources (no subresources), sorted, as Karmada reports them.
pub fn enablements(discovery: &Discovery) -> Vec<ApiEnablement> {
    let mut out = Vec::new();
    for group in discovery.groups_alphabetical() {
        for version in group.versions() {
            let group_version = if group.name().is_empty() {
                version.to_string()
            } else {
                format!("{}/{version}", group.name())
            };
            let mut resources: Vec<ApiResourceRef> = group
                .versioned_resources(version)
                .into_iter()
                .map(|(ar, _)| ApiResourceRef {
                    name: ar.plural,
                    kind: ar.kind,
                })
                .collect();
            resources.sort_by(|a, b| a.name.cmp(&b.name));
            out.push(ApiEnablement {
                group_version,
                resources,
            });
        }
    }
    out.sort_by(|a, b| a.group_version.cmp(&b.group_version));
    out
}

/// The cached discovery of the member.
pub struct ApiCatalog {
    client: kube::Client,
    current: RwLock<Option<Arc<ApiSnapshot>>>,
    refreshing: tokio::sync::Mutex<()>,
}

impl ApiCatalog {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            current: RwLock::new(None),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    fn cached(&self) -> Option<Arc<ApiSnapshot>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The last snapshot, discovering first if there is none yet.
    pub async fn snapshot(&self) -> Result<Arc<ApiSnapshot>, kube::Error> {
        match self.cached() {
            Some(s) => Ok(s),
            None => self.refresh_if_older(Duration::ZERO).await,
        }
    }

    /// The last snapshot, if there is one, without any call.
    pub fn peek(&self) -> Option<Arc<ApiSnapshot>> {
        self.cached()
    }

    /// Discovers again unless the last discovery is younger than `age`; concurrent callers
    /// share one discovery.
    pub async fn refresh_if_older(&self, age: Duration) -> Result<Arc<ApiSnapshot>, kube::Error> {
        let _one = self.refreshing.lock().await;
        if let Some(s) = self.cached()
            && !age.is_zero()
            && s.taken.elapsed() < age
        {
            return Ok(s);
        }
        let discovery = match Discovery::new(self.client.clone()).run_aggregated().await {
            Ok(d) => d,
            // An API server without aggregated discovery (before 1.26).
            Err(_) => Discovery::new(self.client.clone()).run().await?,
        };
        let kubernetes_version = self
            .client
            .apiserver_version()
            .await
            .ok()
            .map(|v| v.git_version);
        let snapshot = Arc::new(ApiSnapshot {
            enablements: enablements(&discovery),
            discovery,
            kubernetes_version,
            taken: Instant::now(),
        });
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(snapshot.clone());
        Ok(snapshot)
    }

    /// The resource of a kind; a miss discovers again (at most every few seconds) before it
    /// is believed.
    pub async fn resolve(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<Option<(ApiResource, ApiCapabilities)>, kube::Error> {
        let snapshot = self.snapshot().await?;
        if let Some(found) = snapshot.resolve(api_version, kind) {
            return Ok(Some(found));
        }
        let fresh = self.refresh_if_older(MISS_REFRESH).await?;
        Ok(fresh.resolve(api_version, kind))
    }

    /// Forget the cache after an apply found no such resource: the next lookup discovers.
    pub async fn invalidate(&self) {
        let _ = self.refresh_if_older(MISS_REFRESH).await;
    }
}
