//! What to schedule: a `ResourceBinding` read once into integers and compiled selectors.

use k8s_openapi::jiff::Timestamp;
use lifeboat_api::binding::{ReplicaRequirements, ResourceBinding, TargetCluster};
use lifeboat_api::cluster::ResourceList;
use lifeboat_api::policy::{
    CapacityType, DynamicWeightFactor, Placement, ReplicaDivisionPreference, ReplicaSchedulingType,
    SpreadByField,
};

use crate::quantity::to_milli;
use crate::selector::{AffinityMatcher, ClusterField, NodeClaimMatcher, TolerationMatcher};
use crate::snapshot::{api_key, well_known_column};

/// A binding the scheduler cannot read; `field` is the path in the binding.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct RequestError {
    pub field: String,
    pub reason: String,
}

impl RequestError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> RequestError {
        RequestError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// The resource every pod takes one of. Clusters whose nodes report it are limited by it;
/// nodes that do not report it are not.
pub const PODS_RESOURCE: &str = "pods";

/// A resource the request asks for: a column of every request vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestResource {
    pub name: String,
    /// A node that does not report this resource has no limit on it (only `pods`).
    pub optional: bool,
    /// Its fixed column in every snapshot, for a well-known resource.
    pub well_known: Option<usize>,
}

/// What one pod needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRequest {
    /// Milli-units per request column ([`SchedulingRequest::resources`]).
    pub request: Vec<i64>,
    pub node_claim: NodeClaimMatcher,
}

/// A pod template and how many pods of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentRequest {
    pub name: String,
    pub replicas: i64,
    pub pod: PodRequest,
}

/// Minimum and maximum number of groups of a spread constraint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupLimits {
    pub min: usize,
    /// `None`: no maximum.
    pub max: Option<usize>,
}

/// The spread constraints the scheduler acts on (Karmada's: `cluster` and `region` select,
/// `zone` and `provider` only filter; `spreadByLabel` is accepted and unused, as in Karmada).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpreadRules {
    pub cluster: Option<GroupLimits>,
    pub region: Option<GroupLimits>,
    /// Fields a cluster must have to be spread by them.
    pub required_fields: Vec<ClusterField>,
}

impl SpreadRules {
    pub fn is_empty(&self) -> bool {
        self.cluster.is_none() && self.region.is_none() && self.required_fields.is_empty()
    }
}

/// How replicas are spread over the selected clusters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaMode {
    /// Every selected cluster runs all replicas (also every workload without replicas).
    Duplicated,
    /// Divided by static weights: each cluster takes the largest weight of the rules that match
    /// it; clusters no rule matches are dropped; no rules: weight 1 each.
    StaticWeights(Vec<(AffinityMatcher, i64)>),
    /// Divided by the replicas each cluster can still run (`dynamicWeight: AvailableReplicas`).
    DynamicWeights,
    /// Divided over as few clusters as possible (`replicaDivisionPreference: Aggregated`).
    Aggregated,
}

/// A cluster in an eviction task of the binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionTaskRef {
    pub cluster: String,
    pub reason: String,
    pub producer: String,
}

/// A past eviction that may still keep its cluster out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionBlock {
    pub cluster: String,
    pub reason: String,
    pub evicted_at: Timestamp,
    /// `None`: blocked for good.
    pub expires_at: Option<Timestamp>,
}

