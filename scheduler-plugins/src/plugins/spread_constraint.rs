//! SpreadConstraint (Filter): spreading by region, zone or provider needs clusters that have
//! that field (Karmada's plugin of the same name).

use super::{Candidate, FilterPlugin, Rejection};
use crate::request::SchedulingRequest;
use crate::selector::ClusterField;

pub struct SpreadConstraint;

impl SpreadConstraint {
    pub const NAME: &'static str = "SpreadConstraint";
}

impl FilterPlugin for SpreadConstraint {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn filter(
        &self,
        request: &SchedulingRequest,
        candidate: &Candidate<'_>,
    ) -> Result<(), Rejection> {
        for field in &request.spread.required_fields {
            if field.of(candidate.cluster).is_none_or(str::is_empty) {
                let summary = match field {
                    ClusterField::Provider => "cluster(s) did not have provider property",
                    ClusterField::Region => "cluster(s) did not have region property",
                    ClusterField::Zone => "cluster(s) did not have zone property",
                };
                return Err(Rejection::new(
                    format!(
                        "no {} set, and the placement spreads by {}",
                        field.as_str(),
                        field.as_str()
                    ),
                    summary,
                ));
            }
        }
        Ok(())
    }

    fn passes(&self, request: &SchedulingRequest, candidate: &Candidate<'_>) -> bool {
        request
            .spread
            .required_fields
            .iter()
            .all(|f| f.of(candidate.cluster).is_some_and(|v| !v.is_empty()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::*;
    use serde_json::json;

    #[test]
    fn spreading_by_a_field_needs_the_field() {
        let r = deployment(json!({"placement": {"spreadConstraints": [
            {"spreadByField": "cluster", "maxGroups": 3},
            {"spreadByField": "zone", "minGroups": 2}]}}));
        let zoned = cluster("a", json!({"zone": "z1"}), json!({}));
        let plain = cluster("b", json!({"region": "r1"}), json!({}));
        assert!(run_filter(&SpreadConstraint, &r, &zoned).is_ok());
        let err = run_filter(&SpreadConstraint, &r, &plain).unwrap_err();
        assert_eq!(err.summary, "cluster(s) did not have zone property");
        assert!(run_filter(&SpreadConstraint, &deployment(json!({})), &plain).is_ok());
    }
}
