//! Placement scenarios on the local fleet (hub + 3 members): the real hub in this process and
//! one agent per member in hub mode, shared by every scenario. The scenarios run one at a time
//! (they share the members' capacity) and each in a namespace of its own.
//!
//! The fleet's shape, set once before the agents start:
//! - member-1 (region us-east-1): its 8-GPU nodes are cordoned and three 2-GPU nodes added, so
//!   it has 6 free GPUs in sum but no node with 4;
//! - member-2 (region eu-west-1): its Cluster is tainted `dedicated=team-a:NoSchedule`;
//! - member-3 (region us-east-1): two 8-GPU nodes, untainted; it and the hub serve the operator
//!   kinds the hub places (JobSet, PyTorchJob, RayJob; `kinds::install_crds`).

#[path = "placement_scenarios/kinds.rs"]
mod kinds;
mod support;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use lifeboat_agent::agent;
use lifeboat_api::binding::{ResourceBinding, ResourceHealth};
use lifeboat_api::cluster::{Cluster, GPU_RESOURCE};
use lifeboat_api::config::ResourceInterpreterCustomization;
use lifeboat_e2e::fleet::lifeboat::apply_propagation_policy;
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::nodes::{NodeShape, kwok_node};
use lifeboat_e2e::wait;
use serde_json::{Value, json};
use support::T;
use support::hub::{
    appwrapper_resource, bootstrap, policy_resource, ready, start_agent, start_hub, tempfile_dir,
};
use tokio::sync::{Mutex, OnceCell};

const M1: &str = "member-1";
const M2: &str = "member-2";
const M3: &str = "member-3";
const EAST: &str = "us-east-1";
const WEST: &str = "eu-west-1";
/// The taint on member-2's Cluster, and the toleration of it.
const TAINT_KEY: &str = "dedicated";
const TAINT_VALUE: &str = "team-a";
/// The small nodes added to member-1.
const SMALL_NODES: usize = 3;
const SMALL_NODE_GPUS: u32 = 2;

fn main() -> ExitCode {
    harness::run(
        "placement_scenarios",
        |c| {
            c.members = 3;
            c.nodes_per_member = 2;
            c.gpus_per_node = 8;
        },
        vec![
            E2eTest::new(
                "a_gpu_appwrapper_sample_lands_where_its_gpus_fit_per_node",
                gpu_sample_lands_where_it_fits_per_node,
            ),
            E2eTest::new(
                "region_affinity_and_a_toleration_place_an_appwrapper_and_a_policy_change_moves_it",
                region_affinity_toleration_and_move,
            ),
            E2eTest::new(
                "spread_by_region_puts_one_copy_in_each_region",
                spread_by_region,
            ),
            E2eTest::new(
                "divided_deployment_replicas_follow_the_weights_the_template_and_its_deletion",
                divided_deployment,
            ),
            E2eTest::new(
                "a_label_change_on_the_template_moves_it_to_the_other_policys_cluster",
                label_change_moves,
            ),
            E2eTest::new(
                "a_template_whose_policy_is_deleted_keeps_its_placement_and_says_so",
                policy_deleted_keeps_placement,
            ),
            E2eTest::new(
                "a_customization_applied_to_the_running_hub_takes_effect_and_its_deletion_undoes_it",
                customization_without_restart,
            ),
            E2eTest::new(
                "every_kind_the_hub_places_runs_in_its_member_healthy_with_its_status_on_the_hub",
                kinds::every_kind_runs_in_its_member,
            ),
        ],
    )
}

/// What every scenario shares: the hub and the three agents (kept running for the process).
struct Setup {
    hub: kube::Client,
    _agents: Vec<agent::SpawnedAgent>,
}

static SETUP: OnceCell<Setup> = OnceCell::const_new();
/// One scenario at a time: they share the members' capacity and taints.
static TURN: Mutex<()> = Mutex::const_new(());

/// A scenario's turn: the fleet to itself, the hub's client, its namespace on the hub.
struct Turn {
    _alone: tokio::sync::MutexGuard<'static, ()>,
    hub: kube::Client,
    ns: String,
}

impl Turn {
    /// Waits for the other scenarios, sets the fleet up if none did, makes the namespace.
    async fn take(ctx: &TestContext) -> Result<Turn, TestError> {
        let alone = TURN.lock().await;
        let setup = SETUP.get_or_try_init(|| start(ctx)).await?;
        Ok(Turn {
            _alone: alone,
            hub: setup.hub.clone(),
            ns: ctx.namespace("hub").await?,
        })
    }

