//! What the member's API server serves, from discovery: the resource of each kind a work names
//! (cached), the API enablements and Kubernetes version the heartbeat reports, and the
//! resources a sweep lists. Refreshed every minute, and at once (rate-limited) when a kind
//! is not found, since CRDs come and go.
//!
//! A kube-apiserver answers before it is ready: while it starts, its discovery can lack every
//! CRD and a custom object can read as missing (kubernetes/kubernetes#104342). So discovery
//! runs only after `/readyz` says ready, and whatever concludes that an object or a kind is gone
//! checks readiness first ([`check_ready`]).

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
        check_ready(&self.client).await?;
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
        self.look_up(|s| s.resolve(api_version, kind)).await
    }

    /// The resource of a kind in a group (recommended version); a miss discovers again like
    /// [`ApiCatalog::resolve`].
    pub async fn resolve_group_kind(
        &self,
        group: &str,
        kind: &str,
    ) -> Result<Option<(ApiResource, ApiCapabilities)>, kube::Error> {
        self.look_up(|s| s.resolve_group_kind(group, kind)).await
    }

    /// `find` in the cached snapshot, then, on a miss, in a fresh one (rate-limited).
    async fn look_up(
        &self,
        find: impl Fn(&ApiSnapshot) -> Option<(ApiResource, ApiCapabilities)>,
    ) -> Result<Option<(ApiResource, ApiCapabilities)>, kube::Error> {
        if let Some(found) = find(self.snapshot().await?.as_ref()) {
            return Ok(Some(found));
        }
        Ok(find(self.refresh_if_older(MISS_REFRESH).await?.as_ref()))
    }

    /// Forget the cache after an apply found no such resource: the next lookup discovers.
    pub async fn invalidate(&self) {
        let _ = self.refresh_if_older(MISS_REFRESH).await;
    }
}

/// Whether the member's kube-apiserver says it is ready (`/readyz`): `Ok` when it does, the
/// failed checks as a 503 `Api` error when it does not. A server becomes ready once per start,
/// so a read made right after this returned `Ok` comes from a server that has finished starting
/// (a restart in between would take far longer than the two requests). Where `/readyz` is
/// closed to the agent (401/403; it is open to everyone by default, `system:public-info-viewer`)
/// or not served (404, a proxy in front of the apiserver), readiness cannot be told and is
/// assumed, as before this check existed.
pub async fn check_ready(client: &kube::Client) -> Result<(), kube::Error> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    match client.request_text(request).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if matches!(s.code, 401 | 403 | 404) => {
            tracing::debug!(
                code = s.code,
                "/readyz is closed to the agent or not served: readiness assumed"
            );
            Ok(())
        }
        Err(kube::Error::Api(s)) => Err(kube::Error::Api(
            kube::core::Status::failure(
                &format!(
                    "the member's kube-apiserver is not ready yet (/readyz {}): {}",
                    s.code,
                    failed_checks(&s.message)
                ),
                "ServiceUnavailable",
            )
            .with_code(503)
            .boxed(),
        )),
        Err(e) => Err(e),
    }
}

/// The checks a `/readyz` answer lists as failed (`[-]name failed: ...`), comma-separated, or
/// the whole answer when it lists none.
fn failed_checks(answer: &str) -> String {
    let failed: Vec<&str> = answer
        .lines()
        .filter_map(|line| line.trim().strip_prefix("[-]"))
        .map(|line| line.split_once(' ').map_or(line, |(name, _)| name))
        .collect();
    if failed.is_empty() {
        answer.trim().to_string()
    } else {
        failed.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_readyz_answer_names_only_its_failed_checks() {
        let answer = "[+]ping ok\n[+]etcd ok\n[-]poststarthook/crd-informer-synced failed: reason withheld\n\
                      [-]poststarthook/apiservice-discovery-controller failed: reason withheld\n\
                      readyz check failed";
        assert_eq!(
            failed_checks(answer),
            "poststarthook/crd-informer-synced, poststarthook/apiservice-discovery-controller"
        );
        assert_eq!(failed_checks(" not ready \n"), "not ready");
    }

    #[tokio::test]
    async fn only_a_ready_answer_or_a_readyz_the_agent_cannot_read_counts_as_ready() {
        use lifeboat_runtime::mock::{ApiServer, Method};
        let (client, mut server) = ApiServer::new();
        let checks = tokio::spawn(async move {
            let mut out = Vec::new();
            for _ in 0..4 {
                out.push(check_ready(&client).await);
            }
            out
        });
        server
            .next()
            .await
            .expect(Method::GET, "/readyz")
            .reply_text(
                500,
                "[+]ping ok\n[-]poststarthook/crd-informer-synced failed: reason withheld\nreadyz check failed\n",
            );
        server.next().await.expect(Method::GET, "/readyz").fail(
            403,
            "Forbidden",
            "forbidden: User cannot get path /readyz",
        );
        server
            .next()
            .await
            .expect(Method::GET, "/readyz")
            .reply_text(404, "404 page not found");
        server
            .next()
            .await
            .expect(Method::GET, "/readyz")
            .reply_text(200, "ok");
        let out = checks.await.expect("joined");
        match &out[0] {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 503);
                assert_eq!(
                    s.message,
                    "the member's kube-apiserver is not ready yet (/readyz 500): poststarthook/crd-informer-synced"
                );
            }
            other => panic!("not ready taken as {other:?}"),
        }
        assert!(out[1].is_ok(), "a closed /readyz: {:?}", out[1]);
        assert!(out[2].is_ok(), "/readyz not served: {:?}", out[2]);
        assert!(out[3].is_ok(), "ready: {:?}", out[3]);
    }
}
