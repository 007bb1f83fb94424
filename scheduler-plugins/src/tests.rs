//! Whole decisions through `Scheduler::schedule`: selection, division, Steady behaviour and
//! the reasons given when nothing fits.

use lifeboat_api::binding::{ClusterRejection, TargetCluster};
use lifeboat_api::policy::CapacityType;
use serde_json::json;

use crate::plugins::testing::{cluster, deployment, now, request};
use crate::snapshot::ClusterSnapshot;
use crate::{Scheduler, SchedulerConfig, SchedulingRequest, Snapshot};

fn snapshot(clusters: impl Into<Vec<ClusterSnapshot>>) -> Snapshot {
    Snapshot::new(clusters.into())
}

fn targets(pairs: &[(&str, i32)]) -> Vec<TargetCluster> {
    pairs
        .iter()
        .map(|(name, replicas)| TargetCluster {
            name: name.to_string(),
            replicas: *replicas,
        })
        .collect()
}

fn gpu_cluster(
    name: &str,
    spec: serde_json::Value,
    nodes: i32,
    gpus_per_node: i32,
) -> ClusterSnapshot {
    cluster(
        name,
        spec,
        json!({"nodeGroups": [{"count": nodes, "free": {
            "cpu": "96", "memory": "1Ti", "nvidia.com/gpu": gpus_per_node.to_string()}}]}),
    )
}

fn cpu_cluster(name: &str, nodes: i32, cpus_per_node: i32) -> ClusterSnapshot {
    cluster(
        name,
        json!({}),
        json!({"nodeGroups": [{"count": nodes, "free": {"cpu": cpus_per_node.to_string()}}]}),
    )
}

fn appwrapper(extra: serde_json::Value) -> SchedulingRequest {
    let mut spec = json!({
        "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
                     "namespace": "ml", "name": "train", "uid": "5d1f7a0e-2c4b-4e8a-9b6d-1f2e3a4b5c6d"},
        "replicas": 1, "gang": true,
        "components": [
            {"name": "master", "replicas": 1,
             "replicaRequirements": {"resourceRequest": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}}},
            {"name": "worker", "replicas": 3,
             "replicaRequirements": {"resourceRequest": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}}}
        ]
    });
    if let (Some(base), Some(over)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in over {
            base.insert(k.clone(), v.clone());
        }
    }
    request(spec)
}

#[test]
fn an_appwrapper_lands_where_its_gpus_fit_per_node() {
    // too-small: 16 nodes × 4 GPUs = 64 GPUs in sum, but the pods need 8 on one node.
    // tainted: big enough, but unreachable. good: 4 nodes × 8 GPUs.
    let clusters = snapshot([
        gpu_cluster("too-small", json!({}), 16, 4),
        gpu_cluster(
            "tainted",
            json!({"taints": [{"key": "cluster.lifeboat.dev/unreachable", "effect": "NoSchedule"}]}),
            8,
            8,
        ),
        gpu_cluster("good", json!({}), 4, 8),
    ]);
    let result = Scheduler::default()
        .schedule(&appwrapper(json!({})), &clusters)
        .unwrap();
    assert_eq!(result.clusters, targets(&[("good", 1)]));
    let filtered: Vec<(&str, &str)> = result
        .filtered
        .iter()
        .map(|f| (&*f.cluster, f.plugin))
        .collect();
    assert_eq!(
        filtered,
        [("tainted", "TaintToleration"), ("too-small", "GangFit")]
    );
    // The reason in words, on demand.
    let why = Scheduler::default()
        .explain(&appwrapper(json!({})), clusters.get("too-small").unwrap())
        .unwrap();
    assert_eq!(why.plugin, "GangFit");
    assert!(
        why.reason.starts_with("0 of 1 pod(s) of master"),
        "{}",
        why.reason
    );
    assert_eq!(
        Scheduler::default().explain(&appwrapper(json!({})), clusters.get("good").unwrap()),
        None
    );
}

