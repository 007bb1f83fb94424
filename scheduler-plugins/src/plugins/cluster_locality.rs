//! ClusterLocality (Score): 100 for a cluster the binding is already in, else 0 (stay where
//! you are).

use super::{Candidate, ScorePlugin};
use crate::request::SchedulingRequest;

pub struct ClusterLocality;

impl ClusterLocality {
    pub const NAME: &'static str = "ClusterLocality";
}

impl ScorePlugin for ClusterLocality {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn score(&self, _request: &SchedulingRequest, candidate: &Candidate<'_>) -> i64 {
        if candidate.is_current() { 100 } else { 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::*;
    use serde_json::json;

    #[test]
    fn current_clusters_score_100() {
        let r = deployment(json!({"clusters": [{"name": "m1", "replicas": 2}]}));
        assert_eq!(
            run_score(&ClusterLocality, &r, &cluster("m1", json!({}), json!({}))),
            100
        );
        assert_eq!(
            run_score(&ClusterLocality, &r, &cluster("m2", json!({}), json!({}))),
            0
        );
    }
}