/// Everything the plugins need to know about one binding, parsed once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulingRequest {
    /// The workload template.
    pub api_version: String,
    pub kind: String,
    /// [`api_key`](crate::snapshot::api_key) of `api_version` and `kind`.
    pub api_key: u64,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.replicas`.
    pub replicas: i32,
    /// Gang workloads go whole to exactly one cluster.
    pub gang: bool,
    /// Columns of every request vector, sorted by name.
    pub resources: Vec<RequestResource>,
    /// One replica of the main template (`spec.replicaRequirements`).
    pub per_replica: PodRequest,
    /// Every pod template and its pod count: `spec.components`, or the main template ×
    /// `spec.replicas` when there are none.
    pub components: Vec<ComponentRequest>,
    pub affinity: Option<AffinityMatcher>,
    pub tolerations: Vec<TolerationMatcher>,
    pub spread: SpreadRules,
    pub replica_mode: ReplicaMode,
    /// `spec.clusters` as it is now.
    pub current: Vec<TargetCluster>,
    pub eviction_tasks: Vec<EvictionTaskRef>,
    pub eviction_history: Vec<EvictionBlock>,
    pub capacity_preference: Option<CapacityType>,
    pub now: Timestamp,
    /// `spec.rescheduleTriggeredAt` is later than `status.lastScheduledTime`: ignore the
    /// current assignment (Karmada's Fresh mode).
    pub fresh: bool,
    /// Components in first-fit-decreasing order (largest pods first).
    pub(crate) pack_order: Vec<usize>,
    /// What the whole workload needs, per column.
    pub(crate) need_total: Vec<i64>,
    /// Webster ties between equal clusters go by name ascending (else descending), chosen by
    /// the parity of FNV-32a of the UID as Karmada does.
    pub(crate) tie_ascending: bool,
}

impl SchedulingRequest {
    /// Reads a binding. `capacity_preference` is the policy's (field, else its
    /// `placement.lifeboat.dev/capacity-type` label, see `AnyPolicy::capacity_type_preference`);
    /// when `None` the binding's `placement.capacityTypePreference` is used. `now` decides which
    /// eviction history entries have expired.
    pub fn from_binding(
        binding: &ResourceBinding,
        capacity_preference: Option<CapacityType>,
        now: Timestamp,
    ) -> Result<SchedulingRequest, RequestError> {
        let spec = &binding.spec;
        if spec.replicas < 0 {
            return Err(RequestError::new(
                "spec.replicas",
                format!("{} is negative", spec.replicas),
            ));
        }

        // Parse every quantity once, then lay them out over the union of resource names.
        let main = parse_requirements(
            "spec.replicaRequirements",
            spec.replica_requirements.as_ref(),
        )?;
        let mut parsed_components = Vec::with_capacity(spec.components.len());
        for (i, component) in spec.components.iter().enumerate() {
            if component.replicas < 0 {
                return Err(RequestError::new(
                    format!("spec.components[{i}].replicas"),
                    format!("{} is negative", component.replicas),
                ));
            }
            parsed_components.push(parse_requirements(
                &format!("spec.components[{i}].replicaRequirements"),
                component.replica_requirements.as_ref(),
            )?);
        }
        let mut names: Vec<&str> = main
            .amounts
            .iter()
            .chain(parsed_components.iter().flat_map(|p| p.amounts.iter()))
            .map(|(name, _)| name.as_str())
            .chain(std::iter::once(PODS_RESOURCE))
            .collect();
        names.sort_unstable();
        names.dedup();
        let resources: Vec<RequestResource> = names
            .iter()
            .map(|n| RequestResource {
                name: n.to_string(),
                optional: *n == PODS_RESOURCE,
                well_known: well_known_column(n),
            })
            .collect();
        let per_replica = main.layout(&resources);
        let components: Vec<ComponentRequest> = if spec.components.is_empty() {
            if spec.replicas > 0 {
                vec![ComponentRequest {
                    name: spec.resource.name.clone(),
                    replicas: i64::from(spec.replicas),
                    pod: per_replica.clone(),
                }]
            } else {
                Vec::new()
            }
        } else {
            spec.components
                .iter()
                .zip(&parsed_components)
                .map(|(c, parsed)| ComponentRequest {
                    name: c.name.clone(),
                    replicas: i64::from(c.replicas),
                    pod: parsed.layout(&resources),
                })
                .collect()
        };
        let pack_order = pack_order(&resources, &components);
        let mut need_total = vec![0i64; resources.len()];
        for c in &components {
            for (total, amount) in need_total.iter_mut().zip(&c.pod.request) {
                *total = total.saturating_add(amount.saturating_mul(c.replicas));
            }
        }

        let default_placement = Placement::default();
        let placement = spec.placement.as_ref().unwrap_or(&default_placement);
        let affinity = placement
            .cluster_affinity
            .as_ref()
            .map(|a| AffinityMatcher::compile("spec.placement.clusterAffinity", a))
            .transpose()?;
        let tolerations = placement
            .cluster_tolerations
            .iter()
            .enumerate()
            .map(|(i, t)| {
                TolerationMatcher::compile(&format!("spec.placement.clusterTolerations[{i}]"), t)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let spread = spread_rules(placement)?;
        let replica_mode = if spec.replicas == 0 {
            ReplicaMode::Duplicated
        } else {
            replica_mode(placement)?
        };

        let fresh = match (
            &spec.reschedule_triggered_at,
            binding
                .status
                .as_ref()
                .and_then(|s| s.last_scheduled_time.as_ref()),
        ) {
            (Some(triggered), Some(last)) => triggered.0 > last.0,
            (Some(_), None) => true,
            (None, _) => false,
        };

        Ok(SchedulingRequest {
            api_version: spec.resource.api_version.clone(),
            kind: spec.resource.kind.clone(),
            api_key: api_key(&spec.resource.api_version, &spec.resource.kind),
            namespace: spec.resource.namespace.clone(),
            name: spec.resource.name.clone(),
            uid: spec.resource.uid.clone(),
            replicas: spec.replicas,
            gang: spec.gang,
            resources,
            per_replica,
            components,
            affinity,
            tolerations,
            spread,
            replica_mode,
            current: spec.clusters.clone(),
            eviction_tasks: spec
                .graceful_eviction_tasks
                .iter()
                .map(|t| EvictionTaskRef {
                    cluster: t.from_cluster.clone(),
                    reason: t.reason.clone(),
                    producer: t.producer.clone(),
                })
                .collect(),
            eviction_history: spec
                .eviction_history
                .iter()
                .map(|r| EvictionBlock {
                    cluster: r.cluster_name.clone(),
                    reason: r.reason.clone(),
                    evicted_at: r.evicted_at.0,
                    expires_at: r.expires_at.as_ref().map(|t| t.0),
                })
                .collect(),
            capacity_preference: capacity_preference.or(placement.capacity_type_preference),
            now,
            fresh,
            pack_order,
            need_total,
            tie_ascending: fnv32a(spec.resource.uid.as_bytes()).is_multiple_of(2),
        })
    }

    /// The replicas the binding currently has in a cluster, if it is in `spec.clusters`.
    pub fn current_replicas(&self, cluster: &str) -> Option<i32> {
        self.current
            .iter()
            .find(|t| t.name == cluster)
            .map(|t| t.replicas)
    }
}

/// Requirements of one pod template, parsed.
struct ParsedRequirements {
    amounts: Vec<(String, i64)>,
    node_claim: NodeClaimMatcher,
}

impl ParsedRequirements {
    fn layout(&self, resources: &[RequestResource]) -> PodRequest {
        let mut request = vec![0i64; resources.len()];
        let mut has_pods = false;
        for (name, amount) in &self.amounts {
            if let Ok(i) = resources.binary_search_by(|r| r.name.as_str().cmp(name)) {
                request[i] = *amount;
                has_pods |= name == PODS_RESOURCE;
            }
        }
        if !has_pods
            && let Ok(i) = resources.binary_search_by(|r| r.name.as_str().cmp(PODS_RESOURCE))
        {
            request[i] = 1000;
        }
        PodRequest {
            request,
            node_claim: self.node_claim.clone(),
        }
    }
}

fn parse_requirements(
    field: &str,
    requirements: Option<&ReplicaRequirements>,
) -> Result<ParsedRequirements, RequestError> {
    let empty = ResourceList::new();
    let list = requirements.map(|r| &r.resource_request).unwrap_or(&empty);
    let mut amounts = Vec::with_capacity(list.len());
    for (name, quantity) in list {
        let path = format!("{field}.resourceRequest[{name}]");
        let milli = to_milli(quantity).map_err(|e| RequestError::new(&path, e.to_string()))?;
        if milli < 0 {
            return Err(RequestError::new(
                path,
                format!("`{}` is negative", quantity.0),
            ));
        }
        amounts.push((name.clone(), milli));
    }
    let node_claim = match requirements.and_then(|r| r.node_claim.as_ref()) {
        Some(claim) => {
            let terms: Vec<Vec<_>> = claim
                .hard_node_affinity
                .iter()
                .flat_map(|a| a.node_selector_terms.iter())
                .map(|t| t.match_expressions.clone().unwrap_or_default())
                .collect();
            NodeClaimMatcher::compile(&format!("{field}.nodeClaim"), &claim.node_selector, &terms)?
        }
        None => NodeClaimMatcher::default(),
    };
    Ok(ParsedRequirements {
        amounts,
        node_claim,
    })
}

/// First-fit-decreasing order: accelerators and other extended resources weigh first, then
/// CPU, memory, ephemeral storage, pods.
fn pack_order(resources: &[RequestResource], components: &[ComponentRequest]) -> Vec<usize> {
    let rank = |name: &str| match name {
        "cpu" => 1,
        "memory" => 2,
        "ephemeral-storage" => 3,
        PODS_RESOURCE => 4,
        _ => 0,
    };
    let mut priority: Vec<usize> = (0..resources.len()).collect();
    priority.sort_by_key(|&i| (rank(&resources[i].name), i));
    let mut order: Vec<usize> = (0..components.len()).collect();
    order.sort_by(|&a, &b| {
        let key = |c: usize| priority.iter().map(move |&i| components[c].pod.request[i]);
        key(b).cmp(key(a)).then(a.cmp(&b))
    });
    order
}

fn spread_rules(placement: &Placement) -> Result<SpreadRules, RequestError> {
    let mut rules = SpreadRules::default();
    for (i, constraint) in placement.spread_constraints.iter().enumerate() {
        let field = format!("spec.placement.spreadConstraints[{i}]");
        let Some(by) = constraint.spread_by_field else {
            // spreadByLabel: accepted, not used for placement (as in Karmada).
            continue;
        };
        let min = constraint.min_groups.unwrap_or(1);
        if min < 0 {
            return Err(RequestError::new(
                format!("{field}.minGroups"),
                format!("{min} is negative"),
            ));
        }
        let max = match constraint.max_groups {
            Some(max) if max < 1 => {
                return Err(RequestError::new(
                    format!("{field}.maxGroups"),
                    format!("{max} selects no group; use at least 1 or leave it unset"),
                ));
            }
            Some(max) if max < min => {
                return Err(RequestError::new(
                    format!("{field}.maxGroups"),
                    format!("{max} is lower than minGroups {min}"),
                ));
            }
            other => other.map(|m| m as usize),
        };
        let limits = GroupLimits {
            min: min as usize,
            max,
        };
        match by {
            SpreadByField::Cluster => rules.cluster = Some(limits),
            SpreadByField::Region => {
                rules.region = Some(limits);
                rules.required_fields.push(ClusterField::Region);
            }
            SpreadByField::Zone => rules.required_fields.push(ClusterField::Zone),
            SpreadByField::Provider => rules.required_fields.push(ClusterField::Provider),
        }
    }
    Ok(rules)
}

fn replica_mode(placement: &Placement) -> Result<ReplicaMode, RequestError> {
    let Some(strategy) = &placement.replica_scheduling else {
        return Ok(ReplicaMode::Duplicated);
    };
    if strategy.replica_scheduling_type == ReplicaSchedulingType::Duplicated {
        return Ok(ReplicaMode::Duplicated);
    }
    if strategy.replica_division_preference == Some(ReplicaDivisionPreference::Aggregated) {
        return Ok(ReplicaMode::Aggregated);
    }
    let Some(weights) = &strategy.weight_preference else {
        return Ok(ReplicaMode::StaticWeights(Vec::new()));
    };
    if weights.dynamic_weight == Some(DynamicWeightFactor::AvailableReplicas) {
        return Ok(ReplicaMode::DynamicWeights);
    }
    let mut rules = Vec::with_capacity(weights.static_weight_list.len());
    for (i, rule) in weights.static_weight_list.iter().enumerate() {
        let field =
            format!("spec.placement.replicaScheduling.weightPreference.staticWeightList[{i}]");
        if rule.weight < 1 {
            return Err(RequestError::new(
                format!("{field}.weight"),
                format!("{} is lower than 1", rule.weight),
            ));
        }
        rules.push((
            AffinityMatcher::compile(&format!("{field}.targetCluster"), &rule.target_cluster)?,
            rule.weight,
        ));
    }
    Ok(ReplicaMode::StaticWeights(rules))
}

/// FNV-1a, 32 bits.
pub(crate) fn fnv32a(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for &b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn binding(spec: serde_json::Value) -> ResourceBinding {
        serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "b", "namespace": "ml"},
            "spec": spec
        }))
        .unwrap()
    }

    fn now() -> Timestamp {
        "2026-11-23T10:00:00Z".parse().unwrap()
    }

    #[test]
    fn reads_components_into_columns_and_pack_order() {
        let rb = binding(json!({
            "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
                         "namespace": "ml", "name": "train", "uid": "u1"},
            "replicas": 1, "gang": true,
            "components": [
                {"name": "launcher", "replicas": 1,
                 "replicaRequirements": {"resourceRequest": {"cpu": "2", "memory": "4Gi"}}},
                {"name": "worker", "replicas": 4,
                 "replicaRequirements": {"resourceRequest": {"cpu": "16", "nvidia.com/gpu": "8"}}}
            ]
        }));
        let r = SchedulingRequest::from_binding(&rb, None, now()).unwrap();
        let names: Vec<&str> = r.resources.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["cpu", "memory", "nvidia.com/gpu", "pods"]);
        assert_eq!(r.components[1].pod.request, [16_000, 0, 8_000, 1_000]);
        assert_eq!(r.pack_order, [1, 0], "GPU pods are packed first");
        assert_eq!(r.need_total, [66_000, 4 * (1 << 30) * 1000, 32_000, 5_000]);
        assert_eq!(r.replica_mode, ReplicaMode::Duplicated);
    }

    #[test]
    fn bad_quantities_and_policies_name_the_field() {
        let rb = binding(json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "replicas": 2,
            "replicaRequirements": {"resourceRequest": {"cpu": "two"}}
        }));
        let err = SchedulingRequest::from_binding(&rb, None, now()).unwrap_err();
        assert_eq!(err.field, "spec.replicaRequirements.resourceRequest[cpu]");
        assert!(err.reason.contains("`two`"), "{err}");

        let rb = binding(json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "replicas": 2,
            "placement": {"spreadConstraints": [{"spreadByField": "cluster", "maxGroups": 0}]}
        }));
        let err = SchedulingRequest::from_binding(&rb, None, now()).unwrap_err();
        assert_eq!(err.field, "spec.placement.spreadConstraints[0].maxGroups");

        let rb = binding(json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "replicas": 2,
            "components": [{"name": "a", "replicas": 1,
                "replicaRequirements": {"resourceRequest": {"memory": "-1Gi"}}}]
        }));
        let err = SchedulingRequest::from_binding(&rb, None, now()).unwrap_err();
        assert_eq!(
            err.field,
            "spec.components[0].replicaRequirements.resourceRequest[memory]"
        );
    }

    #[test]
    fn replica_modes_follow_karmada_defaults() {
        let mode = |placement: serde_json::Value, replicas: i32| {
            let rb = binding(json!({
                "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "replicas": replicas, "placement": placement
            }));
            SchedulingRequest::from_binding(&rb, None, now())
                .unwrap()
                .replica_mode
        };
        assert_eq!(mode(json!({}), 3), ReplicaMode::Duplicated);
        assert_eq!(
            mode(
                json!({"replicaScheduling": {"replicaSchedulingType": "Divided"}}),
                3
            ),
            ReplicaMode::StaticWeights(vec![])
        );
        assert_eq!(
            mode(
                json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
                "replicaDivisionPreference": "Aggregated"}}),
                3
            ),
            ReplicaMode::Aggregated
        );
        assert_eq!(
            mode(
                json!({"replicaScheduling": {"replicaSchedulingType": "Divided",
                "replicaDivisionPreference": "Weighted",
                "weightPreference": {"dynamicWeight": "AvailableReplicas"}}}),
                3
            ),
            ReplicaMode::DynamicWeights
        );
        assert_eq!(
            mode(
                json!({"replicaScheduling": {"replicaSchedulingType": "Divided"}}),
                0
            ),
            ReplicaMode::Duplicated,
            "a workload without replicas is duplicated"
        );
    }

    #[test]
    fn fresh_when_a_reschedule_was_asked_after_the_last_schedule() {
        let mut rb = binding(json!({
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "replicas": 1, "rescheduleTriggeredAt": "2026-11-23T09:00:00Z"
        }));
        assert!(
            SchedulingRequest::from_binding(&rb, None, now())
                .unwrap()
                .fresh
        );
        rb.status = Some(
            serde_json::from_value(json!({"lastScheduledTime": "2026-11-23T09:30:00Z"})).unwrap(),
        );
        assert!(
            !SchedulingRequest::from_binding(&rb, None, now())
                .unwrap()
                .fresh
        );
    }

    #[test]
    fn fnv32a_matches_the_reference_values() {
        assert_eq!(fnv32a(b""), 0x811c_9dc5);
        assert_eq!(fnv32a(b"a"), 0xe40c_292c);
        assert_eq!(fnv32a(b"foobar"), 0xbf9c_f968);
    }
}