    /// The AppWrappers of the scenario's namespace on the hub.
    fn appwrappers(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.hub.clone(), &self.ns, &appwrapper_resource())
    }
}

async fn start(ctx: &TestContext) -> Result<Setup, TestError> {
    let members = ctx.fleet.member_names();
    if members != [M1, M2, M3] {
        return Err(
            format!("the suite needs members {M1}, {M2}, {M3}; the fleet has {members:?}").into(),
        );
    }
    // member-1: no node with 4 free GPUs, 6 in sum.
    let m1 = ctx.client(M1).await?;
    let nodes: Api<Node> = Api::all(m1);
    for i in 0..2 {
        nodes
            .patch(
                &lifeboat_e2e::nodes::node_name(M1, i),
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"unschedulable": true}})),
            )
            .await?;
    }
    for i in 0..SMALL_NODES {
        let node = kwok_node(M1, 1, 10 + i, NodeShape::gpu_node(SMALL_NODE_GPUS));
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }

    let hub = ctx.client("hub").await?;
    // The hub serves AppWrappers as templates (it runs none itself), and the operator kinds it
    // places; member-3 serves the operator kinds too (`kinds`).
    lifeboat_agent::install::ensure_crd(&hub).await?;
    kinds::install_crds(&hub, &ctx.client(M3).await?).await?;
    let hub_url = start_hub(ctx).await?;
    let dir = tempfile_dir("placement-scenarios")?;
    bootstrap(&hub, &dir).await?;
    let mut agents = Vec::new();
    for (member, region) in [(M1, EAST), (M2, WEST), (M3, EAST)] {
        agents.push(start_agent(ctx, member, &hub_url, &dir, region).await?);
    }

    let clusters: Api<Cluster> = Api::all(hub.clone());
    // member-2's taint, applied by its own field manager (the hub owns only its own taints), as
    // soon as its Cluster exists: long before the first scenario places anything.
    wait::until("Cluster member-2 registered", T, || async {
        match clusters.get_opt(M2).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err("not registered yet".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    clusters
        .patch(
            M2,
            &PatchParams::apply("e2e-placement-scenarios").force(),
            &Patch::Apply(&json!({
                "apiVersion": "cluster.lifeboat.dev/v1alpha1", "kind": "Cluster",
                "metadata": {"name": M2},
                "spec": {"taints": [{"key": TAINT_KEY, "value": TAINT_VALUE, "effect": "NoSchedule"}]}
            })),
        )
        .await?;
    for member in [M1, M2, M3] {
        wait::until(
            &format!("Cluster {member} Ready with its APIs and nodes"),
            T,
            || async {
                let c = clusters
                    .get_opt(member)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("not registered yet")?;
                if !ready(&c) {
                    return Err("not Ready yet".to_string());
                }
                let status = c.status.clone().unwrap_or_default();
                let mut apis = vec![
                    "workload.codeflare.dev/v1beta2".to_string(),
                    "apps/v1".into(),
                ];
                if member == M3 {
                    apis.extend(
                        kinds::OPERATOR_KINDS
                            .iter()
                            .map(|(group, version, _)| format!("{group}/{version}")),
                    );
                }
                for api in &apis {
                    if !status
                        .api_enablements
                        .iter()
                        .any(|a| &a.group_version == api)
                    {
                        return Err(format!("{api} not reported yet"));
                    }
                }
                let (largest, sum) = free_gpus(&c);
                let expected = if member == M1 {
                    (
                        SMALL_NODE_GPUS as i64,
                        SMALL_NODE_GPUS as i64 * SMALL_NODES as i64,
                    )
                } else {
                    (8, 16)
                };
                if (largest, sum) == expected {
                    Ok(())
                } else {
                    Err(format!(
                        "free GPUs: largest per node {largest}, sum {sum}; waiting for {expected:?}"
                    ))
                }
            },
        )
        .await?;
    }
    for (member, region) in [(M1, EAST), (M2, WEST), (M3, EAST)] {
        let c = clusters.get(member).await?;
        if c.spec.region.as_deref() != Some(region) {
            return Err(format!("{member} has region {:?}, not {region}", c.spec.region).into());
        }
        let tainted = c.spec.taints.iter().any(|t| t.key == TAINT_KEY);
        if tainted != (member == M2) {
            return Err(format!("{member} has taints {:?}", c.spec.taints).into());
        }
    }
    Ok(Setup {
        hub,
        _agents: agents,
    })
}

/// The largest free GPU count of one node group and the cluster's sum, from its inventory.
fn free_gpus(cluster: &Cluster) -> (i64, i64) {
    let groups = cluster
        .status
        .as_ref()
        .map(|s| s.node_groups.clone())
        .unwrap_or_default();
    groups.iter().fold((0, 0), |(largest, sum), g| {
        let free = g
            .free
            .get(GPU_RESOURCE)
            .and_then(|q| q.0.parse::<i64>().ok())
            .unwrap_or(0);
        (largest.max(free), sum + free * i64::from(g.count))
    })
}

fn toleration() -> Value {
    json!({"key": TAINT_KEY, "operator": "Equal", "value": TAINT_VALUE, "effect": "NoSchedule"})
}

fn selector(kind: &str, name: &str) -> Value {
    let api_version = if kind == "AppWrapper" {
        "workload.codeflare.dev/v1beta2"
    } else {
        "apps/v1"
    };
    json!([{"apiVersion": api_version, "kind": kind, "name": name}])
}

/// Waits until the binding of the template `name` satisfies `check`; returns what it returns.
async fn until_binding<R>(
    hub: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&ResourceBinding) -> Result<R, String>,
) -> Result<R, TestError> {
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), ns);
    Ok(wait::until(what, T, || async {
        let list = bindings
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let binding = list
            .items
            .iter()
            .find(|b| b.spec.resource.name == name)
            .ok_or("no binding yet")?;
        check(binding)
    })
    .await?)
}

