//! The real hub in this process, and agents in hub mode that register with it: what the
//! placement suites share.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use lifeboat_agent::agent;
use lifeboat_api::cluster::{Cluster, HUB_SYSTEM_NAMESPACE};
use lifeboat_api::credentials::{BOOTSTRAP_TOKEN_KEY, BOOTSTRAP_TOKEN_TYPE};
use lifeboat_e2e::harness::{TestContext, TestError};
use lifeboat_e2e::wait;
use lifeboat_hub::agentapi::AgentApiConfig;
use lifeboat_hub::clusters::health::ClusterHealthConfig;
use lifeboat_hub::process::{AgentApiTls, HubOptions as HubProcessOptions};

use super::T;

pub const CA_SECRET: &str = "lifeboat-hub-ca";
pub const BOOTSTRAP_SECRET: &str = "e2e-bootstrap";
pub const BOOTSTRAP_TOKEN: &str = "e2e-bootstrap-token-0123456789abcdef0123456789";

pub fn appwrapper_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "workload.codeflare.dev",
        "v1beta2",
        "AppWrapper",
    ))
}

/// Starts the hub in this process; returns the agent API's URL.
pub async fn start_hub(ctx: &TestContext) -> Result<String, TestError> {
    start_hub_with(ctx, |_| {}).await
}

/// [`start_hub`] with options changed by `configure` first.
pub async fn start_hub_with(
    ctx: &TestContext,
    configure: impl FnOnce(&mut HubProcessOptions),
) -> Result<String, TestError> {
    let api_port = lifeboat_e2e::ports::free_port()?;
    let metrics_port = lifeboat_e2e::ports::free_port()?;
    let lease = Duration::from_secs(10);
    let mut options = HubProcessOptions {
        kubeconfig: Some(ctx.fleet.kubeconfig("hub")?),
        install_crds: true,
        metrics_bind: Some(SocketAddr::from(([127, 0, 0, 1], metrics_port))),
        agent_api_bind: SocketAddr::from(([127, 0, 0, 1], api_port)),
        agent_api_tls: AgentApiTls::CaSecret {
            secret: CA_SECRET.into(),
            names: vec!["127.0.0.1".into()],
        },
        agent_api: AgentApiConfig {
            lease_duration: lease,
            heartbeat_interval: Duration::from_secs(2),
            ..AgentApiConfig::default()
        },
        cluster_health: ClusterHealthConfig {
            lease_duration: lease,
            ..ClusterHealthConfig::default()
        },
        leader_election: None,
        binder_workers: 2,
        status_writers: 2,
        scheduler: Default::default(),
        cluster_eviction_rate: lifeboat_hub::binding::binder::DEFAULT_CLUSTER_EVICTION_RATE,
        database_url: ledger_url(&ctx.namespace)?,
        recovery_timeout: lifeboat_hub::process::DEFAULT_RECOVERY_TIMEOUT,
        webhook: None,
    };
    configure(&mut options);
    tokio::spawn(async move {
        let result = lifeboat_hub::process::run(
            options,
            prometheus::Registry::new(),
            std::future::pending(),
        )
        .await;
        if let Err(error) = result {
            eprintln!("hub stopped: {error}");
        }
    });
    Ok(format!("https://127.0.0.1:{api_port}"))
}