#[test]
fn nothing_fits_gives_a_reason_per_cluster_and_a_karmada_summary() {
    let clusters = snapshot([
        gpu_cluster("a-small", json!({}), 16, 4),
        gpu_cluster("b-small", json!({}), 2, 8),
        gpu_cluster(
            "c-tainted",
            json!({"taints": [{"key": "cluster.lifeboat.dev/unreachable", "effect": "NoSchedule"}]}),
            8,
            8,
        ),
    ]);
    let err = Scheduler::default()
        .schedule(&appwrapper(json!({})), &clusters)
        .unwrap_err();
    assert_eq!(
        err.summary,
        "0/3 clusters are available: 1 cluster(s) had untolerated taint \
         {cluster.lifeboat.dev/unreachable: }, 2 cluster(s) had no nodes to fit every pod of the gang."
    );
    assert_eq!(
        err.rejections,
        vec![
            ClusterRejection {
                cluster_name: "a-small".into(),
                plugin: "GangFit".into(),
                reason: "0 of 1 pod(s) of master (nvidia.com/gpu: 8, cpu: 4, memory: 16Gi each) fit node by node; \
                         largest free on one node: nvidia.com/gpu: 4, cpu: 96, memory: 1Ti; \
                         free in the whole cluster: nvidia.com/gpu: 64, cpu: 1536, memory: 16Ti"
                    .into(),
            },
            ClusterRejection {
                cluster_name: "b-small".into(),
                plugin: "GangFit".into(),
                // The master took one of the two nodes; one worker fits on the other.
                reason: "1 of 3 pod(s) of worker (nvidia.com/gpu: 8, cpu: 4, memory: 16Gi each) fit node by node; \
                         largest free on one node: nvidia.com/gpu: 8, cpu: 96, memory: 1Ti; \
                         free in the whole cluster: nvidia.com/gpu: 16, cpu: 192, memory: 2Ti"
                    .into(),
            },
            ClusterRejection {
                cluster_name: "c-tainted".into(),
                plugin: "TaintToleration".into(),
                reason: "untolerated taint {cluster.lifeboat.dev/unreachable: } (NoSchedule)".into(),
            },
        ]
    );
    assert_eq!(err.to_string(), err.summary);
}

#[test]
fn a_running_gang_stays_where_it_is() {
    let clusters = snapshot([
        gpu_cluster("big", json!({}), 40, 8),
        gpu_cluster("home", json!({}), 4, 8),
    ]);
    // Without a placement the emptier cluster wins on AvailableCapacity.
    let fresh = appwrapper(json!({}));
    let result = Scheduler::default().schedule(&fresh, &clusters).unwrap();
    assert_eq!(result.clusters, targets(&[("big", 1)]));
    // Placed on "home": it stays, even though "big" would score higher without locality.
    let placed = appwrapper(json!({"clusters": [{"name": "home", "replicas": 1}]}));
    let no_locality =
        Scheduler::new(&SchedulerConfig::from_flags("*,-ClusterLocality", "").unwrap());
    let result = no_locality.schedule(&placed, &clusters).unwrap();
    assert_eq!(result.clusters, targets(&[("home", 1)]));
    // Evicted from "home": it moves.
    let evicted = appwrapper(json!({"clusters": [{"name": "home", "replicas": 1}],
        "gracefulEvictionTasks": [{"fromCluster": "home", "reason": "ApplicationFailure", "producer": "hub"}]}));
    let result = Scheduler::default().schedule(&evicted, &clusters).unwrap();
    assert_eq!(result.clusters, targets(&[("big", 1)]));
}

#[test]
fn ties_are_broken_by_name() {
    let clusters = snapshot([
        gpu_cluster("m3", json!({}), 4, 8),
        gpu_cluster("m1", json!({}), 4, 8),
        gpu_cluster("m2", json!({}), 4, 8),
    ]);
    let result = Scheduler::default()
        .schedule(&appwrapper(json!({})), &clusters)
        .unwrap();
    assert_eq!(result.clusters, targets(&[("m1", 1)]));
    let scores: Vec<&str> = result.scores.iter().map(|s| &*s.cluster).collect();
    assert_eq!(scores, ["m1", "m2", "m3"]);
}

#[test]
fn eviction_history_blocks_until_its_expiry() {
    let clusters = snapshot([
        gpu_cluster("m1", json!({}), 40, 8),
        gpu_cluster("m2", json!({}), 4, 8),
    ]);
    let mut r = appwrapper(
        json!({"evictionHistory": [{"clusterName": "m1", "reason": "ApplicationFailure",
        "evictedAt": "2026-11-23T09:55:00Z", "expiresAt": "2026-11-23T10:05:00Z"}]}),
    );
    let result = Scheduler::default().schedule(&r, &clusters).unwrap();
    assert_eq!(result.clusters, targets(&[("m2", 1)]));
    assert_eq!(result.filtered[0].plugin, "ClusterEviction");
    r.now = "2026-11-23T10:06:00Z".parse().unwrap();
    let result = Scheduler::default().schedule(&r, &clusters).unwrap();
    assert_eq!(result.clusters, targets(&[("m1", 1)]));
}

