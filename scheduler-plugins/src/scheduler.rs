//! One scheduling decision: filter every cluster, score the feasible ones, select by spread
//! constraints, assign replicas.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use lifeboat_api::binding::{ClusterRejection, TargetCluster};

use crate::assign::{self, Member, NotEnough};
use crate::config::SchedulerConfig;
use crate::fit::FitEstimate;
use crate::plugins::{
    Candidate, FILTER_PLUGINS, FilterPlugin, Rejection, SCORE_PLUGINS, ScorePlugin, filter_plugin,
    score_plugin, untolerated_no_execute,
};
use crate::request::{ReplicaMode, SchedulingRequest};
use crate::select::{self, Choice, SelectFailure};
use crate::snapshot::{ClusterSnapshot, Snapshot};

/// The name under which the scheduler itself turns down clusters it cannot use at all
/// (being deleted, unreadable status); not a plugin, cannot be disabled.
pub const CLUSTER_STATUS: &str = "ClusterStatus";
/// The name under which replica division turns clusters down (not enough room together).
pub const REPLICA_SCHEDULING: &str = "ReplicaScheduling";
/// Spread constraint selection failures are reported under the SpreadConstraint plugin.
pub const SPREAD_CONSTRAINT: &str = crate::plugins::SpreadConstraint::NAME;

/// A successful decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleResult {
    /// The new `spec.clusters`, sorted by name.
    pub clusters: Vec<TargetCluster>,
    /// Every feasible cluster's weighted score, best first (ties by name).
    pub scores: Vec<ClusterScore>,
    /// The clusters filtered out and the plugin that did it, by cluster name; the reason in
    /// words is built on demand by [`Scheduler::explain`].
    pub filtered: Vec<FilteredCluster>,
}

/// A cluster a filter turned down in a successful decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilteredCluster {
    pub cluster: Arc<str>,
    pub plugin: &'static str,
}

/// A feasible cluster's total score (sum of score × weight over the score plugins).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterScore {
    pub cluster: Arc<str>,
    pub score: i64,
}

/// Nothing fits: why, for every cluster.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{summary}")]
pub struct FitError {
    /// One entry per cluster that was turned down, sorted by cluster name.
    pub rejections: Vec<ClusterRejection>,
    /// Karmada's form: `0/3 clusters are available: 1 cluster(s) had untolerated taint
    /// {cluster.lifeboat.dev/unreachable: }, 2 cluster(s) had no node that fits a replica.`
    pub summary: String,
}

/// The configured plugins; build once, call [`Scheduler::schedule`] per binding.
pub struct Scheduler {
    filters: Vec<Box<dyn FilterPlugin>>,
    scores: Vec<(Box<dyn ScorePlugin>, i64)>,
}

impl Default for Scheduler {
    fn default() -> Scheduler {
        Scheduler::new(&SchedulerConfig::default())
    }
}

impl Scheduler {
    /// The in-tree plugins the configuration enables, filters in their fixed order.
    pub fn new(config: &SchedulerConfig) -> Scheduler {
        let filters = FILTER_PLUGINS
            .iter()
            .filter(|n| config.filters.contains(*n))
            .filter_map(|n| filter_plugin(n))
            .collect();
        let scores = SCORE_PLUGINS
            .iter()
            .filter_map(|n| Some((score_plugin(n)?, *config.scores.get(n)?)))
            .collect();
        Scheduler { filters, scores }
    }

    /// Any plugins, in the order given (for out-of-tree plugins and tests).
    pub fn with_plugins(
        filters: Vec<Box<dyn FilterPlugin>>,
        scores: Vec<(Box<dyn ScorePlugin>, i64)>,
    ) -> Scheduler {
        Scheduler { filters, scores }
    }

