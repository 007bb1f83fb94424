//! The local fleet on real control planes: scheduling, kwok's pod lifecycle, garbage collection,
//! and the observable effect of every fault injection.
//!
//! Cluster use, so that tests can run in parallel: workloads on member-1, node faults on
//! member-2 (one node per test), the apiserver stop/start on member-3, the apiserver restart on
//! a taken port on the hub.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams, PropagationPolicy};
use lifeboat_e2e::faults;
use lifeboat_e2e::fleet::{ADDRESS_IN_USE, node_is_ready};
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestResult};
use lifeboat_e2e::nodes::{self, GPU_HEALTH_LABEL};
use lifeboat_e2e::wait;
use serde_json::json;

const T: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    harness::run(
        "fleet",
        |_| {},
        vec![
            E2eTest::new("gpu_job_is_scheduled_runs_and_completes", gpu_job_completes),
            E2eTest::new(
                "oversized_gpu_pod_stays_pending_unschedulable",
                oversized_pod_pending,
            ),
            E2eTest::new("deleting_a_job_removes_its_pods", job_deletion_gc),
            E2eTest::new("fail_pod_sets_failed_with_exit_code", fail_pod),
            E2eTest::new("command_exit_code_fails_the_pod", command_exit_code),
            E2eTest::new("node_not_ready_and_back", node_not_ready),
            E2eTest::new(
                "spot_reclamation_taints_then_deletes_the_node",
                spot_reclamation,
            ),
            E2eTest::new("gpu_health_fault_sets_the_node_label", gpu_health),
            E2eTest::new(
                "stopped_cluster_refuses_then_returns_with_its_objects",
                apiserver_restart,
            ),
            E2eTest::new("nodes_carry_topology_capacity_and_gpus", node_inventory),
            E2eTest::new(
                "restarted_apiserver_waits_out_a_taken_port",
                apiserver_port_taken,
            ),
        ],
    )
}

fn gpu_job(name: &str, namespace: &str, parallelism: i32, command: &str) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "train",
                    "image": "busybox",
                    "command": ["sh", "-c", command],
                    "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}
                }]
            }}
        }
    }))
    .expect("static job manifest")
}

fn pod_phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

async fn job_pods(pods: &Api<Pod>, job: &str) -> Result<Vec<Pod>, String> {
    pods.list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .map(|l| l.items)
        .map_err(|e| e.to_string())
}

async fn gpu_job_completes(ctx: Arc<TestContext>) -> TestResult {
    let cluster = ctx.first_member();
    let ns = ctx.namespace(&cluster).await?;
    let client = ctx.client(&cluster).await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    jobs.create(&PostParams::default(), &gpu_job("train", &ns, 3, "sleep 3"))
        .await?;

    // All three pods bound to kwok nodes by kube-scheduler, and Running.
    let running = wait::until("3 running GPU pods", T, || async {
        let list = job_pods(&pods, "train").await?;
        let running: Vec<_> = list.iter().filter(|p| pod_phase(p) == "Running").collect();
        if running.len() == 3 {
            Ok(list)
        } else {
            Err(format!("{} running", running.len()))
        }
    })
    .await?;
    for pod in &running {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        assert!(
            node.starts_with(&format!("{cluster}-gpu-")),
            "pod bound to {node}"
        );
    }
    // Then Succeeded once their command (sleep 3) has run, and the Job completes.
    wait::until("job complete", T, || async {
        let job = jobs.get("train").await.map_err(|e| e.to_string())?;
        let status = job.status.unwrap_or_default();
        let complete = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True");
        if complete && status.succeeded == Some(3) {
            Ok(())
        } else {
            Err(format!("succeeded={:?}", status.succeeded))
        }
    })
    .await?;
    let list = job_pods(&pods, "train").await?;
    assert_eq!(list.len(), 3);
    assert!(list.iter().all(|p| pod_phase(p) == "Succeeded"));
    Ok(())
}