fn placed_on(binding: &ResourceBinding) -> Vec<(String, i32)> {
    binding
        .spec
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.replicas))
        .collect()
}

/// The binding is scheduled (Scheduled=True) on exactly these clusters.
fn scheduled_on(binding: &ResourceBinding, clusters: &[&str]) -> Result<(), String> {
    let scheduled = binding
        .condition("Scheduled")
        .map(|c| c.status.clone())
        .unwrap_or_default();
    let mut names: Vec<&str> = binding
        .spec
        .clusters
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    names.sort_unstable();
    if scheduled == "True" && names == clusters {
        Ok(())
    } else {
        Err(format!("Scheduled={scheduled:?}, clusters {names:?}"))
    }
}

/// The binding is not scheduled; the reason of each rejected cluster.
fn rejections(binding: &ResourceBinding) -> Result<BTreeMap<String, (String, String)>, String> {
    let status = binding.status.clone().unwrap_or_default();
    let scheduled = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Scheduled")
        .ok_or("no Scheduled condition")?;
    if scheduled.status != "False" || scheduled.reason != "NoClusterFit" {
        return Err(format!(
            "Scheduled={} ({})",
            scheduled.status, scheduled.reason
        ));
    }
    if !binding.spec.clusters.is_empty() {
        return Err(format!("placed on {:?}", placed_on(binding)));
    }
    Ok(status
        .rejected_clusters
        .iter()
        .map(|r| (r.cluster_name.clone(), (r.plugin.clone(), r.reason.clone())))
        .collect())
}

fn in_member(client: kube::Client, ns: &str, resource: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client, ns, resource)
}

/// Waits until the object is in the member with `check` true of it.
async fn until_in_member(
    api: &Api<DynamicObject>,
    member: &str,
    name: &str,
    what: &str,
    check: impl Fn(&DynamicObject) -> Result<(), String>,
) -> TestResult {
    wait::until(&format!("{name} {what} in {member}"), T, || async {
        let obj = api
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("not applied yet")?;
        check(&obj)
    })
    .await?;
    Ok(())
}

async fn until_gone_from_member(api: &Api<DynamicObject>, member: &str, name: &str) -> TestResult {
    wait::until(&format!("{name} gone from {member}"), T, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(o)) if o.metadata.deletion_timestamp.is_some() => {
                Err("being deleted".to_string())
            }
            Ok(Some(_)) => Err("still there".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    Ok(())
}

fn phase_is(phase: &'static str) -> impl Fn(&DynamicObject) -> Result<(), String> {
    move |aw| match aw.data["status"]["phase"].as_str() {
        Some(p) if p == phase => Ok(()),
        other => Err(format!("phase {other:?}")),
    }
}

/// An AppWrapper from the shared samples, in namespace `ns` under `name`.
fn sample(file: &str, ns: &str, name: &str) -> Result<DynamicObject, TestError> {
    let path = support::appwrapper_samples_dir().join(file);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e} (set LIFEBOAT_SHARED_DIR)", path.display()))?;
    let mut aw: Value = serde_saphyr::from_str(&text)?;
    aw["metadata"]["namespace"] = json!(ns);
    aw["metadata"]["name"] = json!(name);
    Ok(serde_json::from_value(aw)?)
}