    /// Names of the filters and scores that run, in order.
    pub fn plugin_names(&self) -> (Vec<&'static str>, Vec<(&'static str, i64)>) {
        (
            self.filters.iter().map(|f| f.name()).collect(),
            self.scores.iter().map(|(s, w)| (s.name(), *w)).collect(),
        )
    }

    /// Schedules one binding over the clusters of this round's snapshot.
    pub fn schedule(
        &self,
        request: &SchedulingRequest,
        snapshot: &Snapshot,
    ) -> Result<ScheduleResult, FitError> {
        let clusters = snapshot.clusters();
        let needs_room = !request.gang
            && request.replicas > 0
            && matches!(
                request.replica_mode,
                ReplicaMode::DynamicWeights | ReplicaMode::Aggregated
            );
        let mut feasible: Vec<Feasible<'_>> = Vec::with_capacity(clusters.len());
        let mut filtered: Vec<Filtered<'_>> = Vec::new();

        'clusters: for (position, cluster) in clusters.iter().enumerate() {
            if status_rejection(cluster).is_some() {
                filtered.push(Filtered {
                    cluster,
                    filter: None,
                    fit: None,
                });
                continue;
            }
            let candidate = Candidate::new(request, cluster);
            for (i, filter) in self.filters.iter().enumerate() {
                if !filter.passes(request, &candidate) {
                    filtered.push(Filtered {
                        cluster,
                        filter: Some(i),
                        fit: candidate.fit_if_known(),
                    });
                    continue 'clusters;
                }
            }
            let score = self
                .scores
                .iter()
                .map(|(plugin, weight)| plugin.score(request, &candidate).clamp(0, 100) * weight)
                .sum();
            feasible.push(Feasible {
                cluster,
                position,
                rank: 0,
                score,
                available: if needs_room {
                    candidate.fit().available_replicas
                } else {
                    0
                },
                current: candidate.current_replicas(),
                is_current: candidate.is_current(),
                frozen: candidate.is_current() && untolerated_no_execute(request, cluster),
            });
        }

        if feasible.is_empty() {
            let rejected = self.reasons(request, &filtered);
            return Err(fit_error(clusters.len(), rejected, Vec::new()));
        }
        // Best first; the snapshot is sorted by name, so positions break ties by name.
        feasible.sort_unstable_by(|a, b| b.score.cmp(&a.score).then(a.position.cmp(&b.position)));
        for (rank, f) in feasible.iter_mut().enumerate() {
            f.rank = rank;
        }

        let assigned = if request.gang {
            Ok(assign_gang(request, &feasible))
        } else {
            assign_replicas(request, &feasible)
        };
        let targets = match assigned {
            Ok(targets) => targets,
            Err(turned_down) => {
                let rejected = self.reasons(request, &filtered);
                return Err(fit_error(clusters.len(), rejected, turned_down));
            }
        };
        // Assignments come in name order already, except a gang's single target.
        Ok(ScheduleResult {
            clusters: targets,
            scores: feasible
                .iter()
                .map(|f| ClusterScore {
                    cluster: f.cluster.name.clone(),
                    score: f.score,
                })
                .collect(),
            filtered: filtered
                .iter()
                .map(|f| FilteredCluster {
                    cluster: f.cluster.name.clone(),
                    plugin: f.filter.map_or(CLUSTER_STATUS, |i| self.filters[i].name()),
                })
                .collect(),
        })
    }

    /// Why the filters turn this cluster down for this request (`None`: it passes them all).
    pub fn explain(
        &self,
        request: &SchedulingRequest,
        cluster: &ClusterSnapshot,
    ) -> Option<ClusterRejection> {
        let (plugin, rejection) = self.rejection(request, cluster)?;
        Some(ClusterRejection {
            cluster_name: cluster.name.to_string(),
            plugin: plugin.to_string(),
            reason: rejection.reason,
        })
    }

    fn rejection(
        &self,
        request: &SchedulingRequest,
        cluster: &ClusterSnapshot,
    ) -> Option<(&'static str, Rejection)> {
        if let Some(rejection) = status_rejection(cluster) {
            return Some((CLUSTER_STATUS, rejection));
        }
        let candidate = Candidate::new(request, cluster);
        self.filters.iter().find_map(|filter| {
            filter
                .filter(request, &candidate)
                .err()
                .map(|rejection| (filter.name(), rejection))
        })
    }

    /// The reasons of the clusters turned down in a failed decision: the filter that turned
    /// each down says why (reusing the fit computed for the decision).
    fn reasons<'a>(
        &self,
        request: &SchedulingRequest,
        filtered: &[Filtered<'a>],
    ) -> TurnedDown<'a> {
        filtered
            .iter()
            .map(|f| {
                let explained = match f.filter {
                    None => status_rejection(f.cluster).map(|r| (CLUSTER_STATUS, r)),
                    Some(i) => {
                        let filter = &self.filters[i];
                        let candidate = Candidate::with_fit(request, f.cluster, f.fit);
                        filter
                            .filter(request, &candidate)
                            .err()
                            .map(|r| (filter.name(), r))
                    }
                };
                let (plugin, rejection) = explained.unwrap_or_else(|| {
                    // A plugin whose `passes` and `filter` disagree: still say who turned it down.
                    let plugin = f.filter.map_or(CLUSTER_STATUS, |i| self.filters[i].name());
                    (
                        plugin,
                        Rejection::new(
                            format!("turned down by {plugin}"),
                            Cow::Owned(format!("cluster(s) turned down by {plugin}")),
                        ),
                    )
                });
                (f.cluster, plugin, rejection)
            })
            .collect()
    }
}

