//! What the failover scenario suites share: one in-process hub and one hub-mode agent per member
//! for the whole suite (the suite's tests run at once, each in its own namespace with its own
//! PropagationPolicy), AppWrappers created on the hub, and reads of their bindings and copies.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject, PostParams};
use lifeboat_agent::agent::SpawnedAgent;
use lifeboat_agent::uplink::HubOptions;
use lifeboat_api::appwrapper::AppWrapper;
use lifeboat_api::binding::{AggregatedStatusItem, ResourceBinding, ResourceHealth};
use lifeboat_e2e::harness::{TestContext, TestError};
use lifeboat_e2e::{nodes, wait};
use serde_json::{Value, json};

use super::T;
use super::hub::{appwrapper_resource, bootstrap, start_hub_with, tempfile_dir};

/// The hub and the agents of a suite.
pub struct FleetHub {
    pub url: String,
    pub dir: PathBuf,
    /// Keeps the agents running.
    pub agents: tokio::sync::Mutex<BTreeMap<String, SpawnedAgent>>,
    /// Each member's agent options, to start it again.
    pub options: BTreeMap<String, HubOptions>,
}

impl FleetHub {
    /// Stops `member`'s agent (gracefully, waiting for it) and starts it again with the same
    /// options, as a restarted agent process would be.
    pub async fn restart_agent(&self, ctx: &TestContext, member: &str) -> Result<(), TestError> {
        let mut agents = self.agents.lock().await;
        if let Some(old) = agents.remove(member) {
            old.stop().await?;
        }
        let options = self
            .options
            .get(member)
            .cloned()
            .ok_or_else(|| format!("no agent options for {member}"))?;
        let spawned = super::spawn_agent(&ctx.fleet, member, 4, Some(options)).await?;
        agents.insert(member.to_string(), spawned.0);
        Ok(())
    }
}

/// Starts the hub (options changed by `hub`) and one agent per member in hub mode (options
/// changed by `agent`), and waits until every member's Cluster is Ready.
pub async fn start_fleet_hub(
    ctx: &TestContext,
    hub: impl FnOnce(&mut lifeboat_hub::process::HubOptions),
    agent: impl Fn(&mut HubOptions),
) -> Result<FleetHub, TestError> {
    let dir = tempfile_dir(&ctx.namespace)?;
    let client = ctx.client("hub").await?;
    lifeboat_agent::install::ensure_crd(&client).await?;
    let url = start_hub_with(ctx, hub).await?;
    bootstrap(&client, &dir).await?;
    let members = ctx.fleet.member_names();
    let mut agents = BTreeMap::new();
    let mut all_options = BTreeMap::new();
    for (i, member) in members.iter().enumerate() {
        let (region, _) = nodes::member_topology(i + 1);
        let mut options =
            super::hub_mode(vec![url.clone()], &dir, &region, &format!("{member}-agent"));
        agent(&mut options);
        let spawned = super::spawn_agent(&ctx.fleet, member, 4, Some(options.clone())).await?;
        agents.insert(member.clone(), spawned.0);
        all_options.insert(member.clone(), options);
    }
    super::hub::until_clusters_ready(&client, members.iter()).await?;
    Ok(FleetHub {
        url,
        dir,
        agents: tokio::sync::Mutex::new(agents),
        options: all_options,
    })
}

/// One scenario's view: its namespace on the hub and in every member, its policy, its
/// templates and bindings.
pub struct Scenario {
    pub ctx: Arc<TestContext>,
    pub hub: kube::Client,
    pub ns: String,
    pub members: Vec<String>,
    pub templates: Api<DynamicObject>,
    pub bindings: Api<ResourceBinding>,
}