#[test]
fn capacity_type_preference_picks_the_spot_cluster() {
    let spot = cluster(
        "a-spot",
        json!({}),
        json!({"nodeGroups": [
        {"count": 4, "free": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}, "capacityType": "spot"}]}),
    );
    let on_demand = cluster(
        "b-od",
        json!({}),
        json!({"nodeGroups": [
        {"count": 4, "free": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}, "capacityType": "on-demand"}]}),
    );
    let clusters = snapshot([on_demand, spot]);
    let mut r = appwrapper(json!({}));
    r.capacity_preference = Some(CapacityType::OnDemand);
    assert_eq!(
        Scheduler::default()
            .schedule(&r, &clusters)
            .unwrap()
            .clusters,
        targets(&[("b-od", 1)])
    );
    r.capacity_preference = Some(CapacityType::Spot);
    assert_eq!(
        Scheduler::default()
            .schedule(&r, &clusters)
            .unwrap()
            .clusters,
        targets(&[("a-spot", 1)])
    );
    // The preference also comes from the binding's placement.
    let from_placement = appwrapper(json!({"placement": {"capacityTypePreference": "spot"}}));
    assert_eq!(from_placement.capacity_preference, Some(CapacityType::Spot));
}

#[test]
fn a_spot_node_selector_fits_only_spot_nodes() {
    // One cluster with on-demand nodes only, one with spot nodes: a pod that selects spot
    // capacity fits only the second (a spot reclamation leaves the first without room for it).
    let on_demand_only = cluster(
        "a-od",
        json!({}),
        json!({"nodeGroups": [
        {"count": 4, "free": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}, "capacityType": "on-demand"}]}),
    );
    let with_spot = cluster(
        "b-spot",
        json!({}),
        json!({"nodeGroups": [
        {"count": 1, "free": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}, "capacityType": "spot"}]}),
    );
    let clusters = snapshot([on_demand_only, with_spot]);
    let r = appwrapper(json!({"components": [{"name": "trainer", "replicas": 1,
        "replicaRequirements": {"resourceRequest": {"cpu": "4", "nvidia.com/gpu": "8"},
            "nodeClaim": {"nodeSelector": {"karpenter.sh/capacity-type": "spot"}}}}]}));
    let result = Scheduler::default().schedule(&r, &clusters).unwrap();
    assert_eq!(result.clusters, targets(&[("b-spot", 1)]));
    assert_eq!(result.filtered[0].cluster.as_ref(), "a-od");
    assert_eq!(result.filtered[0].plugin, "GangFit");
}

fn three_regions() -> Vec<ClusterSnapshot> {
    vec![
        cluster("eu-1", json!({"region": "eu"}), json!({})),
        cluster("eu-2", json!({"region": "eu"}), json!({})),
        cluster("us-1", json!({"region": "us"}), json!({})),
        cluster("ap-1", json!({"region": "ap"}), json!({})),
    ]
}