/// A small AppWrapper of the suite: one pod of a Job with `gpus` GPUs.
fn small_appwrapper(ns: &str, name: &str, gpus: i32) -> Result<DynamicObject, TestError> {
    let mut aw = serde_json::to_value(support::appwrapper(
        name,
        &[],
        vec![support::job(&format!("{name}-job"), "sleep 3600", 1, gpus)],
    )?)?;
    aw["metadata"]["namespace"] = json!(ns);
    Ok(serde_json::from_value(aw)?)
}

/// The Healthy aggregated status of the binding in exactly `cluster`.
fn healthy_in(binding: &ResourceBinding, cluster: &str) -> Result<(), String> {
    let items = binding
        .status
        .as_ref()
        .map(|s| s.aggregated_status.clone())
        .unwrap_or_default();
    match items.as_slice() {
        [item]
            if item.cluster_name == cluster
                && item.applied
                && item.health == ResourceHealth::Healthy =>
        {
            Ok(())
        }
        other => Err(format!("aggregated status {other:?}")),
    }
}

/// The GPU sample (one pod, 4 GPUs) with a policy that allows every cluster: member-1 has 6 free
/// GPUs but no node with 4, member-2 is tainted, so it runs in member-3, where its binding says
/// Healthy and the hub's AppWrapper says Running. The same sample limited to member-1 and
/// member-2 fits nowhere, and the binding says why for each.
async fn gpu_sample_lands_where_it_fits_per_node(ctx: Arc<TestContext>) -> TestResult {
    let turn = Turn::take(&ctx).await?;
    let (hub, ns) = (&turn.hub, turn.ns.clone());
    let name = "sample-gpu-job";
    apply_propagation_policy(
        hub,
        &ns,
        "gpus-anywhere",
        json!({"resourceSelectors": selector("AppWrapper", name)}),
    )
    .await?;
    let appwrappers = turn.appwrappers();
    appwrappers
        .create(
            &PostParams::default(),
            &sample("wrapped-gpu-job.yaml", &ns, name)?,
        )
        .await?;
    until_binding(hub, &ns, name, "the GPU sample bound to member-3", |b| {
        scheduled_on(b, &[M3])
    })
    .await?;
    let in_m3 = in_member(ctx.client(M3).await?, &ns, &appwrapper_resource());
    until_in_member(&in_m3, M3, name, "Running", phase_is("Running")).await?;
    for member in [M1, M2] {
        let api = in_member(ctx.client(member).await?, &ns, &appwrapper_resource());
        if api.get_opt(name).await?.is_some() {
            return Err(format!("the GPU sample reached {member} too").into());
        }
    }
    until_binding(hub, &ns, name, "the binding Healthy in member-3", |b| {
        healthy_in(b, M3)
    })
    .await?;
    wait::until("the hub's AppWrapper shows Running", T, || async {
        let aw = appwrappers.get(name).await.map_err(|e| e.to_string())?;
        phase_is("Running")(&aw)
    })
    .await?;
    // As a user sees it.
    let kubeconfig = ctx.fleet.kubeconfig("hub")?;
    let listed = tokio::task::spawn_blocking({
        let ns = ns.clone();
        move || {
            std::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["get", "aw", name, "-n", &ns, "--no-headers"])
                .output()
        }
    })
    .await??;
    let line = String::from_utf8_lossy(&listed.stdout).to_string();
    let status = line.split_whitespace().nth(1);
    if !listed.status.success() || status != Some("Running") {
        return Err(format!(
            "kubectl get aw on the hub: {line:?} {}",
            String::from_utf8_lossy(&listed.stderr)
        )
        .into());
    }

    // Only member-1 and member-2 allowed: nothing fits, a reason per cluster.
    let nowhere = "sample-gpu-job-nowhere";
    apply_propagation_policy(
        hub,
        &ns,
        "gpus-east-or-tainted",
        json!({
            "resourceSelectors": selector("AppWrapper", nowhere),
            "placement": {"clusterAffinity": {"clusterNames": [M1, M2]}}
        }),
    )
    .await?;
    appwrappers
        .create(
            &PostParams::default(),
            &sample("wrapped-gpu-job.yaml", &ns, nowhere)?,
        )
        .await?;
    let reasons = until_binding(hub, &ns, nowhere, "the binding says why per cluster", |b| {
        let r = rejections(b)?;
        if r.len() == 3 {
            Ok(r)
        } else {
            Err(format!("rejections {r:?}"))
        }
    })
    .await?;
    let (plugin, reason) = &reasons[M1];
    assert_eq!(plugin, "GangFit", "member-1: {reason}");
    assert!(
        reason.contains("fit node by node") && reason.contains("nvidia.com/gpu: 6"),
        "member-1 should be too small per node though large enough in sum: {reason}"
    );
    let (plugin, reason) = &reasons[M2];
    assert_eq!(plugin, "TaintToleration", "member-2: {reason}");
    assert!(reason.contains(TAINT_KEY), "member-2: {reason}");
    let (plugin, reason) = &reasons[M3];
    assert_eq!(plugin, "ClusterAffinity", "member-3: {reason}");
    Ok(())
}