/// A cluster turned down during the filter pass.
struct Filtered<'a> {
    cluster: &'a ClusterSnapshot,
    /// The filter's index; `None`: the cluster status check.
    filter: Option<usize>,
    /// The fit, when the decision computed it.
    fit: Option<FitEstimate>,
}

/// A cluster that passed every filter.
struct Feasible<'a> {
    cluster: &'a ClusterSnapshot,
    /// Position in the snapshot (name order).
    position: usize,
    /// Position by score (0: best).
    rank: usize,
    score: i64,
    available: i64,
    current: i32,
    is_current: bool,
    frozen: bool,
}

/// Clusters the selection or the division turned down, with why.
type TurnedDown<'a> = Vec<(&'a ClusterSnapshot, &'static str, Rejection)>;

fn status_rejection(cluster: &ClusterSnapshot) -> Option<Rejection> {
    if cluster.deleting {
        return Some(Rejection::new(
            "the cluster is being deleted",
            "cluster(s) were being deleted",
        ));
    }
    cluster.invalid.as_ref().map(|problem| {
        Rejection::new(
            format!("cluster status cannot be read: {problem}"),
            "cluster(s) reported a status the scheduler cannot read",
        )
    })
}

/// A gang goes whole to one cluster: where it is now if that is still feasible (Steady), else
/// the best scored (ties by name).
fn assign_gang(request: &SchedulingRequest, feasible: &[Feasible<'_>]) -> Vec<TargetCluster> {
    let chosen = (!request.fresh)
        .then(|| feasible.iter().find(|f| f.is_current))
        .flatten()
        .unwrap_or(&feasible[0]);
    vec![TargetCluster {
        name: chosen.cluster.name.to_string(),
        replicas: request.replicas,
    }]
}

fn assign_replicas<'f, 'a>(
    request: &SchedulingRequest,
    feasible: &'f [Feasible<'a>],
) -> Result<Vec<TargetCluster>, TurnedDown<'a>> {
    let replicas = i64::from(request.replicas);
    // Division and the result go in name order.
    let by_name = |mut chosen: Vec<&'f Feasible<'a>>| {
        chosen.sort_unstable_by_key(|f| f.position);
        chosen
    };
    let members = |chosen: &[&Feasible<'a>]| -> Vec<Member> {
        chosen
            .iter()
            .map(|f| Member {
                rank: f.rank,
                available: f.available,
                current: i64::from(f.current),
                frozen: f.frozen,
            })
            .collect()
    };
    let divided = |chosen: &[&Feasible<'a>], result: Result<Vec<i64>, NotEnough>| {
        result
            .map(|seats| {
                chosen
                    .iter()
                    .zip(seats)
                    .filter(|(_, n)| *n > 0)
                    .map(|(f, n)| TargetCluster {
                        name: f.cluster.name.to_string(),
                        replicas: n as i32,
                    })
                    .collect::<Vec<_>>()
            })
            .map_err(|short| not_enough(feasible, chosen, short))
    };
    match &request.replica_mode {
        ReplicaMode::Duplicated => {
            let chosen = by_name(spread(request, feasible, None)?);
            Ok(chosen
                .iter()
                .map(|f| TargetCluster {
                    name: f.cluster.name.to_string(),
                    replicas: request.replicas,
                })
                .collect())
        }
        ReplicaMode::StaticWeights(rules) => {
            // Static weights ignore spread constraints and capacity, as in Karmada.
            let chosen = by_name(feasible.iter().collect());
            let mut weights: Vec<i64> = chosen
                .iter()
                .map(|f| {
                    rules
                        .iter()
                        .filter(|(affinity, _)| affinity.matches(f.cluster))
                        .map(|(_, w)| *w)
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            // No rule matches any feasible cluster (or no rules): weight 1 each.
            if weights.iter().all(|&w| w == 0) {
                weights.iter_mut().for_each(|w| *w = 1);
            }
            let m = members(&chosen);
            divided(
                &chosen,
                assign::by_static_weights(replicas, &m, &weights, request.tie_ascending),
            )
        }
        ReplicaMode::DynamicWeights | ReplicaMode::Aggregated => {
            let chosen = by_name(spread(request, feasible, Some(replicas))?);
            let m = members(&chosen);
            let result = if request.replica_mode == ReplicaMode::DynamicWeights {
                assign::by_available_replicas(replicas, &m, request.fresh, request.tie_ascending)
            } else {
                assign::aggregated(replicas, &m, request.fresh, request.tie_ascending)
            };
            divided(&chosen, result)
        }
    }
}

fn spread<'f, 'a>(
    request: &SchedulingRequest,
    feasible: &'f [Feasible<'a>],
    need: Option<i64>,
) -> Result<Vec<&'f Feasible<'a>>, TurnedDown<'a>> {
    if request.spread.cluster.is_none() && request.spread.region.is_none() {
        return Ok(feasible.iter().collect());
    }
    let choices: Vec<Choice<'_>> = feasible
        .iter()
        .map(|f| Choice {
            name: &f.cluster.name,
            score: f.score,
            available: f.available,
            region: f.cluster.region.as_deref(),
        })
        .collect();
    match select::select(&choices, &request.spread, need) {
        Ok(picked) => Ok(picked.into_iter().map(|i| &feasible[i]).collect()),
        Err(failure) => Err(selection_failed(feasible, &failure)),
    }
}

