//! Node-by-node fitting of a request into one cluster: the work behind GangFit, the
//! available-replica estimate of Divided scheduling, and the capacity scores.
//!
//! Nodes come in groups of identical free capacity. Packing is first-fit-decreasing: the
//! largest pods first (see `request::pack_order`), each onto the first node where it fits, in
//! node-group order (groups of the preferred capacity type first). A group whose nodes are
//! partly used is split into "filled", "partly filled" and "untouched" nodes, which is exactly
//! what placing the pods one node at a time would do, at the cost of a few groups instead of
//! one step per pod. Capacity is never summed over nodes to decide a fit.

use crate::quantity::format_milli;
use crate::request::{PodRequest, SchedulingRequest};
use crate::snapshot::{ClusterSnapshot, NOT_REPORTED, NodeGroupSnapshot};

/// What fitting a request into one cluster found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitEstimate {
    /// Gang: every pod of every component placed. Otherwise: one pod of each component fits
    /// on some node.
    pub outcome: Result<(), FitFailure>,
    /// Replicas of the main template the cluster can still run, node by node (not for gang
    /// requests; capped at `i32::MAX`).
    pub available_replicas: i64,
    /// 0..=100: the share of the pods (gang) or of the available replicas (others) on nodes
    /// of the preferred capacity type; 0 without a preference.
    pub preferred_share: i64,
    /// 0..=100: how much of the cluster's free capacity would be left after the whole
    /// workload, on its tightest requested resource.
    pub headroom: i64,
}

/// Why a request does not fit a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FitFailure {
    /// The agent has not reported node capacity yet.
    NoCapacityReported,
    /// `placed` of the `wanted` pods of a component found a node.
    Component {
        component: String,
        placed: i64,
        wanted: i64,
        /// What one pod needs, e.g. `nvidia.com/gpu: 8, cpu: 16`.
        per_pod: String,
        /// The most any single node has free of those resources.
        largest_node: String,
        /// The cluster's free total of those resources (summed over nodes).
        cluster_free: String,
    },
}

impl std::fmt::Display for FitFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FitFailure::NoCapacityReported => f.write_str("node capacity not reported yet"),
            FitFailure::Component {
                component,
                placed,
                wanted,
                per_pod,
                largest_node,
                cluster_free,
            } => write!(
                f,
                "{placed} of {wanted} pod(s) of {component} ({per_pod} each) fit node by node; \
                 largest free on one node: {largest_node}; free in the whole cluster: {cluster_free}"
            ),
        }
    }
}

/// Buffers reused across the clusters of one decision.
#[derive(Default)]
pub(crate) struct Scratch {
    columns: Vec<Option<usize>>,
    group_order: Vec<usize>,
    bucket_count: Vec<i64>,
    bucket_group: Vec<usize>,
    bucket_free: Vec<i64>,
}

/// Free amount of request column `k` on one node of `group`.
#[inline]
fn projected(
    request: &SchedulingRequest,
    columns: &[Option<usize>],
    group: &NodeGroupSnapshot,
    k: usize,
) -> i64 {
    let reported = columns[k]
        .map(|c| group.free[c])
        .filter(|&f| f != NOT_REPORTED);
    match reported {
        Some(free) => free,
        None if request.resources[k].optional => i64::MAX,
        None => 0,
    }
}

/// How many pods of `request` fit on a node with `free`.
#[inline]
fn per_node(free: &[i64], request: &[i64]) -> i64 {
    let mut n = i64::MAX;
    for (f, q) in free.iter().zip(request) {
        if *q > 0 {
            n = n.min(f / q);
        }
    }
    n
}

fn claim_ok(pod: &PodRequest, group: &NodeGroupSnapshot) -> bool {
    pod.node_claim.is_empty() || pod.node_claim.matches(&group.labels)
}