/// An AppWrapper whose policy asks for region eu-west-1 only fits member-2, which is tainted:
/// unschedulable until the policy tolerates the taint, then it runs there. Changing the policy
/// to us-east-1 moves it: it leaves member-2 and runs in an eastern member.
async fn region_affinity_toleration_and_move(ctx: Arc<TestContext>) -> TestResult {
    let turn = Turn::take(&ctx).await?;
    let (hub, ns) = (&turn.hub, turn.ns.clone());
    let name = "regional";
    let in_west = |tolerations: Vec<Value>| {
        json!({
            "resourceSelectors": selector("AppWrapper", name),
            "placement": {
                "clusterAffinity": {"fieldSelector": {"matchExpressions": [
                    {"key": "region", "operator": "In", "values": [WEST]}]}},
                "clusterTolerations": tolerations,
            }
        })
    };
    apply_propagation_policy(hub, &ns, "regional", in_west(vec![])).await?;
    let appwrappers = turn.appwrappers();
    appwrappers
        .create(&PostParams::default(), &small_appwrapper(&ns, name, 1)?)
        .await?;
    let reasons = until_binding(
        hub,
        &ns,
        name,
        "unschedulable without the toleration",
        |b| {
            let r = rejections(b)?;
            if r.len() == 3 {
                Ok(r)
            } else {
                Err(format!("rejections {r:?}"))
            }
        },
    )
    .await?;
    assert_eq!(reasons[M1].0, "ClusterAffinity", "{reasons:?}");
    assert_eq!(reasons[M3].0, "ClusterAffinity", "{reasons:?}");
    assert_eq!(reasons[M2].0, "TaintToleration", "{reasons:?}");

    apply_propagation_policy(hub, &ns, "regional", in_west(vec![toleration()])).await?;
    until_binding(hub, &ns, name, "bound to member-2 once tolerated", |b| {
        scheduled_on(b, &[M2])
    })
    .await?;
    let in_m2 = in_member(ctx.client(M2).await?, &ns, &appwrapper_resource());
    until_in_member(&in_m2, M2, name, "Running", phase_is("Running")).await?;
    until_binding(hub, &ns, name, "Healthy in member-2", |b| healthy_in(b, M2)).await?;

    // The policy now asks for the east: the AppWrapper moves.
    apply_propagation_policy(
        hub,
        &ns,
        "regional",
        json!({
            "resourceSelectors": selector("AppWrapper", name),
            "placement": {"clusterAffinity": {"fieldSelector": {"matchExpressions": [
                {"key": "region", "operator": "In", "values": [EAST]}]}}}
        }),
    )
    .await?;
    let target = until_binding(
        hub,
        &ns,
        name,
        "moved to an eastern member",
        |b| match placed_on(b).as_slice() {
            [(c, _)] if c == M1 || c == M3 => Ok(c.clone()),
            other => Err(format!("clusters {other:?}")),
        },
    )
    .await?;
    let in_target = in_member(ctx.client(&target).await?, &ns, &appwrapper_resource());
    until_in_member(&in_target, &target, name, "Running", phase_is("Running")).await?;
    until_gone_from_member(&in_m2, M2, name).await?;
    until_binding(hub, &ns, name, "Healthy in its new member", |b| {
        healthy_in(b, &target)
    })
    .await?;
    Ok(())
}

fn deployment_resource() -> ApiResource {
    ApiResource::erase::<Deployment>(&())
}

/// A policy dividing the Deployment `name`'s replicas by static weights over single clusters
/// (tolerating member-2's taint).
fn divided_by_weight(name: &str, weights: &[(&str, i32)]) -> Value {
    let list: Vec<Value> = weights
        .iter()
        .map(|(c, w)| json!({"targetCluster": {"clusterNames": [c]}, "weight": w}))
        .collect();
    json!({
        "resourceSelectors": selector("Deployment", name),
        "placement": {
            "clusterTolerations": [toleration()],
            "replicaScheduling": {
                "replicaSchedulingType": "Divided",
                "replicaDivisionPreference": "Weighted",
                "weightPreference": {"staticWeightList": list}
            }
        }
    })
}