fn selection_failed<'a>(feasible: &[Feasible<'a>], failure: &SelectFailure) -> TurnedDown<'a> {
    let summary = failure.summary();
    let reason = match failure {
        SelectFailure::TooFewClusters { feasible, min } => format!(
            "feasible, but only {feasible} cluster(s) are, and the spread constraints need at least {min}"
        ),
        SelectFailure::TooFewRegions { feasible, min } => format!(
            "feasible, but the feasible clusters are in {feasible} region(s), and the spread constraints need at least {min}"
        ),
        SelectFailure::Conflict {
            max_clusters,
            min_regions,
        } => format!(
            "feasible, but the spread constraints cannot be met: at most {max_clusters} cluster(s) for at least {min_regions} region(s)"
        ),
    };
    feasible
        .iter()
        .map(|f| {
            (
                f.cluster,
                SPREAD_CONSTRAINT,
                Rejection::new(reason.clone(), Cow::Owned(summary.clone())),
            )
        })
        .collect()
}

/// Every feasible cluster's reason when the selected ones cannot run the replicas.
fn not_enough<'a>(
    feasible: &[Feasible<'a>],
    chosen: &[&Feasible<'a>],
    short: NotEnough,
) -> TurnedDown<'a> {
    let summary = format!(
        "cluster(s) could together run only {} more of the {} replicas to place",
        short.available, short.needed
    );
    feasible
        .iter()
        .map(|f| {
            if !chosen.iter().any(|c| c.position == f.position) {
                return (
                    f.cluster,
                    SPREAD_CONSTRAINT,
                    Rejection::new(
                        "feasible, but not among the clusters the spread constraints selected",
                        "cluster(s) were feasible but not selected by the spread constraints",
                    ),
                );
            }
            let reason = if f.frozen {
                format!(
                    "has an untolerated NoExecute taint: keeps its {} replica(s), takes no more",
                    f.current
                )
            } else {
                format!(
                    "can run {} more replica(s); the {} selected cluster(s) together can run {} of the {} to place",
                    f.available,
                    chosen.len(),
                    short.available,
                    short.needed
                )
            };
            (
                f.cluster,
                REPLICA_SCHEDULING,
                Rejection::new(reason, Cow::Owned(summary.clone())),
            )
        })
        .collect()
}

fn fit_error<'a>(
    total: usize,
    mut rejected: TurnedDown<'a>,
    turned_down: TurnedDown<'a>,
) -> FitError {
    rejected.extend(turned_down);
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for (_, _, r) in &rejected {
        *counts.entry(r.summary.as_ref()).or_default() += 1;
    }
    let mut histogram: Vec<String> = counts
        .into_iter()
        .map(|(summary, n)| format!("{n} {summary}"))
        .collect();
    histogram.sort();
    let summary = if total == 0 {
        "0/0 clusters are available: no clusters are registered.".to_string()
    } else {
        format!(
            "0/{total} clusters are available: {}.",
            histogram.join(", ")
        )
    };
    FitError {
        rejections: to_api(rejected),
        summary,
    }
}

fn to_api(mut rejected: TurnedDown<'_>) -> Vec<ClusterRejection> {
    rejected.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    rejected
        .into_iter()
        .map(|(cluster, plugin, r)| ClusterRejection {
            cluster_name: cluster.name.to_string(),
            plugin: plugin.to_string(),
            reason: r.reason,
        })
        .collect()
}