async fn oversized_pod_pending(ctx: Arc<TestContext>) -> TestResult {
    let cluster = ctx.first_member();
    let ns = ctx.namespace(&cluster).await?;
    let pods: Api<Pod> = Api::namespaced(ctx.client(&cluster).await?, &ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "too-big"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "c", "image": "busybox", "command": ["sleep", "10"],
            "resources": {"limits": {"nvidia.com/gpu": "16"}}
        }]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let message = wait::until("PodScheduled=False/Unschedulable", T, || async {
        let pod = pods.get("too-big").await.map_err(|e| e.to_string())?;
        let status = pod.status.unwrap_or_default();
        status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
            .map(|c| c.message.unwrap_or_default())
            .ok_or_else(|| format!("phase {:?}", status.phase))
    })
    .await?;
    assert!(
        message.contains("nvidia.com/gpu"),
        "scheduler message: {message}"
    );
    let pod = pods.get("too-big").await?;
    assert_eq!(pod_phase(&pod), "Pending");
    assert!(pod.spec.and_then(|s| s.node_name).is_none());
    Ok(())
}

async fn job_deletion_gc(ctx: Arc<TestContext>) -> TestResult {
    let cluster = ctx.first_member();
    let ns = ctx.namespace(&cluster).await?;
    let client = ctx.client(&cluster).await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    jobs.create(
        &PostParams::default(),
        &gpu_job("long", &ns, 2, "sleep infinity"),
    )
    .await?;
    wait::until("2 running pods", T, || async {
        let n = job_pods(&pods, "long")
            .await?
            .iter()
            .filter(|p| pod_phase(p) == "Running")
            .count();
        if n == 2 {
            Ok(())
        } else {
            Err(format!("{n} running"))
        }
    })
    .await?;
    jobs.delete(
        "long",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        },
    )
    .await?;
    // The garbage collector deletes the orphaned pods; kwok finishes their deletion.
    wait::until("job pods gone", T, || async {
        let n = job_pods(&pods, "long").await?.len();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} pods left"))
        }
    })
    .await?;
    Ok(())
}

async fn running_pod(
    ctx: &TestContext,
    cluster: &str,
    name: &str,
    command: &str,
) -> Result<Api<Pod>, harness::TestError> {
    let ns = ctx.namespace(cluster).await?;
    let pods: Api<Pod> = Api::namespaced(ctx.client(cluster).await?, &ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "busybox", "command": ["sh", "-c", command]},
            {"name": "sidecar", "image": "busybox", "command": ["sh", "-c", "sleep infinity"]}
        ]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    Ok(pods)
}

async fn wait_phase(pods: &Api<Pod>, name: &str, phase: &str) -> Result<Pod, harness::TestError> {
    Ok(wait::until(&format!("pod {name} {phase}"), T, || async {
        let pod = pods.get(name).await.map_err(|e| e.to_string())?;
        if pod_phase(&pod) == phase {
            Ok(pod)
        } else {
            Err(pod_phase(&pod))
        }
    })
    .await?)
}

fn exit_code(pod: &Pod, container: &str) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container)?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

async fn fail_pod(ctx: Arc<TestContext>) -> TestResult {
    let cluster = ctx.first_member();
    let pods = running_pod(&ctx, &cluster, "victim", "sleep infinity").await?;
    wait_phase(&pods, "victim", "Running").await?;
    faults::fail_pod(&ctx.client(&cluster).await?, &ctx.namespace, "victim", 137).await?;
    let pod = wait_phase(&pods, "victim", "Failed").await?;
    assert_eq!(exit_code(&pod, "main"), Some(137));
    // It stays Failed: no stage revives it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(pod_phase(&pods.get("victim").await?), "Failed");
    Ok(())
}