/// Creates a Deployment template on the hub.
async fn create_deployment(hub: &kube::Client, ns: &str, name: &str, replicas: i32) -> TestResult {
    let deployments: Api<Deployment> = Api::namespaced(hub.clone(), ns);
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(support::deployment(name, replicas))?,
        )
        .await?;
    Ok(())
}

/// `spec.replicas` of the Deployment in each member (absent: not there).
async fn member_replicas(
    ctx: &TestContext,
    ns: &str,
    name: &str,
) -> Result<BTreeMap<String, i32>, TestError> {
    let mut out = BTreeMap::new();
    for member in [M1, M2, M3] {
        let api: Api<Deployment> = Api::namespaced(ctx.client(member).await?, ns);
        if let Some(d) = api.get_opt(name).await?
            && d.metadata.deletion_timestamp.is_none()
        {
            out.insert(
                member.to_string(),
                d.spec.and_then(|s| s.replicas).unwrap_or(1),
            );
        }
    }
    Ok(out)
}

/// Waits until the members run exactly `expected` (member → spec.replicas).
async fn until_member_replicas(
    ctx: &TestContext,
    ns: &str,
    name: &str,
    expected: &[(&str, i32)],
) -> TestResult {
    let expected: BTreeMap<String, i32> =
        expected.iter().map(|(m, r)| (m.to_string(), *r)).collect();
    wait::until(
        &format!("{name} in the members as {expected:?}"),
        T,
        || async {
            let got = member_replicas(ctx, ns, name)
                .await
                .map_err(|e| e.to_string())?;
            if got == expected {
                Ok(())
            } else {
                Err(format!("members have {got:?}"))
            }
        },
    )
    .await?;
    Ok(())
}

/// A Duplicated Deployment spread over two regions (at most and at least two), with the taint
/// tolerated: member-2 (the only cluster in eu-west-1) and exactly one of the eastern members
/// run it, each with all its replicas.
async fn spread_by_region(ctx: Arc<TestContext>) -> TestResult {
    let turn = Turn::take(&ctx).await?;
    let (hub, ns) = (&turn.hub, turn.ns.clone());
    let name = "spread";
    apply_propagation_policy(
        hub,
        &ns,
        "two-regions",
        json!({
            "resourceSelectors": selector("Deployment", name),
            "placement": {
                "clusterTolerations": [toleration()],
                "spreadConstraints": [
                    {"spreadByField": "cluster", "minGroups": 2, "maxGroups": 2},
                    {"spreadByField": "region", "minGroups": 2, "maxGroups": 2}
                ],
                "replicaScheduling": {"replicaSchedulingType": "Duplicated"}
            }
        }),
    )
    .await?;
    create_deployment(hub, &ns, name, 2).await?;
    let placed = until_binding(hub, &ns, name, "placed in two regions", |b| {
        let placed = placed_on(b);
        let names: Vec<&str> = placed.iter().map(|(c, _)| c.as_str()).collect();
        let east = names.iter().filter(|c| [M1, M3].contains(c)).count();
        if placed.len() == 2 && names.contains(&M2) && east == 1 {
            Ok(placed)
        } else {
            Err(format!("clusters {placed:?}"))
        }
    })
    .await?;
    let expected: Vec<(&str, i32)> = placed.iter().map(|(c, _)| (c.as_str(), 2)).collect();
    until_member_replicas(&ctx, &ns, name, &expected).await?;
    Ok(())
}