#[test]
fn duplicated_with_region_affinity_and_tolerations() {
    let mut clusters = three_regions();
    clusters.push(cluster(
        "eu-3",
        json!({"region": "eu", "taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}),
        json!({}),
    ));
    let clusters = snapshot(clusters);
    let r = deployment(json!({"replicas": 3, "placement": {
        "clusterAffinity": {"fieldSelector": {"matchExpressions": [
            {"key": "region", "operator": "In", "values": ["eu"]}]}}}}));
    let result = Scheduler::default().schedule(&r, &clusters).unwrap();
    assert_eq!(result.clusters, targets(&[("eu-1", 3), ("eu-2", 3)]));
    let tolerant = deployment(json!({"replicas": 3, "placement": {
        "clusterAffinity": {"fieldSelector": {"matchExpressions": [
            {"key": "region", "operator": "In", "values": ["eu"]}]}},
        "clusterTolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]}}));
    let result = Scheduler::default().schedule(&tolerant, &clusters).unwrap();
    assert_eq!(
        result.clusters,
        targets(&[("eu-1", 3), ("eu-2", 3), ("eu-3", 3)])
    );
}

#[test]
fn spread_by_region() {
    let r = deployment(json!({"placement": {"spreadConstraints": [
        {"spreadByField": "cluster", "maxGroups": 3, "minGroups": 3},
        {"spreadByField": "region", "maxGroups": 3, "minGroups": 3}]}}));
    let result = Scheduler::default()
        .schedule(&r, &snapshot(three_regions()))
        .unwrap();
    // One cluster in each of the three regions; eu-1 before eu-2 by name.
    assert_eq!(
        result.clusters,
        targets(&[("ap-1", 2), ("eu-1", 2), ("us-1", 2)])
    );

    let four = deployment(json!({"placement": {"spreadConstraints": [
        {"spreadByField": "cluster", "minGroups": 1},
        {"spreadByField": "region", "minGroups": 4}]}}));
    let err = Scheduler::default()
        .schedule(&four, &snapshot(three_regions()))
        .unwrap_err();
    assert_eq!(err.rejections.len(), 4);
    assert!(
        err.rejections
            .iter()
            .all(|r| r.plugin == "SpreadConstraint")
    );
    assert_eq!(
        err.summary,
        "0/4 clusters are available: 4 cluster(s) were feasible, in 3 region(s), fewer than the region spreadConstraint minGroups 4."
    );

    // Clusters without a region cannot be spread by region.
    let mut clusters = three_regions();
    clusters.push(cluster("nowhere", json!({}), json!({})));
    let result = Scheduler::default()
        .schedule(&r, &snapshot(clusters))
        .unwrap();
    assert_eq!(result.filtered[0].plugin, "SpreadConstraint");
    assert_eq!(result.clusters.len(), 3);
}

#[test]
fn divided_static_weights_over_three_clusters() {
    let clusters = snapshot(three_regions());
    let r = deployment(json!({"replicas": 12, "placement": {
        "clusterAffinity": {"clusterNames": ["eu-1", "us-1", "ap-1"]},
        "replicaScheduling": {"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted",
            "weightPreference": {"staticWeightList": [
                {"targetCluster": {"clusterNames": ["eu-1"]}, "weight": 1},
                {"targetCluster": {"clusterNames": ["us-1"]}, "weight": 2},
                {"targetCluster": {"clusterNames": ["ap-1"]}, "weight": 3}]}}}}));
    let result = Scheduler::default().schedule(&r, &clusters).unwrap();
    assert_eq!(
        result.clusters,
        targets(&[("ap-1", 6), ("eu-1", 2), ("us-1", 4)])
    );

    // No weight list: weight 1 each; 4 feasible clusters share 6 replicas.
    let even = deployment(json!({"replicas": 6, "placement": {
        "replicaScheduling": {"replicaSchedulingType": "Divided"}}}));
    let result = Scheduler::default().schedule(&even, &clusters).unwrap();
    let total: i32 = result.clusters.iter().map(|t| t.replicas).sum();
    assert_eq!(total, 6);
    assert!(
        result
            .clusters
            .iter()
            .all(|t| (1..=2).contains(&t.replicas)),
        "{:?}",
        result.clusters
    );
}

#[test]
fn divided_by_available_replicas_node_by_node() {
    // Replicas of 3 CPUs: 2 nodes of 8 CPUs hold 4 (not 5, as the 16 CPU sum would suggest);
    // 1 node of 4 CPUs holds 1; 3 nodes of 6 CPUs hold 6.
    let clusters = snapshot([
        cpu_cluster("m1", 2, 8),
        cpu_cluster("m2", 1, 4),
        cpu_cluster("m3", 3, 6),
    ]);
    let dynamic = |replicas: i32, clusters_now: serde_json::Value| {
        deployment(json!({"replicas": replicas, "clusters": clusters_now,
            "replicaRequirements": {"resourceRequest": {"cpu": "3"}},
            "placement": {"replicaScheduling": {"replicaSchedulingType": "Divided",
                "replicaDivisionPreference": "Weighted",
                "weightPreference": {"dynamicWeight": "AvailableReplicas"}}}}))
    };
    let result = Scheduler::default()
        .schedule(&dynamic(11, json!([])), &clusters)
        .unwrap();
    assert_eq!(result.clusters, targets(&[("m1", 4), ("m2", 1), ("m3", 6)]));

    let err = Scheduler::default()
        .schedule(&dynamic(12, json!([])), &clusters)
        .unwrap_err();
    assert_eq!(
        err.summary,
        "0/3 clusters are available: 3 cluster(s) could together run only 11 more of the 12 replicas to place."
    );
    assert_eq!(err.rejections[0].plugin, "ReplicaScheduling");
    assert_eq!(
        err.rejections[0].reason,
        "can run 4 more replica(s); the 3 selected cluster(s) together can run 11 of the 12 to place"
    );

    // Limited to the 2 best clusters by spread: the third is told why too.
    let spread = deployment(json!({"replicas": 11,
        "replicaRequirements": {"resourceRequest": {"cpu": "3"}},
        "placement": {"spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 2}],
            "replicaScheduling": {"replicaSchedulingType": "Divided",
                "weightPreference": {"dynamicWeight": "AvailableReplicas"}}}}));
    let err = Scheduler::default()
        .schedule(&spread, &clusters)
        .unwrap_err();
    assert_eq!(err.rejections.len(), 3);
    let plugins: Vec<&str> = err.rejections.iter().map(|r| r.plugin.as_str()).collect();
    assert_eq!(
        plugins,
        ["ReplicaScheduling", "SpreadConstraint", "ReplicaScheduling"]
    );

    // Steady scale up: 5 running on m3 keep running there; the 2 new ones go by room.
    let result = Scheduler::default()
        .schedule(
            &dynamic(7, json!([{"name": "m3", "replicas": 5}])),
            &clusters,
        )
        .unwrap();
    assert_eq!(result.clusters, targets(&[("m1", 1), ("m3", 6)]));
}

#[test]
fn aggregated_uses_the_fewest_clusters() {
    let clusters = snapshot([cpu_cluster("m1", 2, 8), cpu_cluster("m2", 10, 8)]);
    let r = deployment(json!({"replicas": 6, "placement": {"replicaScheduling": {
        "replicaSchedulingType": "Divided", "replicaDivisionPreference": "Aggregated"}}}));
    let result = Scheduler::default().schedule(&r, &clusters).unwrap();
    assert_eq!(result.clusters, targets(&[("m2", 6)]));
}

#[test]
fn a_no_execute_tainted_cluster_keeps_but_does_not_grow() {
    let clusters = snapshot([
        cluster(
            "m1",
            json!({"taints": [{"key": "cluster.lifeboat.dev/unreachable", "effect": "NoExecute"}]}),
            json!({}),
        ),
        cluster("m2", json!({}), json!({})),
    ]);
    let r = deployment(
        json!({"replicas": 8, "clusters": [{"name": "m1", "replicas": 2}, {"name": "m2", "replicas": 2}],
        "placement": {"replicaScheduling": {"replicaSchedulingType": "Divided"}}}),
    );
    let result = Scheduler::default().schedule(&r, &clusters).unwrap();
    assert_eq!(result.clusters, targets(&[("m1", 2), ("m2", 6)]));
}

#[test]
fn unreadable_and_deleted_clusters_are_turned_down_with_the_reason() {
    let bad = cluster(
        "bad",
        json!({}),
        json!({"nodeGroups": [{"count": 1, "free": {"cpu": "many"}}]}),
    );
    let err = Scheduler::default()
        .schedule(&deployment(json!({})), &snapshot([bad]))
        .unwrap_err();
    assert_eq!(err.rejections[0].plugin, "ClusterStatus");
    assert!(
        err.rejections[0]
            .reason
            .contains("status.nodeGroups[0].free[cpu]: `many`"),
        "{}",
        err.rejections[0].reason
    );
    let err = Scheduler::default()
        .schedule(&deployment(json!({})), &snapshot(Vec::new()))
        .unwrap_err();
    assert_eq!(
        err.summary,
        "0/0 clusters are available: no clusters are registered."
    );
}

#[test]
fn disabled_filters_do_not_run() {
    let clusters = snapshot([gpu_cluster("small", json!({}), 16, 4)]);
    let r = appwrapper(json!({}));
    assert!(Scheduler::default().schedule(&r, &clusters).is_err());
    let without = Scheduler::new(&SchedulerConfig::from_flags("*,-GangFit", "").unwrap());
    assert_eq!(
        without.schedule(&r, &clusters).unwrap().clusters,
        targets(&[("small", 1)])
    );
    let (filters, scores) = without.plugin_names();
    assert!(!filters.contains(&"GangFit"));
    assert_eq!(scores.len(), 3);
}

#[test]
fn score_weights_change_the_choice() {
    // "big" has more room; "spot" has spot nodes. Weights decide.
    let big = gpu_cluster("big", json!({}), 40, 8);
    let spot = cluster(
        "spot",
        json!({}),
        json!({"nodeGroups": [
        {"count": 4, "free": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}, "capacityType": "spot"}]}),
    );
    let clusters = snapshot([big, spot]);
    let mut r = appwrapper(json!({}));
    r.capacity_preference = Some(CapacityType::Spot);
    let capacity =
        Scheduler::new(&SchedulerConfig::from_flags("*", "AvailableCapacity=3").unwrap());
    assert_eq!(
        capacity.schedule(&r, &clusters).unwrap().clusters,
        targets(&[("big", 1)])
    );
    let spot_first = Scheduler::new(&SchedulerConfig::from_flags("*", "CapacityType=3").unwrap());
    assert_eq!(
        spot_first.schedule(&r, &clusters).unwrap().clusters,
        targets(&[("spot", 1)])
    );
}

#[test]
fn requests_read_from_bindings_keep_now() {
    let r = appwrapper(json!({}));
    assert_eq!(r.now, now());
    assert!(r.gang);
}

#[test]
fn the_snapshot_is_sorted_by_name_and_names_are_unique() {
    let s = snapshot([
        cpu_cluster("b", 1, 1),
        cpu_cluster("a", 1, 1),
        cpu_cluster("b", 9, 9),
    ]);
    let names: Vec<&str> = s.clusters().iter().map(|c| &*c.name).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(
        s.get("b").unwrap().node_groups[0].count,
        1,
        "the first one is kept"
    );
    assert!(s.get("c").is_none());
}

#[test]
fn every_filter_says_the_same_with_and_without_a_reason() {
    // Each in-tree filter's quick verdict (`passes`) must equal its full one (`filter`).
    let clusters = [
        gpu_cluster("gpu", json!({"region": "eu", "zone": "eu-1"}), 4, 8),
        gpu_cluster("small", json!({"region": "us"}), 8, 4),
        cluster(
            "tainted",
            json!({"taints": [{"key": "cluster.lifeboat.dev/unreachable", "effect": "NoExecute"}]}),
            json!({}),
        ),
        cluster(
            "silent",
            json!({}),
            json!({"apiEnablements": [], "nodeGroups": []}),
        ),
        cpu_cluster("cpu", 3, 16),
    ];
    let requests = [
        appwrapper(json!({})),
        appwrapper(json!({"clusters": [{"name": "tainted", "replicas": 1}],
            "gracefulEvictionTasks": [{"fromCluster": "gpu", "reason": "ApplicationFailure", "producer": "hub"}],
            "evictionHistory": [{"clusterName": "small", "reason": "ApplicationFailure",
                "evictedAt": "2026-11-23T09:00:00Z"}]})),
        deployment(json!({"placement": {
            "clusterAffinity": {"fieldSelector": {"matchExpressions": [
                {"key": "region", "operator": "NotIn", "values": ["us"]}]}},
            "spreadConstraints": [{"spreadByField": "cluster"}, {"spreadByField": "zone"}]}})),
        deployment(
            json!({"resource": {"apiVersion": "batch/v1", "kind": "Job", "name": "j"},
            "replicaRequirements": {"resourceRequest": {"cpu": "20"}},
            "placement": {"clusterTolerations": [{"operator": "Exists"}]}}),
        ),
    ];
    let scheduler = Scheduler::default();
    let mut rejected = 0;
    for request in &requests {
        for cluster in &clusters {
            for name in crate::plugins::FILTER_PLUGINS {
                let plugin = crate::plugins::filter_plugin(name).unwrap();
                let verdict =
                    crate::plugins::testing::run_filter(plugin.as_ref(), request, cluster);
                rejected += usize::from(verdict.is_err());
            }
            // `explain` finds a reason exactly when some filter turns the cluster down.
            let any = crate::plugins::FILTER_PLUGINS.iter().any(|name| {
                let plugin = crate::plugins::filter_plugin(name).unwrap();
                crate::plugins::testing::run_filter(plugin.as_ref(), request, cluster).is_err()
            });
            assert_eq!(scheduler.explain(request, cluster).is_some(), any);
        }
    }
    assert!(rejected > 10, "the grid exercises rejections ({rejected})");
}