impl Scenario {
    /// Creates the test's namespace on the hub and in every member and applies a
    /// PropagationPolicy for every AppWrapper of the namespace with `failover`.
    pub async fn new(ctx: Arc<TestContext>, failover: Value) -> Result<Scenario, TestError> {
        let hub = ctx.client("hub").await?;
        let ns = ctx.namespace("hub").await?;
        let members = ctx.fleet.member_names();
        for member in &members {
            ctx.namespace(member).await?;
        }
        lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
            &hub,
            &ns,
            "scenario",
            json!({
                "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper"}],
                "failover": failover,
            }),
        )
        .await?;
        Ok(Scenario {
            templates: Api::namespaced_with(hub.clone(), &ns, &appwrapper_resource()),
            bindings: Api::namespaced(hub.clone(), &ns),
            ctx,
            hub,
            ns,
            members,
        })
    }

    /// Creates the AppWrapper template on the hub.
    pub async fn create(&self, aw: &AppWrapper) -> Result<(), TestError> {
        let mut value = serde_json::to_value(aw)?;
        value["metadata"]["namespace"] = json!(self.ns);
        self.templates
            .create(&PostParams::default(), &serde_json::from_value(value)?)
            .await?;
        Ok(())
    }

    /// The binding of template `name`.
    pub async fn binding(&self, name: &str) -> Result<ResourceBinding, String> {
        lifeboat_e2e::fleet::lifeboat::binding_of(&self.bindings, name).await
    }

    /// Waits until template `name` is placed on exactly one cluster; returns it.
    pub async fn placed(&self, name: &str) -> Result<String, TestError> {
        Ok(lifeboat_e2e::fleet::lifeboat::until_placed_on_one(&self.bindings, name, T).await?)
    }

    /// Waits until `check` holds for the binding of `name`; returns the binding.
    pub async fn until_binding(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&ResourceBinding) -> Result<(), String>,
    ) -> Result<ResourceBinding, TestError> {
        Ok(wait::until(what, timeout, || async {
            let b = self.binding(name).await?;
            check(&b).map(|()| b)
        })
        .await?)
    }

    /// Waits until the hub's status item of `name` in `cluster` has `health` (and `reason`
    /// starts with `reason_prefix`, when given); returns the binding.
    pub async fn until_health(
        &self,
        name: &str,
        cluster: &str,
        health: ResourceHealth,
        reason_prefix: Option<&str>,
    ) -> Result<ResourceBinding, TestError> {
        let what = format!("{name} {health:?} in {cluster} on the hub");
        self.until_binding(name, &what, T, |b| {
            let item = b.cluster_status(cluster);
            let reason = item.and_then(|i| i.health_reason.as_deref()).unwrap_or("");
            if item.is_some_and(|i| i.health == health)
                && reason_prefix.is_none_or(|p| reason.starts_with(p))
            {
                Ok(())
            } else {
                Err(describe_item(item))
            }
        })
        .await
    }

    /// The AppWrappers of this scenario in `member`.
    pub async fn in_member(&self, member: &str) -> Result<Api<AppWrapper>, TestError> {
        Ok(Api::namespaced(self.ctx.client(member).await?, &self.ns))
    }

    /// The member other than `member` (the suites with two members).
    pub fn other(&self, member: &str) -> Result<String, TestError> {
        self.members
            .iter()
            .find(|m| *m != member)
            .cloned()
            .ok_or_else(|| "the fleet needs another member".into())
    }
}

/// The clusters a binding is placed on.
pub fn placement(b: &ResourceBinding) -> Vec<String> {
    b.spec.clusters.iter().map(|c| c.name.clone()).collect()
}

/// An item, for a wait's "last seen".
pub fn describe_item(item: Option<&AggregatedStatusItem>) -> String {
    match item {
        None => "no status item".into(),
        Some(i) => format!(
            "{:?} ({}), unhealthySince {:?}",
            i.health,
            i.health_reason.as_deref().unwrap_or(""),
            i.unhealthy_since.as_ref().map(|t| t.0.to_string())
        ),
    }
}

/// A one-pod Job of one GPU that runs until deleted, pinned by `node_selector`, with an init
/// container that sleeps `init_sleep` seconds first (kwok keeps the pod Pending meanwhile).
pub fn job(name: &str, node_selector: &[(&str, &str)], init_sleep: Option<u32>) -> Value {
    let mut j = super::job(name, "sleep infinity", 1, 1);
    let selector: serde_json::Map<String, Value> = node_selector
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    j["spec"]["template"]["spec"]["nodeSelector"] = Value::Object(selector);
    if let Some(seconds) = init_sleep {
        j["spec"]["template"]["spec"]["initContainers"] = json!([{
            "name": "warmup", "image": "busybox", "command": ["sh", "-c", format!("sleep {seconds}")]
        }]);
    }
    j
}

/// The node a Running (not deleting) pod of AppWrapper `aw` runs on in `member`.
pub async fn node_of_running_pod(
    ctx: &TestContext,
    member: &str,
    aw: &str,
) -> Result<Option<String>, TestError> {
    let pods = super::pods_of(ctx, member, aw).await?;
    Ok(pods
        .iter()
        .find(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .and_then(|p| p.spec.as_ref().and_then(|s| s.node_name.clone())))
}