/// A Divided Deployment of 6 replicas weighted 1:2:3 over the three members runs 1, 2 and 3
/// replicas there; scaled to 12 on the hub, 2, 4 and 6; a policy that weights only member-2 and
/// member-3 takes it off member-1 (6 and 6); scaled to 4, 2 and 2; deleting the template removes
/// it everywhere.
async fn divided_deployment(ctx: Arc<TestContext>) -> TestResult {
    let turn = Turn::take(&ctx).await?;
    let (hub, ns) = (&turn.hub, turn.ns.clone());
    let name = "divided";
    let weighted = |weights: &[(&str, i32)]| divided_by_weight(name, weights);
    apply_propagation_policy(hub, &ns, "divided", weighted(&[(M1, 1), (M2, 2), (M3, 3)])).await?;
    create_deployment(hub, &ns, name, 6).await?;
    until_binding(hub, &ns, name, "divided 1:2:3", |b| {
        let placed = placed_on(b);
        let want = [(M1, 1), (M2, 2), (M3, 3)].map(|(c, r)| (c.to_string(), r));
        if placed == want {
            Ok(())
        } else {
            Err(format!("clusters {placed:?}"))
        }
    })
    .await?;
    until_member_replicas(&ctx, &ns, name, &[(M1, 1), (M2, 2), (M3, 3)]).await?;

    // The template grows: the members' shares grow with it.
    let deployments: Api<Deployment> = Api::namespaced(hub.clone(), &ns);
    deployments
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 12}})),
        )
        .await?;
    until_member_replicas(&ctx, &ns, name, &[(M1, 2), (M2, 4), (M3, 6)]).await?;

    // The policy drops member-1: its copy goes, the others share the 12.
    apply_propagation_policy(hub, &ns, "divided", weighted(&[(M2, 1), (M3, 1)])).await?;
    until_member_replicas(&ctx, &ns, name, &[(M2, 6), (M3, 6)]).await?;
    let sum: i32 = member_replicas(&ctx, &ns, name).await?.values().sum();
    assert_eq!(sum, 12, "the members' replicas add up to the template's");

    // The template shrinks: so do the shares.
    deployments
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 4}})),
        )
        .await?;
    until_member_replicas(&ctx, &ns, name, &[(M2, 2), (M3, 2)]).await?;

    // The template is deleted: so are its copies.
    deployments.delete(name, &DeleteParams::default()).await?;
    for member in [M2, M3] {
        let api = in_member(ctx.client(member).await?, &ns, &deployment_resource());
        until_gone_from_member(&api, member, name).await?;
    }
    Ok(())
}

/// A template placed by a policy that is then deleted: the binding keeps its cluster, says
/// `PolicyBound=False` (`PolicyDeleted`), and the workload keeps running there.
async fn policy_deleted_keeps_placement(ctx: Arc<TestContext>) -> TestResult {
    let turn = Turn::take(&ctx).await?;
    let (hub, ns) = (&turn.hub, turn.ns.clone());
    let name = "orphan";
    apply_propagation_policy(
        hub,
        &ns,
        "short-lived",
        json!({
            "resourceSelectors": selector("AppWrapper", name),
            "placement": {"clusterAffinity": {"clusterNames": [M3]}}
        }),
    )
    .await?;
    let appwrappers = turn.appwrappers();
    appwrappers
        .create(&PostParams::default(), &small_appwrapper(&ns, name, 0)?)
        .await?;
    until_binding(hub, &ns, name, "bound to member-3", |b| {
        scheduled_on(b, &[M3])
    })
    .await?;
    let in_m3 = in_member(ctx.client(M3).await?, &ns, &appwrapper_resource());
    until_in_member(&in_m3, M3, name, "Running", phase_is("Running")).await?;

    let policies: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ns, &policy_resource());
    policies
        .delete("short-lived", &DeleteParams::default())
        .await?;
    until_binding(hub, &ns, name, "PolicyBound=False, PolicyDeleted", |b| {
        let bound = b.condition("PolicyBound").ok_or("no PolicyBound")?;
        if bound.status == "False" && bound.reason == "PolicyDeleted" {
            scheduled_on(b, &[M3])
        } else {
            Err(format!("PolicyBound={} ({})", bound.status, bound.reason))
        }
    })
    .await?;
    // Still there and running a while later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let aw = in_m3.get(name).await?;
    phase_is("Running")(&aw)?;
    until_binding(hub, &ns, name, "still on member-3", |b| {
        scheduled_on(b, &[M3])
    })
    .await?;
    Ok(())
}

