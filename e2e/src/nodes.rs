//! The fake GPU nodes kwok plays in each member cluster. Building them is pure, so the labels and
//! capacities are unit-tested without a cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Annotation by which kwok recognises the nodes it manages.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// Label that marks a node as one of the fleet's fake nodes.
pub const FLEET_NODE_LABEL: &str = "fleet.lifeboat.dev/node";
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Capacity type, as Karpenter labels it: `spot` or `on-demand`.
pub const CAPACITY_TYPE_LABEL: &str = "karpenter.sh/capacity-type";
/// Autopilot's GPU health label; `PASS` is healthy.
pub const GPU_HEALTH_LABEL: &str = "autopilot.ibm.com/gpuhealth";
pub const GPU_HEALTHY: &str = "PASS";
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Label read by the kwok stages: `true` makes the node NotReady.
pub const NOT_READY_LABEL: &str = "fleet.lifeboat.dev/not-ready";

/// Region names per member, in order; members beyond the list get `region-<n>`.
const REGIONS: &[&str] = &[
    "us-east-1",
    "eu-west-1",
    "ap-northeast-1",
    "us-west-2",
    "eu-central-1",
    "ap-south-1",
    "sa-east-1",
    "ca-central-1",
];

/// Region and zone of the `index`-th member (1-based); distinct for every member.
pub fn member_topology(index: usize) -> (String, String) {
    let region = REGIONS
        .get(index.wrapping_sub(1))
        .map(|r| r.to_string())
        .unwrap_or_else(|| format!("region-{index}"));
    let zone = format!("{region}a");
    (region, zone)
}

/// Node shape of the fleet.
#[derive(Debug, Clone, Copy)]
pub struct NodeShape {
    pub gpus: u32,
    pub cpus: u32,
    pub memory_gib: u32,
    pub pods: u32,
}

impl NodeShape {
    pub fn gpu_node(gpus: u32) -> Self {
        Self {
            gpus,
            cpus: 96,
            memory_gib: 1024,
            pods: 110,
        }
    }
}

/// Name of the `index`-th node (0-based) of a member.
pub fn node_name(member: &str, index: usize) -> String {
    format!("{member}-gpu-{index}")
}

/// Odd-numbered nodes are spot capacity, even-numbered ones on-demand, so every member has both.
pub fn capacity_type(index: usize) -> &'static str {
    if index % 2 == 1 { "spot" } else { "on-demand" }
}

/// The kwok node object for the `index`-th node of `member` (1-based member index).
pub fn kwok_node(member: &str, member_index: usize, index: usize, shape: NodeShape) -> Node {
    let name = node_name(member, index);
    let (region, zone) = member_topology(member_index);
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("type", "kwok"),
        (FLEET_NODE_LABEL, "true"),
        (REGION_LABEL, region.as_str()),
        (ZONE_LABEL, zone.as_str()),
        (CAPACITY_TYPE_LABEL, capacity_type(index)),
        (GPU_HEALTH_LABEL, GPU_HEALTHY),
        (GPU_PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3"),
        ("node.kubernetes.io/instance-type", "gpu-8x-h100"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut resources = BTreeMap::from([
        ("cpu".to_string(), Quantity(shape.cpus.to_string())),
        (
            "memory".to_string(),
            Quantity(format!("{}Gi", shape.memory_gib)),
        ),
        ("pods".to_string(), Quantity(shape.pods.to_string())),
        ("ephemeral-storage".to_string(), Quantity("2Ti".into())),
    ]);
    if shape.gpus > 0 {
        resources.insert(GPU_RESOURCE.to_string(), Quantity(shape.gpus.to_string()));
    }
    Node {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                KWOK_NODE_ANNOTATION.to_string(),
                "fake".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some(resources.clone()),
            capacity: Some(resources),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_get_distinct_regions_and_zones() {
        let topologies: Vec<_> = (1..=12).map(member_topology).collect();
        let mut regions: Vec<_> = topologies.iter().map(|t| t.0.clone()).collect();
        regions.sort();
        regions.dedup();
        assert_eq!(regions.len(), 12);
        assert_eq!(
            member_topology(1),
            ("us-east-1".into(), "us-east-1a".into())
        );
        assert_eq!(member_topology(10).0, "region-10");
    }

    #[test]
    fn node_carries_gpu_capacity_topology_and_health_labels() {
        let node = kwok_node("member-2", 2, 3, NodeShape::gpu_node(8));
        assert_eq!(node.metadata.name.as_deref(), Some("member-2-gpu-3"));
        let labels = node.metadata.labels.unwrap();
        assert_eq!(labels[REGION_LABEL], "eu-west-1");
        assert_eq!(labels[ZONE_LABEL], "eu-west-1a");
        assert_eq!(labels[CAPACITY_TYPE_LABEL], "spot");
        assert_eq!(labels[GPU_HEALTH_LABEL], GPU_HEALTHY);
        let status = node.status.unwrap();
        assert_eq!(
            status.allocatable.unwrap()[GPU_RESOURCE],
            Quantity("8".into())
        );
        assert_eq!(
            node.metadata.annotations.unwrap()[KWOK_NODE_ANNOTATION],
            "fake"
        );
    }

    #[test]
    fn every_member_has_spot_and_on_demand_nodes() {
        let kinds: Vec<_> = (0..4).map(capacity_type).collect();
        assert!(kinds.contains(&"spot"));
        assert!(kinds.contains(&"on-demand"));
    }

    #[test]
    fn cpu_only_nodes_have_no_gpu_resource() {
        let node = kwok_node("member-1", 1, 0, NodeShape::gpu_node(0));
        assert!(
            !node
                .status
                .unwrap()
                .capacity
                .unwrap()
                .contains_key(GPU_RESOURCE)
        );
    }
}
