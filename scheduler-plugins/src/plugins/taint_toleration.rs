//! TaintToleration (Filter): every `NoSchedule` and `NoExecute` taint of the cluster must be
//! tolerated by `placement.clusterTolerations`, so a cluster the hub tainted
//! `cluster.lifeboat.dev/unreachable` or `not-ready` gets no new work unless tolerated.
//!
//! Clusters already in `spec.clusters` pass, for both effects, as in Karmada. For `NoSchedule`
//! that is the meaning of the effect. For `NoExecute` it is a choice: taking a workload off a
//! cluster is the failover controller's job (it writes a graceful eviction task and an
//! eviction history entry, honours the purge mode and never purges the old copy when nothing
//! else fits); if the scheduler silently dropped the cluster on its next pass, none of that
//! would happen. The scheduler does, however, never give such a cluster more replicas than it
//! has now ([`untolerated_no_execute`] caps it in Divided scheduling).

use super::{Candidate, FilterPlugin, Rejection};
use crate::request::SchedulingRequest;
use crate::snapshot::{ClusterSnapshot, ClusterTaint, TaintEffect};

pub struct TaintToleration;

impl TaintToleration {
    pub const NAME: &'static str = "TaintToleration";
}

fn untolerated<'c>(
    request: &SchedulingRequest,
    cluster: &'c ClusterSnapshot,
) -> Option<&'c ClusterTaint> {
    cluster
        .taints
        .iter()
        .find(|taint| !request.tolerations.iter().any(|t| t.tolerates(taint)))
}

/// Whether the cluster has a `NoExecute` taint the request does not tolerate.
pub fn untolerated_no_execute(request: &SchedulingRequest, cluster: &ClusterSnapshot) -> bool {
    cluster.taints.iter().any(|taint| {
        taint.effect == TaintEffect::NoExecute
            && !request.tolerations.iter().any(|t| t.tolerates(taint))
    })
}

impl FilterPlugin for TaintToleration {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn filter(
        &self,
        request: &SchedulingRequest,
        candidate: &Candidate<'_>,
    ) -> Result<(), Rejection> {
        if candidate.is_current() {
            return Ok(());
        }
        match untolerated(request, candidate.cluster) {
            None => Ok(()),
            Some(taint) => Err(Rejection::new(
                format!(
                    "untolerated taint {{{}: {}}} ({})",
                    taint.key,
                    taint.value,
                    taint.effect.as_str()
                ),
                format!(
                    "cluster(s) had untolerated taint {{{}: {}}}",
                    taint.key, taint.value
                ),
            )),
        }
    }

    fn passes(&self, request: &SchedulingRequest, candidate: &Candidate<'_>) -> bool {
        candidate.is_current() || untolerated(request, candidate.cluster).is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::*;
    use serde_json::json;

    fn tainted(effect: &str) -> ClusterSnapshot {
        cluster(
            "m1",
            json!({"taints": [{"key": "cluster.lifeboat.dev/unreachable", "effect": effect}]}),
            json!({}),
        )
    }

    #[test]
    fn unreachable_clusters_are_filtered_unless_tolerated() {
        let plain = deployment(json!({}));
        let err = run_filter(&TaintToleration, &plain, &tainted("NoSchedule")).unwrap_err();
        assert_eq!(
            err.summary,
            "cluster(s) had untolerated taint {cluster.lifeboat.dev/unreachable: }"
        );
        assert!(run_filter(&TaintToleration, &plain, &tainted("NoExecute")).is_err());
        assert!(run_filter(&TaintToleration, &plain, &tainted("PreferNoSchedule")).is_ok());

        let tolerant = deployment(json!({"placement": {"clusterTolerations": [
            {"key": "cluster.lifeboat.dev/unreachable", "operator": "Exists", "effect": "NoSchedule"}]}}));
        assert!(run_filter(&TaintToleration, &tolerant, &tainted("NoSchedule")).is_ok());
        assert!(
            run_filter(&TaintToleration, &tolerant, &tainted("NoExecute")).is_err(),
            "a NoSchedule toleration does not cover NoExecute"
        );
    }

    #[test]
    fn clusters_already_targeted_pass_but_are_marked_for_no_execute() {
        let placed = deployment(json!({"clusters": [{"name": "m1", "replicas": 2}]}));
        assert!(run_filter(&TaintToleration, &placed, &tainted("NoSchedule")).is_ok());
        assert!(run_filter(&TaintToleration, &placed, &tainted("NoExecute")).is_ok());
        assert!(untolerated_no_execute(&placed, &tainted("NoExecute")));
        assert!(!untolerated_no_execute(&placed, &tainted("NoSchedule")));
    }
}