/// The bootstrap token Secret on the hub, and the CA the hub serves from, once it made it.
pub async fn bootstrap(hub: &kube::Client, dir: &std::path::Path) -> Result<(), TestError> {
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), HUB_SYSTEM_NAMESPACE);
    let ca = lifeboat_e2e::fleet::lifeboat::hub_ca(hub, CA_SECRET, T).await?;
    std::fs::write(dir.join("hub-ca.pem"), &ca)?;
    std::fs::write(dir.join("bootstrap-token"), BOOTSTRAP_TOKEN)?;
    let token = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(BOOTSTRAP_SECRET.into()),
            ..Default::default()
        },
        type_: Some(BOOTSTRAP_TOKEN_TYPE.into()),
        data: Some(
            [(
                BOOTSTRAP_TOKEN_KEY.to_string(),
                ByteString(BOOTSTRAP_TOKEN.as_bytes().to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &token).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

pub async fn start_agent(
    ctx: &TestContext,
    member: &str,
    hub_url: &str,
    dir: &std::path::Path,
    region: &str,
) -> Result<agent::SpawnedAgent, TestError> {
    let hub = super::hub_mode(
        vec![hub_url.to_string()],
        dir,
        region,
        &format!("{member}-agent"),
    );
    Ok(super::spawn_agent(&ctx.fleet, member, 4, Some(hub))
        .await?
        .0)
}

pub fn ready(cluster: &Cluster) -> bool {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// A directory for the agents' files (CA, token), under the fleet's target directory.
pub fn tempfile_dir(name: &str) -> Result<std::path::PathBuf, TestError> {
    let dir = std::env::temp_dir().join(format!("lifeboat-e2e-{name}"));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Installs the CRD of an operator's kind (`plural.group`, one served version, any content, with
/// the status subresource the operator writes through), as its operator would; waits until it is
/// served. No operator runs on the fleet: the objects make no pods.
pub async fn install_operator_crd(
    client: &kube::Client,
    resource: &ApiResource,
) -> Result<(), TestError> {
    install_operator_crd_with(client, resource, serde_json::json!({})).await
}

/// [`install_operator_crd`] with `properties` declared in its schema (the rest stays open).
pub async fn install_operator_crd_with(
    client: &kube::Client,
    resource: &ApiResource,
    properties: serde_json::Value,
) -> Result<(), TestError> {
    let crd = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{}", resource.plural, resource.group)},
        "spec": {"group": resource.group, "scope": "Namespaced",
            "names": {"kind": resource.kind, "plural": resource.plural,
                      "singular": resource.kind.to_lowercase(),
                      "listKind": format!("{}List", resource.kind)},
            "versions": [{"name": resource.version, "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true,
                    "properties": properties}}}]}
    }))?;
    lifeboat_runtime::crd::ensure(client, &crd, "e2e", T).await?;
    Ok(())
}

pub fn policy_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "policy.lifeboat.dev",
        "v1alpha1",
        "PropagationPolicy",
    ))
}

