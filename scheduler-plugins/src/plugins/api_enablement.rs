//! APIEnablement (Filter): the cluster must serve the workload's kind. Clusters already in
//! `spec.clusters` pass (as in Karmada: a briefly incomplete discovery must not move work).

use super::{Candidate, FilterPlugin, Rejection};
use crate::request::SchedulingRequest;

pub struct ApiEnablement;

fn serves(request: &SchedulingRequest, candidate: &Candidate<'_>) -> Option<bool> {
    let apis = candidate.cluster.api_enablements.as_ref()?;
    Some(apis.contains(request.api_key, &request.api_version, &request.kind))
}

impl ApiEnablement {
    pub const NAME: &'static str = "APIEnablement";
}

impl FilterPlugin for ApiEnablement {
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
        match candidate
            .cluster
            .serves(&request.api_version, &request.kind)
        {
            Some(true) => Ok(()),
            Some(false) => Err(Rejection::new(
                format!("does not serve {} {}", request.api_version, request.kind),
                "cluster(s) did not have the API resource",
            )),
            None => Err(Rejection::new(
                "API enablements not reported yet",
                "cluster(s) had not reported API enablements yet",
            )),
        }
    }

    fn passes(&self, request: &SchedulingRequest, candidate: &Candidate<'_>) -> bool {
        candidate.is_current() || serves(request, candidate) == Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::*;
    use serde_json::json;

    #[test]
    fn the_kind_must_be_served() {
        let c = cluster("m1", json!({}), json!({}));
        assert!(run_filter(&ApiEnablement, &deployment(json!({})), &c).is_ok());
        let job =
            deployment(json!({"resource": {"apiVersion": "batch/v1", "kind": "Job", "name": "j"}}));
        let err = run_filter(&ApiEnablement, &job, &c).unwrap_err();
        assert_eq!(err.reason, "does not serve batch/v1 Job");
        let placed = deployment(json!({
            "resource": {"apiVersion": "batch/v1", "kind": "Job", "name": "j"},
            "clusters": [{"name": "m1"}]}));
        assert!(
            run_filter(&ApiEnablement, &placed, &c).is_ok(),
            "targeted clusters pass"
        );
    }

    #[test]
    fn nothing_reported_yet_is_said_so() {
        let c = cluster("m1", json!({}), json!({"apiEnablements": []}));
        let err = run_filter(&ApiEnablement, &deployment(json!({})), &c).unwrap_err();
        assert_eq!(err.reason, "API enablements not reported yet");
    }
}
