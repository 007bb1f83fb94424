//! ClusterAffinity (Filter): the cluster must match `placement.clusterAffinity` (clusterNames,
//! exclude, labelSelector, fieldSelector on provider/region/zone).

use super::{Candidate, FilterPlugin, Rejection};
use crate::request::SchedulingRequest;

pub struct ClusterAffinity;

impl ClusterAffinity {
    pub const NAME: &'static str = "ClusterAffinity";
}

impl FilterPlugin for ClusterAffinity {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn filter(
        &self,
        request: &SchedulingRequest,
        candidate: &Candidate<'_>,
    ) -> Result<(), Rejection> {
        let Some(affinity) = &request.affinity else {
            return Ok(());
        };
        affinity.check(candidate.cluster).map_err(|mismatch| {
            Rejection::new(
                mismatch.describe(candidate.cluster),
                "cluster(s) did not match the placement cluster affinity constraint",
            )
        })
    }

    fn passes(&self, request: &SchedulingRequest, candidate: &Candidate<'_>) -> bool {
        request
            .affinity
            .as_ref()
            .is_none_or(|a| a.matches(candidate.cluster))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::*;
    use serde_json::json;

    #[test]
    fn names_exclusions_labels_and_fields() {
        let eu = cluster(
            "eu-1",
            json!({"region": "eu-west", "provider": "aws"}),
            json!({}),
        );
        let us = cluster(
            "us-1",
            json!({"region": "us-east", "provider": "aws"}),
            json!({}),
        );
        let bare = cluster("bare", json!({}), json!({}));

        let by_region = deployment(json!({"placement": {"clusterAffinity": {"fieldSelector": {
            "matchExpressions": [{"key": "region", "operator": "In", "values": ["eu-west"]}]}}}}));
        assert!(run_filter(&ClusterAffinity, &by_region, &eu).is_ok());
        let err = run_filter(&ClusterAffinity, &by_region, &us).unwrap_err();
        assert_eq!(
            err.reason,
            "region `us-east` does not match clusterAffinity.fieldSelector"
        );
        assert_eq!(
            err.summary,
            "cluster(s) did not match the placement cluster affinity constraint"
        );
        let err = run_filter(&ClusterAffinity, &by_region, &bare).unwrap_err();
        assert!(err.reason.contains("no region set"), "{}", err.reason);

        let not_in = deployment(json!({"placement": {"clusterAffinity": {"fieldSelector": {
            "matchExpressions": [{"key": "region", "operator": "NotIn", "values": ["eu-west"]}]}}}}));
        assert!(
            run_filter(&ClusterAffinity, &not_in, &bare).is_ok(),
            "NotIn matches a missing field"
        );
        assert!(run_filter(&ClusterAffinity, &not_in, &eu).is_err());

        let names = deployment(json!({"placement": {"clusterAffinity": {
            "clusterNames": ["eu-1", "us-1"], "exclude": ["us-1"]}}}));
        assert!(run_filter(&ClusterAffinity, &names, &eu).is_ok());
        assert_eq!(
            run_filter(&ClusterAffinity, &names, &us)
                .unwrap_err()
                .reason,
            "listed in clusterAffinity.exclude"
        );
        assert_eq!(
            run_filter(&ClusterAffinity, &names, &bare)
                .unwrap_err()
                .reason,
            "not in clusterAffinity.clusterNames"
        );

        let labels = deployment(json!({"placement": {"clusterAffinity": {"labelSelector": {
            "matchExpressions": [{"key": "name", "operator": "In", "values": ["bare"]}]}}}}));
        assert!(run_filter(&ClusterAffinity, &labels, &bare).is_ok());
        assert!(run_filter(&ClusterAffinity, &labels, &eu).is_err());
        assert!(run_filter(&ClusterAffinity, &deployment(json!({})), &eu).is_ok());
    }
}
