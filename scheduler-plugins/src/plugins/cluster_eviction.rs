//! ClusterEviction (Filter): a cluster the workload is being evicted from
//! (`gracefulEvictionTasks`) or was evicted from and whose `evictionHistory` entry has not
//! expired (`expiresAt` in the future, or absent: for good) gets no new placement. This is how
//! `blockPredecessorSeconds` is enforced after the eviction task is gone.

use super::{Candidate, FilterPlugin, Rejection};
use crate::request::SchedulingRequest;

pub struct ClusterEviction;

fn blocking<'r>(
    request: &'r SchedulingRequest,
    name: &'r str,
) -> impl Iterator<Item = &'r crate::request::EvictionBlock> + 'r {
    request
        .eviction_history
        .iter()
        .filter(move |e| e.cluster == name && e.expires_at.is_none_or(|t| t > request.now))
}

impl ClusterEviction {
    pub const NAME: &'static str = "ClusterEviction";
}

impl FilterPlugin for ClusterEviction {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn filter(
        &self,
        request: &SchedulingRequest,
        candidate: &Candidate<'_>,
    ) -> Result<(), Rejection> {
        let name: &str = &candidate.cluster.name;
        if let Some(task) = request.eviction_tasks.iter().find(|t| t.cluster == name) {
            return Err(Rejection::new(
                format!(
                    "being evicted ({}, by {}): the eviction task is still in progress",
                    task.reason, task.producer
                ),
                "cluster(s) is in the process of eviction",
            ));
        }
        // The entry that blocks longest decides the reason.
        let mut blocking = blocking(request, name);
        let Some(first) = blocking.next() else {
            return Ok(());
        };
        let entry = blocking.fold(first, |a, b| match (a.expires_at, b.expires_at) {
            (None, _) => a,
            (_, None) => b,
            (Some(x), Some(y)) => {
                if y > x {
                    b
                } else {
                    a
                }
            }
        });
        let until = match entry.expires_at {
            Some(t) => format!("blocked until {t}"),
            None => "blocked for good (blockPredecessorSeconds 0)".to_string(),
        };
        Err(Rejection::new(
            format!(
                "evicted at {} ({}); {until}",
                entry.evicted_at, entry.reason
            ),
            "cluster(s) had this workload evicted recently",
        ))
    }

    fn passes(&self, request: &SchedulingRequest, candidate: &Candidate<'_>) -> bool {
        let name: &str = &candidate.cluster.name;
        !request.eviction_tasks.iter().any(|t| t.cluster == name)
            && blocking(request, name).next().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn with_history(expires: Option<&str>) -> SchedulingRequest {
        let mut entry = json!({"clusterName": "m1", "reason": "ApplicationFailure",
                               "evictedAt": "2026-11-23T09:55:00Z"});
        if let Some(e) = expires {
            entry["expiresAt"] = json!(e);
        }
        deployment(json!({"evictionHistory": [entry]}))
    }

    #[test]
    fn eviction_tasks_block() {
        let r = deployment(json!({"gracefulEvictionTasks": [{"fromCluster": "m1",
            "reason": "ApplicationFailure", "producer": "lifeboat-hub"}]}));
        let err =
            run_filter(&ClusterEviction, &r, &cluster("m1", json!({}), json!({}))).unwrap_err();
        assert_eq!(err.summary, "cluster(s) is in the process of eviction");
        assert!(run_filter(&ClusterEviction, &r, &cluster("m2", json!({}), json!({}))).is_ok());
    }

    #[test]
    fn history_blocks_until_it_expires() {
        let m1 = cluster("m1", json!({}), json!({}));
        let mut r = with_history(Some("2026-11-23T10:05:00Z"));
        let err = run_filter(&ClusterEviction, &r, &m1).unwrap_err();
        assert_eq!(
            err.reason,
            "evicted at 2026-11-23T09:55:00Z (ApplicationFailure); blocked until 2026-11-23T10:05:00Z"
        );
        // The fake clock moves past the expiry: the cluster is schedulable again.
        r.now = "2026-11-23T10:05:00Z".parse::<Timestamp>().unwrap();
        assert!(run_filter(&ClusterEviction, &r, &m1).is_ok());

        let mut forever = with_history(None);
        forever.now = "2027-01-01T00:00:00Z".parse().unwrap();
        let err = run_filter(&ClusterEviction, &forever, &m1).unwrap_err();
        assert!(
            err.reason
                .ends_with("blocked for good (blockPredecessorSeconds 0)"),
            "{}",
            err.reason
        );
    }
}
