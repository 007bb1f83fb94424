//! Node-by-node fitting of a request into one cluster: the work behind GangFit, the
//! available-replica estimate of Divided scheduling, and the capacity scores.
//!
//! Nodes come in groups of identical free capacity. Packing is first-fit-decreasing: the
//! largest pods first (see `request::pack_order`), each onto the first node where it fits, in
//! node-group order (groups of the preferred capacity type first). A group whose nodes are
//! partly used is split into "filled", "partly filled" and "untouched" nodes, which is exactly
//! what placing the pods one node at a time would do, at the cost of a few groups instead of
//! one step per pod. Capacity is never summed over nodes to decide a fit.

use crate::quantity::Amount;
use crate::request::{PodRequest, SchedulingRequest};
use crate::snapshot::{ClusterSnapshot, NOT_REPORTED, NodeGroupSnapshot};

/// What fitting a request into one cluster found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
}

/// Why a request does not fit a cluster ([`explain`] says it in words).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FitFailure {
    /// The agent has not reported node capacity yet.
    NoCapacityReported,
    /// Only `placed` pods of component `component` (an index into the request's components)
    /// found a node: of all of them for a gang, of one otherwise.
    Shortfall { component: usize, placed: i64 },
}

/// Buffers reused across the clusters of one decision.
#[derive(Default)]
pub(crate) struct Scratch {
    columns: Vec<Option<usize>>,
    group_order: Vec<usize>,
    bucket_count: Vec<i64>,
    bucket_group: Vec<usize>,
    bucket_free: Vec<i64>,
    node_free: Vec<i64>,
    split_free: Vec<i64>,
}

/// The snapshot column of every request column.
fn fill_columns(
    request: &SchedulingRequest,
    cluster: &ClusterSnapshot,
    columns: &mut Vec<Option<usize>>,
) {
    columns.clear();
    columns.extend(
        request
            .resources
            .iter()
            .map(|res| res.well_known.or_else(|| cluster.column(&res.name))),
    );
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
        node_free,
        split_free,
    } = scratch;
    fill_columns(request, cluster, columns);

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

    if request.components.is_empty() {
        return FitEstimate {
            outcome: Ok(()),
            available_replicas: i64::from(i32::MAX),
            preferred_share: 0,
        };
    }
    if group_order.is_empty() {
        return FitEstimate {
            outcome: Err(FitFailure::NoCapacityReported),
            available_replicas: 0,
            preferred_share: 0,
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
                let n = per_node(&bucket_free[b * r..(b + 1) * r], req);
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
                    // Split: `full_nodes` filled, one partly filled, the rest untouched, in
                    // that order (first fit fills the first nodes first).
                    let rest = remaining % n;
                    let partial = i64::from(rest > 0);
                    let untouched = count - full_nodes - partial;
                    node_free.clear();
                    node_free.extend_from_slice(&bucket_free[b * r..(b + 1) * r]);
                    split_free.clear();
                    let mut added = 0;
                    for (nodes, pods) in [(full_nodes, n), (partial, rest), (untouched, 0)] {
                        if nodes > 0 {
                            split_free.extend(node_free.iter().zip(req).map(|(f, q)| f - pods * q));
                            bucket_count.insert(b + added, nodes);
                            added += 1;
                        }
                    }
                    bucket_count.remove(b + added);
                    let group_index = bucket_group[b];
                    for _ in 1..added {
                        bucket_group.insert(b, group_index);
                    }
                    bucket_free.splice(b * r..(b + 1) * r, split_free.drain(..));
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
                    outcome: Err(FitFailure::Shortfall {
                        component: c,
                        placed: component.replicas - remaining,
                    }),
                    available_replicas: 0,
                    preferred_share: 0,
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
        };
    }

    // Not a gang: one pod of each component must fit some node.
    let free = node_free;
    free.clear();
    free.resize(r, 0);
    for (c, component) in request.components.iter().enumerate() {
        let fits = group_order.iter().any(|&g| {
            let group = &cluster.node_groups[g];
            if !claim_ok(&component.pod, group) {
                return false;
            }
            for (k, f) in free.iter_mut().enumerate() {
                *f = projected(request, columns, group, k);
            }
            per_node(free, &component.pod.request) >= 1
        });
        if !fits {
            return FitEstimate {
                outcome: Err(FitFailure::Shortfall {
                    component: c,
                    placed: 0,
                }),
                available_replicas: 0,
                preferred_share: 0,
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
        let n = per_node(free, &request.per_replica.request)
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
    }
}

/// 0..=100: how much of the cluster's free capacity would be left after the whole workload,
/// on its tightest requested resource: 100 × (1 − need / free), 0 when nothing is requested.
/// Free capacity is summed over nodes here: this is a score, not a fit.
pub fn headroom(request: &SchedulingRequest, cluster: &ClusterSnapshot) -> i64 {
    let mut score: Option<i64> = None;
    for (k, &need) in request.need_total.iter().enumerate() {
        let resource = &request.resources[k];
        if need <= 0 || resource.optional {
            continue;
        }
        let free = resource
            .well_known
            .or_else(|| cluster.column(&resource.name))
            .map_or(0, |c| cluster.free_for_score(c));
        let s = if free <= 0 {
            0
        } else {
            // ceil(100 × need / free), in i64 unless that could overflow.
            let used = match need.checked_mul(100) {
                Some(n) => (n + free - 1) / free,
                None => ((i128::from(need) * 100 + i128::from(free) - 1) / i128::from(free))
                    .min(100) as i64,
            };
            (100 - used).max(0)
        };
        score = Some(score.map_or(s, |prev| prev.min(s)));
    }
    score.unwrap_or(0)
}

/// Why the request does not fit the cluster, in words: what one pod needs, the most any node
/// has free, and the cluster's free total (which may well be enough: fitting is per node).
pub fn explain(
    request: &SchedulingRequest,
    cluster: &ClusterSnapshot,
    failure: FitFailure,
) -> String {
    use std::fmt::Write;

    let FitFailure::Shortfall { component, placed } = failure else {
        return "node capacity not reported yet".to_string();
    };
    let Some(c) = request.components.get(component) else {
        return format!("component {component} does not fit");
    };
    let mut columns = Vec::with_capacity(request.resources.len());
    fill_columns(request, cluster, &mut columns);
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
    // `name: amount, name: amount` over the shown resources.
    let list = |out: &mut String, value: &dyn Fn(usize) -> i64| {
        for (i, &k) in shown.iter().enumerate() {
            let resource = request.resources[k].name.as_str();
            let amount = Amount {
                resource,
                milli: value(k),
            };
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(out, "{sep}{resource}: {amount}");
        }
    };
    let wanted = if request.gang { c.replicas } else { 1 };
    let mut out = String::with_capacity(256);
    let _ = write!(out, "{placed} of {wanted} pod(s) of {} (", c.name);
    list(&mut out, &|k| c.pod.request[k]);
    out.push_str(" each) fit node by node; largest free on one node: ");
    list(&mut out, &|k| {
        cluster
            .node_groups
            .iter()
            .filter(|g| g.count > 0)
            .map(|g| projected(request, &columns, g, k))
            .max()
            .unwrap_or(0)
    });
    out.push_str("; free in the whole cluster: ");
    list(&mut out, &|k| {
        columns[k].map_or(0, |col| cluster.free_total[col])
    });
    out
}