pub(crate) fn estimate(
    request: &SchedulingRequest,
    cluster: &ClusterSnapshot,
    scratch: &mut Scratch,
) -> FitEstimate {
    let r = request.resources.len();
    let Scratch {
        columns,
        group_order,
        bucket_count,
        bucket_group,
        bucket_free,
    } = scratch;
    columns.clear();
    columns.extend(
        request
            .resources
            .iter()
            .map(|res| cluster.column(&res.name)),
    );

    // Groups of the preferred capacity type first, each part in reported order.
    group_order.clear();
    let preference = request.capacity_preference;
    let preferred = |g: &NodeGroupSnapshot| preference.is_some() && g.capacity_type == preference;
    group_order.extend(
        (0..cluster.node_groups.len())
            .filter(|&g| cluster.node_groups[g].count > 0 && preferred(&cluster.node_groups[g])),
    );
    group_order.extend(
        (0..cluster.node_groups.len())
            .filter(|&g| cluster.node_groups[g].count > 0 && !preferred(&cluster.node_groups[g])),
    );

    let headroom = headroom(request, cluster, columns);
    if request.components.is_empty() {
        return FitEstimate {
            outcome: Ok(()),
            available_replicas: i64::from(i32::MAX),
            preferred_share: 0,
            headroom,
        };
    }
    if group_order.is_empty() {
        return FitEstimate {
            outcome: Err(FitFailure::NoCapacityReported),
            available_replicas: 0,
            preferred_share: 0,
            headroom,
        };
    }

    if request.gang {
        bucket_count.clear();
        bucket_group.clear();
        bucket_free.clear();
        for &g in group_order.iter() {
            let group = &cluster.node_groups[g];
            bucket_count.push(group.count);
            bucket_group.push(g);
            bucket_free.extend((0..r).map(|k| projected(request, columns, group, k)));
        }
        let mut on_preferred: i64 = 0;
        let mut total: i64 = 0;
        for &c in &request.pack_order {
            let component = &request.components[c];
            let req = &component.pod.request;
            let mut remaining = component.replicas;
            let mut b = 0;
            while remaining > 0 && b < bucket_count.len() {
                let group = &cluster.node_groups[bucket_group[b]];
                if !claim_ok(&component.pod, group) {
                    b += 1;
                    continue;
                }
                let free = &bucket_free[b * r..(b + 1) * r];
                let n = per_node(free, req);
                if n == 0 {
                    b += 1;
                    continue;
                }
                let count = bucket_count[b];
                let full_nodes = remaining / n;
                let placed = if full_nodes >= count {
                    // Every node of the bucket takes n pods.
                    for (f, q) in bucket_free[b * r..(b + 1) * r].iter_mut().zip(req) {
                        *f -= n * q;
                    }
                    b += 1;
                    n * count
                } else {
                    // Split: `full_nodes` filled, one partly filled, the rest untouched.
                    let rest = remaining % n;
                    let untouched = count - full_nodes - i64::from(rest > 0);
                    let original: Vec<i64> = free.to_vec();
                    let mut counts = Vec::with_capacity(3);
                    let mut frees = Vec::with_capacity(3 * r);
                    for (nodes, pods) in
                        [(full_nodes, n), (i64::from(rest > 0), rest), (untouched, 0)]
                    {
                        if nodes > 0 {
                            counts.push(nodes);
                            frees.extend(original.iter().zip(req).map(|(f, q)| f - pods * q));
                        }
                    }
                    let added = counts.len();
                    bucket_count.splice(b..=b, counts);
                    bucket_group.splice(b..=b, std::iter::repeat_n(bucket_group[b], added));
                    bucket_free.splice(b * r..(b + 1) * r, frees);
                    remaining
                };
                remaining -= placed;
                if preferred(group) {
                    on_preferred += placed;
                }
            }
            total += component.replicas - remaining;
            if remaining > 0 {
                return FitEstimate {
                    outcome: Err(failure(
                        request,
                        cluster,
                        columns,
                        group_order,
                        c,
                        component.replicas - remaining,
                    )),
                    available_replicas: 0,
                    preferred_share: 0,
                    headroom,
                };
            }
        }
        let preferred_share = if total > 0 {
            on_preferred * 100 / total
        } else {
            0
        };
        return FitEstimate {
            outcome: Ok(()),
            available_replicas: 0,
            preferred_share,
            headroom,
        };
    }

    // Not a gang: one pod of each component must fit some node.
    let mut free = vec![0i64; r];
    for (c, component) in request.components.iter().enumerate() {
        let fits = group_order.iter().any(|&g| {
            let group = &cluster.node_groups[g];
            if !claim_ok(&component.pod, group) {
                return false;
            }
            for (k, f) in free.iter_mut().enumerate() {
                *f = projected(request, columns, group, k);
            }
            per_node(&free, &component.pod.request) >= 1
        });
        if !fits {
            return FitEstimate {
                outcome: Err(failure(request, cluster, columns, group_order, c, 0)),
                available_replicas: 0,
                preferred_share: 0,
                headroom,
            };
        }
    }
    // Replicas of the main template, node by node.
    let cap = i64::from(i32::MAX);
    let (mut available, mut on_preferred) = (0i64, 0i64);
    for &g in group_order.iter() {
        let group = &cluster.node_groups[g];
        if !claim_ok(&request.per_replica, group) {
            continue;
        }
        for (k, f) in free.iter_mut().enumerate() {
            *f = projected(request, columns, group, k);
        }
        let n = per_node(&free, &request.per_replica.request)
            .min(cap)
            .saturating_mul(group.count)
            .min(cap);
        available = (available + n).min(cap);
        if preferred(group) {
            on_preferred = (on_preferred + n).min(cap);
        }
    }
    FitEstimate {
        outcome: Ok(()),
        available_replicas: available,
        preferred_share: if available > 0 {
            on_preferred * 100 / available
        } else {
            0
        },
        headroom,
    }
}

