//! CapacityType (Score): with a capacity-type preference (`spot` or `on-demand`, from the
//! policy's `placement.capacityTypePreference` or its `placement.lifeboat.dev/capacity-type`
//! label), the share of the workload's pods that land on nodes of that type, 0..=100. Packing
//! tries nodes of the preferred type first. Without a preference every cluster scores 0.

use super::{Candidate, ScorePlugin};
use crate::request::SchedulingRequest;

pub struct CapacityTypePreference;

impl CapacityTypePreference {
    pub const NAME: &'static str = "CapacityType";
}

impl ScorePlugin for CapacityTypePreference {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn score(&self, request: &SchedulingRequest, candidate: &Candidate<'_>) -> i64 {
        if request.capacity_preference.is_none() {
            return 0;
        }
        candidate.fit().preferred_share
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::*;
    use lifeboat_api::policy::CapacityType;
    use serde_json::json;

    #[test]
    fn prefers_clusters_whose_fitting_nodes_are_of_the_preferred_type() {
        let mut r = request(json!({
            "resource": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "t"},
            "replicas": 4, "gang": true,
            "replicaRequirements": {"resourceRequest": {"nvidia.com/gpu": "8"}}
        }));
        let spot_and_od = cluster(
            "mixed",
            json!({}),
            json!({"nodeGroups": [
            {"count": 2, "free": {"nvidia.com/gpu": "8"}, "capacityType": "on-demand"},
            {"count": 2, "free": {"nvidia.com/gpu": "8"}, "capacityType": "spot"}]}),
        );
        let on_demand = cluster(
            "od",
            json!({}),
            json!({"nodeGroups": [
            {"count": 4, "free": {"nvidia.com/gpu": "8"}, "capacityType": "on-demand"}]}),
        );
        assert_eq!(
            run_score(&CapacityTypePreference, &r, &spot_and_od),
            0,
            "no preference"
        );
        r.capacity_preference = Some(CapacityType::Spot);
        // Spot nodes are packed first: 2 of the 4 pods land on spot.
        assert_eq!(run_score(&CapacityTypePreference, &r, &spot_and_od), 50);
        assert_eq!(run_score(&CapacityTypePreference, &r, &on_demand), 0);
        r.capacity_preference = Some(CapacityType::OnDemand);
        assert_eq!(run_score(&CapacityTypePreference, &r, &on_demand), 100);

        // Not a gang: the share of the replicas the cluster can run.
        let mut web = deployment(
            json!({"replicaRequirements": {"resourceRequest": {"nvidia.com/gpu": "2"}}}),
        );
        web.capacity_preference = Some(CapacityType::Spot);
        assert_eq!(run_score(&CapacityTypePreference, &web, &spot_and_od), 50);
    }
}