/// Two policies select AppWrappers by label, one for member-3 and one for member-1: changing
/// the template's label on the hub hands it to the other policy, and it moves.
async fn label_change_moves(ctx: Arc<TestContext>) -> TestResult {
    let turn = Turn::take(&ctx).await?;
    let (hub, ns) = (&turn.hub, turn.ns.clone());
    let name = "relabelled";
    for (policy, team, member) in [("team-a", "a", M3), ("team-b", "b", M1)] {
        apply_propagation_policy(
            hub,
            &ns,
            policy,
            json!({
                "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2",
                    "kind": "AppWrapper", "labelSelector": {"matchLabels": {"team": team}}}],
                "placement": {"clusterAffinity": {"clusterNames": [member]}}
            }),
        )
        .await?;
    }
    let mut aw = small_appwrapper(&ns, name, 0)?;
    aw.metadata.labels = Some(BTreeMap::from([("team".to_string(), "a".to_string())]));
    let appwrappers = turn.appwrappers();
    appwrappers.create(&PostParams::default(), &aw).await?;
    until_binding(hub, &ns, name, "team a: member-3", |b| {
        scheduled_on(b, &[M3])
    })
    .await?;
    let in_m3 = in_member(ctx.client(M3).await?, &ns, &appwrapper_resource());
    until_in_member(&in_m3, M3, name, "Running", phase_is("Running")).await?;

    appwrappers
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"team": "b"}}})),
        )
        .await?;
    until_binding(hub, &ns, name, "team b: member-1, by policy team-b", |b| {
        let policy = b.spec.policy.as_ref().map(|p| p.name.as_str());
        if policy == Some("team-b") {
            scheduled_on(b, &[M1])
        } else {
            Err(format!("policy {policy:?}"))
        }
    })
    .await?;
    let in_m1 = in_member(ctx.client(M1).await?, &ns, &appwrapper_resource());
    until_in_member(&in_m1, M1, name, "Running", phase_is("Running")).await?;
    until_gone_from_member(&in_m3, M3, name).await?;
    Ok(())
}

/// The annotation the customization below counts replicas from.
const COUNTED_REPLICAS: &str = "example.com/counted-replicas";

/// A ResourceInterpreterCustomization applied to the hub while it runs: its `GetReplicas` counts
/// a Deployment's replicas from an annotation (falling back to `spec.replicas`, so no other
/// scenario's Deployment is affected). The hub is not restarted: the Divided shares in the
/// members follow the customization once it is applied, and the built-in again once it is
/// deleted.
async fn customization_without_restart(ctx: Arc<TestContext>) -> TestResult {
    let turn = Turn::take(&ctx).await?;
    let (hub, ns) = (&turn.hub, turn.ns.clone());
    let name = "counted";
    apply_propagation_policy(
        hub,
        &ns,
        "counted",
        divided_by_weight(name, &[(M2, 1), (M3, 1)]),
    )
    .await?;
    let mut template = support::deployment(name, 4);
    template["metadata"]["annotations"] = json!({COUNTED_REPLICAS: "8"});
    let deployments: Api<Deployment> = Api::namespaced(hub.clone(), &ns);
    deployments
        .create(&PostParams::default(), &serde_json::from_value(template)?)
        .await?;
    // The built-in counts spec.replicas.
    until_member_replicas(&ctx, &ns, name, &[(M2, 2), (M3, 2)]).await?;

    let customization_name = format!("counted-replicas-{ns}");
    let customizations: Api<ResourceInterpreterCustomization> = Api::all(hub.clone());
    let customization: ResourceInterpreterCustomization = serde_json::from_value(json!({
        "apiVersion": "config.lifeboat.dev/v1alpha1", "kind": "ResourceInterpreterCustomization",
        "metadata": {"name": customization_name},
        "spec": {
            "target": {"apiVersion": "apps/v1", "kind": "Deployment"},
            "customizations": {"replicaResource": {"luaScript": format!(r#"
local kube = require("kube")
function GetReplicas(obj)
  local replicas = obj.spec.replicas
  local annotations = obj.metadata.annotations
  if annotations ~= nil and annotations["{COUNTED_REPLICAS}"] ~= nil then
    replicas = tonumber(annotations["{COUNTED_REPLICAS}"])
  end
  return replicas, kube.accuratePodRequirements(obj.spec.template)
end
"#)}}
        }
    }))?;
    customizations
        .patch(
            &customization_name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&customization),
        )
        .await?;
    let applied = async {
        until_binding(
            hub,
            &ns,
            name,
            "the binding counts 8 replicas",
            |b| match b.spec.replicas {
                8 => Ok(()),
                other => Err(format!("replicas {other}")),
            },
        )
        .await?;
        until_member_replicas(&ctx, &ns, name, &[(M2, 4), (M3, 4)]).await
    }
    .await;
    // Deleted whatever happened above, so no later scenario runs under it.
    customizations
        .delete(&customization_name, &DeleteParams::default())
        .await?;
    applied?;
    until_member_replicas(&ctx, &ns, name, &[(M2, 2), (M3, 2)]).await?;

    deployments.delete(name, &DeleteParams::default()).await?;
    for member in [M2, M3] {
        let api = in_member(ctx.client(member).await?, &ns, &deployment_resource());
        until_gone_from_member(&api, member, name).await?;
    }
    Ok(())
}