async fn command_exit_code(ctx: Arc<TestContext>) -> TestResult {
    let cluster = ctx.first_member();
    let ns = ctx.namespace(&cluster).await?;
    let pods: Api<Pod> = Api::namespaced(ctx.client(&cluster).await?, &ns);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "exits-3"},
        "spec": {"restartPolicy": "Never",
            "initContainers": [{"name": "init", "image": "busybox", "command": ["sh", "-c", "sleep 1"]}],
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "sleep 2; exit 3"]}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    wait_phase(&pods, "exits-3", "Running").await?;
    let pod = wait_phase(&pods, "exits-3", "Failed").await?;
    assert_eq!(exit_code(&pod, "main"), Some(3));
    Ok(())
}

fn node_ready_status(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

async fn node_not_ready(ctx: Arc<TestContext>) -> TestResult {
    let client = ctx.client("member-2").await?;
    let nodes_api: Api<Node> = Api::all(client.clone());
    let node = nodes::node_name("member-2", 0);
    assert!(node_is_ready(&nodes_api.get(&node).await?));
    faults::set_node_ready(&client, &node, false).await?;
    wait::until("node NotReady", T, || async {
        let n = nodes_api.get(&node).await.map_err(|e| e.to_string())?;
        if node_ready_status(&n) == "False" {
            Ok(())
        } else {
            Err(node_ready_status(&n))
        }
    })
    .await?;
    // The node lifecycle controller reacts to it like to a real NotReady node.
    wait::until("not-ready taint", T, || async {
        let n = nodes_api.get(&node).await.map_err(|e| e.to_string())?;
        let tainted = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "node.kubernetes.io/not-ready");
        if tainted {
            Ok(())
        } else {
            Err("no taint yet".into())
        }
    })
    .await?;
    faults::set_node_ready(&client, &node, true).await?;
    wait::until("node Ready again", T, || async {
        let n = nodes_api.get(&node).await.map_err(|e| e.to_string())?;
        if node_is_ready(&n) {
            Ok(())
        } else {
            Err(node_ready_status(&n))
        }
    })
    .await?;
    Ok(())
}

async fn spot_reclamation(ctx: Arc<TestContext>) -> TestResult {
    let client = ctx.client("member-2").await?;
    let nodes_api: Api<Node> = Api::all(client.clone());
    let node = nodes::node_name("member-2", 1);
    let labels = nodes_api
        .get(&node)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(labels[nodes::CAPACITY_TYPE_LABEL], "spot");
    let reclaim = {
        let client = client.clone();
        let node = node.clone();
        tokio::spawn(async move {
            faults::reclaim_spot_node(&client, &node, Duration::from_secs(3)).await
        })
    };
    wait::until("reclamation taint", T, || async {
        let n = nodes_api.get(&node).await.map_err(|e| e.to_string())?;
        let taint = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .find(|t| t.key == faults::SPOT_RECLAIM_TAINT);
        match taint {
            Some(t) if t.effect == "NoSchedule" => Ok(()),
            _ => Err("not tainted".into()),
        }
    })
    .await?;
    reclaim.await??;
    wait::until("node deleted", T, || async {
        match nodes_api.get_opt(&node).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".into()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    Ok(())
}

/// The fault injector only: the label is set to each value. What the agent does with `EVICT`
/// (the workload moves off the node) is asserted by the agent's scenario
/// `autopilot_migrates_pods_off_an_evict_node` in `member-agent/tests/controller.rs`.
async fn gpu_health(ctx: Arc<TestContext>) -> TestResult {
    let client = ctx.client("member-2").await?;
    let nodes_api: Api<Node> = Api::all(client.clone());
    let node = nodes::node_name("member-2", 2);
    let label = |n: &Node| {
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(GPU_HEALTH_LABEL).cloned())
    };
    assert_eq!(
        label(&nodes_api.get(&node).await?).as_deref(),
        Some(nodes::GPU_HEALTHY)
    );
    for value in ["EVICT", "WARN", "PASS"] {
        faults::set_gpu_health(&client, &node, value).await?;
        assert_eq!(label(&nodes_api.get(&node).await?).as_deref(), Some(value));
    }
    Ok(())
}

async fn apiserver_restart(ctx: Arc<TestContext>) -> TestResult {
    let cluster = "member-3";
    let ns = ctx.namespace(cluster).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client(cluster).await?, &ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "survivor"}, "data": {"checkpoint": "step-1200"}
    }))?;
    configmaps.create(&PostParams::default(), &cm).await?;

    ctx.fleet.stop_apiserver(cluster)?;
    let err = configmaps
        .get("survivor")
        .await
        .expect_err("a stopped cluster must not answer");
    let text = format!("{err:?}");
    assert!(
        text.contains("Connect") || text.contains("refused"),
        "unexpected error: {text}"
    );

    ctx.fleet.start_apiserver(cluster).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client(cluster).await?, &ns);
    let back = configmaps.get("survivor").await?;
    assert_eq!(back.data.unwrap_or_default()["checkpoint"], "step-1200");
    Ok(())
}