/// Waits until every named Cluster is registered and Ready on the hub.
pub async fn until_clusters_ready(
    hub: &kube::Client,
    names: impl IntoIterator<Item = &String>,
) -> Result<(), TestError> {
    let clusters: Api<Cluster> = Api::all(hub.clone());
    for name in names {
        wait::until(&format!("Cluster {name} Ready"), T, || async {
            match clusters.get_opt(name).await {
                Ok(Some(c)) if ready(&c) => Ok(()),
                Ok(Some(_)) => Err("not Ready yet".to_string()),
                Ok(None) => Err("not registered yet".to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await?;
    }
    Ok(())
}

/// The hub's ledger of this test: a SQLite file beside the agents' files, new for each run.
pub fn ledger_url(namespace: &str) -> Result<String, TestError> {
    let path = tempfile_dir(namespace)?.join("ledger.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(format!("sqlite://{}", path.display()))
}

// Not every suite uses all of them (each test binary compiles this module on its own).
#[allow(unused_imports)]
pub use lifeboat_e2e::fleet::lifeboat::{binding_of, placement, until_placed_on_one};

/// The objects of `resource` in the test's namespace of a member.
pub async fn member_api(
    ctx: &TestContext,
    member: &str,
    resource: &ApiResource,
) -> Result<Api<DynamicObject>, TestError> {
    Ok(Api::namespaced_with(
        ctx.client(member).await?,
        &ctx.namespace,
        resource,
    ))
}

/// The setup of the two-member hub suites, once the hub runs: its CA and the bootstrap token, an
/// agent per member (the first in region us-east-1, the second in eu-west-1), both Clusters
/// Ready, and the test's namespace on the hub and both members. Returns the agents by member.
pub async fn two_agents(
    ctx: &TestContext,
    hub: &kube::Client,
    hub_url: &str,
    dir: &std::path::Path,
    [first, second]: [&String; 2],
) -> Result<BTreeMap<String, agent::SpawnedAgent>, TestError> {
    bootstrap(hub, dir).await?;
    let mut agents = BTreeMap::new();
    for (member, region) in [(first, "us-east-1"), (second, "eu-west-1")] {
        agents.insert(
            member.clone(),
            start_agent(ctx, member, hub_url, dir, region).await?,
        );
    }
    until_clusters_ready(hub, [first, second]).await?;
    for cluster in ["hub", first.as_str(), second.as_str()] {
        ctx.namespace(cluster).await?;
    }
    Ok(agents)
}

/// Pods that hold or may hold resources (not Succeeded or Failed).
pub fn live(pods: &[Pod]) -> usize {
    pods.iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .count()
}

/// Waits until the AppWrapper `name`'s live pods in `member` (not Succeeded, Failed or being
/// deleted: after a reset in place, its new ones) are on a node; returns them and their nodes.
pub async fn live_pods_on_nodes(
    ctx: &TestContext,
    member: &str,
    name: &str,
) -> Result<(Vec<Pod>, Vec<String>), TestError> {
    let pods = wait::until(&format!("{name}'s pod on a node"), T, || async {
        let mut pods: Vec<Pod> = super::pods_of(ctx, member, name)
            .await
            .map_err(|e| e.to_string())?;
        pods.retain(|p| p.metadata.deletion_timestamp.is_none());
        pods.retain(|p| live(std::slice::from_ref(p)) == 1);
        if pods
            .iter()
            .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        {
            Ok(pods)
        } else {
            Err("no pod on a node yet".to_string())
        }
    })
    .await?;
    let nodes = pods
        .iter()
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    Ok((pods, nodes))
}

/// Fails `pods` (kwok's fail annotation, exit code 1). A pod already gone counts as failed: the
/// agent may have acted on a NotReady node first and failed the AppWrapper, deleting its pods.
pub async fn fail_pods(
    client: &kube::Client,
    namespace: &str,
    pods: &[Pod],
) -> Result<(), TestError> {
    for pod in pods {
        let pod = pod.metadata.name.clone().unwrap_or_default();
        match lifeboat_e2e::faults::fail_pod(client, namespace, &pod, 1).await {
            Ok(()) => {}
            Err(e) if e.to_string().contains("NotFound") => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Fails the AppWrapper `name`'s pods in `member` on broken nodes: waits for its live pods to be
/// on a node ([`live_pods_on_nodes`]), makes those nodes NotReady, then fails the pods (an
/// Infrastructure failure; with no retries left the AppWrapper goes Failed). Returns the nodes,
/// for [`repair_nodes`].
pub async fn fail_on_broken_nodes(
    ctx: &TestContext,
    member: &str,
    namespace: &str,
    name: &str,
) -> Result<Vec<String>, TestError> {
    let client = ctx.client(member).await?;
    let (pods, nodes) = live_pods_on_nodes(ctx, member, name).await?;
    for node in &nodes {
        lifeboat_e2e::faults::set_node_ready(&client, node, false).await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    fail_pods(&client, namespace, &pods).await?;
    Ok(nodes)
}

/// Makes the nodes [`fail_on_broken_nodes`] broke Ready again, and waits until they are Ready
/// without a `node.kubernetes.io/` condition taint (until then a new pod scheduled there would
/// fail at once).
pub async fn repair_nodes(
    ctx: &TestContext,
    member: &str,
    nodes: &[String],
) -> Result<(), TestError> {
    let client = ctx.client(member).await?;
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for node in nodes {
        lifeboat_e2e::faults::set_node_ready(&client, node, true).await?;
        wait::until(&format!("node {node} Ready again"), T, || async {
            let n = api.get(node).await.map_err(|e| e.to_string())?;
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status.clone());
            let tainted: Vec<String> = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .map(|t| {
                    t.iter()
                        .filter(|t| t.key.starts_with("node.kubernetes.io/"))
                        .map(|t| t.key.clone())
                        .collect()
                })
                .unwrap_or_default();
            if ready.as_deref() == Some("True") && tainted.is_empty() {
                Ok(())
            } else {
                Err(format!("Ready {ready:?}, taints {tainted:?}"))
            }
        })
        .await?;
    }
    Ok(())
}

/// The AppWrapper `name`'s phase, `None` when it does not exist.
pub async fn phase_in(api: &Api<DynamicObject>, name: &str) -> Result<Option<String>, String> {
    Ok(api
        .get_opt(name)
        .await
        .map_err(|e| e.to_string())?
        .map(|aw| {
            aw.data["status"]["phase"]
                .as_str()
                .unwrap_or("")
                .to_string()
        }))
}
