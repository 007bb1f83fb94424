//! Probes of the fleet's readiness: a component's health endpoint (without credentials), a whole
//! cluster (apiserver, controllers, default service account, nodes), waited for with
//! `wait::until`.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::components::Probe;
use super::state::{ClusterRecord, Role};
use crate::error::Result;
use crate::kubeconfig;
use crate::wait;

/// Readiness of one cluster, as `fleet status` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    pub name: String,
    pub role: Role,
    pub api_url: String,
    pub kubeconfig: PathBuf,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub nodes: usize,
    pub nodes_ready: usize,
    pub ready: bool,
    /// Why the cluster is not ready (empty when ready).
    pub reason: String,
}

/// Waits until `probe` answers 2xx on `port`.
pub async fn until_ready(what: &str, probe: Probe, port: u16, timeout: Duration) -> Result<()> {
    let base = probe.base(port);
    wait::until(&format!("{what} {base}{}", probe.path), timeout, || async {
        self::probe(&base, probe.path).await.map(|_| ())
    })
    .await
}

/// GET `path` on `base` without credentials or certificate verification; Ok when 2xx.
pub async fn probe(base: &str, path: &str) -> std::result::Result<String, String> {
    let uri: http::Uri = base.parse().map_err(|e| format!("{base}: {e}"))?;
    let mut config = kube::Config::new(uri);
    config.accept_invalid_certs = true;
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client.request_text(req).await.map_err(|e| e.to_string())
}

pub async fn cluster_status(record: &ClusterRecord) -> ClusterStatus {
    let mut status = ClusterStatus {
        name: record.name.clone(),
        role: record.role,
        api_url: record.api_url.clone(),
        kubeconfig: record.kubeconfig.clone(),
        region: record.region.clone(),
        zone: record.zone.clone(),
        nodes: 0,
        nodes_ready: 0,
        ready: false,
        reason: String::new(),
    };
    let mut waiting = Vec::new();
    let client = match kubeconfig::config(&record.kubeconfig).await {
        Ok(mut config) => {
            config.connect_timeout = Some(Duration::from_secs(2));
            config.read_timeout = Some(Duration::from_secs(5));
            kube::Client::try_from(config).ok()
        }
        Err(_) => None,
    };
    let Some(client) = client else {
        status.reason = "no usable kubeconfig".into();
        return status;
    };
    let readyz = http::Request::get("/readyz").body(Vec::new());
    match readyz {
        Ok(req) => match client.request_text(req).await {
            Ok(body) if body.trim() == "ok" => {}
            Ok(body) => waiting.push(format!("kube-apiserver /readyz: {}", body.trim())),
            Err(e) => {
                status.reason = format!("kube-apiserver unreachable: {e}");
                return status;
            }
        },
        Err(e) => waiting.push(e.to_string()),
    }
    for endpoint in &record.health {
        if let Err(e) = probe(&endpoint.url, "/healthz").await {
            waiting.push(format!("{} /healthz: {e}", endpoint.component));
        }
    }
    // The service-account controller has run once the default account exists.
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    match sa.get_opt("default").await {
        Ok(Some(_)) => {}
        Ok(None) => waiting.push("default service account (kube-controller-manager)".into()),
        Err(e) => waiting.push(format!("service accounts: {e}")),
    }
    let nodes_api: Api<Node> = Api::all(client);
    match nodes_api.list(&ListParams::default()).await {
        Ok(list) => {
            status.nodes = list.items.len();
            status.nodes_ready = list.items.iter().filter(|n| node_is_ready(n)).count();
            if status.nodes_ready < record.nodes.len() {
                waiting.push(format!(
                    "nodes ready {}/{}",
                    status.nodes_ready,
                    record.nodes.len()
                ));
            }
        }
        Err(e) => waiting.push(format!("nodes: {e}")),
    }
    status.ready = waiting.is_empty();
    status.reason = waiting.join("; ");
    status
}

/// True when the node's Ready condition is True.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