async fn node_inventory(ctx: Arc<TestContext>) -> TestResult {
    // member-1 only: member-2's nodes are broken and member-3 is stopped by other tests.
    let member = ctx.first_member();
    let record = ctx.fleet.cluster(&member)?;
    let nodes_api: Api<Node> = Api::all(ctx.client(&member).await?);
    let list = nodes_api.list(&ListParams::default()).await?.items;
    assert_eq!(list.len(), 4, "{member}");
    let mut capacity_types = Vec::new();
    for node in &list {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(nodes::REGION_LABEL), record.region.as_ref());
        assert_eq!(labels.get(nodes::ZONE_LABEL), record.zone.as_ref());
        capacity_types.push(labels[nodes::CAPACITY_TYPE_LABEL].clone());
        let gpus = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(nodes::GPU_RESOURCE))
            .map(|q| q.0.clone());
        assert_eq!(gpus.as_deref(), Some("8"));
    }
    capacity_types.sort();
    capacity_types.dedup();
    assert_eq!(capacity_types, ["on-demand", "spot"]);
    let mut regions: Vec<_> = ctx
        .fleet
        .member_names()
        .iter()
        .map(|m| ctx.fleet.cluster(m).map(|c| c.region))
        .collect::<Result<_, _>>()?;
    regions.sort();
    regions.dedup();
    assert_eq!(
        regions.len(),
        ctx.fleet.member_names().len(),
        "one region per member"
    );
    Ok(())
}

/// A cluster's kube-apiserver restarts on the port its clients know. When another process holds
/// that port at the restart, the start fails on it, is tried again, and succeeds once the port
/// is free.
async fn apiserver_port_taken(ctx: Arc<TestContext>) -> TestResult {
    let cluster = "hub";
    let apiserver = ctx
        .fleet
        .cluster(cluster)?
        .processes
        .into_iter()
        .find(|p| p.component == "kube-apiserver")
        .ok_or("no kube-apiserver")?;
    let port = *apiserver.ports.first().ok_or("no port recorded")?;
    ctx.fleet.stop_apiserver(cluster)?;
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port))?;
    let log_start = apiserver.log_len();
    let fleet = ctx.fleet.clone();
    let restart = tokio::spawn(async move { fleet.start_apiserver(cluster).await });
    wait::until("a start refused on the taken port", T, || async {
        if apiserver.log_since(log_start).contains(ADDRESS_IN_USE) {
            Ok(())
        } else {
            Err("no bind failure in the log yet".to_string())
        }
    })
    .await?;
    drop(squatter);
    restart.await??;
    let restarted = ctx.fleet.cluster(cluster)?;
    let again = restarted
        .processes
        .iter()
        .find(|p| p.component == "kube-apiserver")
        .ok_or("no kube-apiserver")?;
    assert_eq!(again.ports, vec![port], "same port as before");
    assert!(again.is_running());
    let namespaces: Api<Namespace> = Api::all(ctx.client(cluster).await?);
    namespaces.get("default").await?;
    Ok(())
}