fn headroom(
    request: &SchedulingRequest,
    cluster: &ClusterSnapshot,
    columns: &[Option<usize>],
) -> i64 {
    let mut score: Option<i64> = None;
    for (k, &need) in request.need_total.iter().enumerate() {
        if need <= 0 || request.resources[k].optional {
            continue;
        }
        let free = columns[k].map_or(0, |c| cluster.free_for_score(c));
        let s = if free <= 0 {
            0
        } else {
            // 100 × (1 − need/free), rounded down, never below 0.
            let (num, den) = (i128::from(need) * 100, i128::from(free));
            let used = (num + den - 1) / den;
            (100 - used).max(0) as i64
        };
        score = Some(score.map_or(s, |prev| prev.min(s)));
    }
    score.unwrap_or(0)
}

fn failure(
    request: &SchedulingRequest,
    cluster: &ClusterSnapshot,
    columns: &[Option<usize>],
    group_order: &[usize],
    component: usize,
    placed: i64,
) -> FitFailure {
    let c = &request.components[component];
    let mut per_pod = Vec::new();
    let mut largest = Vec::new();
    let mut total = Vec::new();
    let mut shown: Vec<usize> = (0..request.resources.len())
        .filter(|&k| c.pod.request[k] > 0 && !request.resources[k].optional)
        .collect();
    if shown.is_empty() {
        shown = (0..request.resources.len())
            .filter(|&k| c.pod.request[k] > 0)
            .collect();
    }
    // Accelerators first, as they are packed.
    shown.sort_by_key(|&k| {
        let name = request.resources[k].name.as_str();
        (
            matches!(name, "cpu" | "memory" | "ephemeral-storage" | "pods"),
            k,
        )
    });
    for k in shown {
        let name = &request.resources[k].name;
        per_pod.push(format!("{name}: {}", format_milli(name, c.pod.request[k])));
        let max_node = group_order
            .iter()
            .map(|&g| projected(request, columns, &cluster.node_groups[g], k))
            .max()
            .unwrap_or(0);
        largest.push(format!("{name}: {}", format_milli(name, max_node)));
        let sum = columns[k].map_or(0, |col| cluster.free_total[col]);
        total.push(format!("{name}: {}", format_milli(name, sum)));
    }
    FitFailure::Component {
        component: c.name.clone(),
        placed,
        wanted: if request.gang { c.replicas } else { 1 },
        per_pod: per_pod.join(", "),
        largest_node: largest.join(", "),
        cluster_free: total.join(", "),
    }
}
