//! Asking for a manual in-place reset (`lifeboatctl reset`): the binding's
//! `work.lifeboat.dev/reset-request` annotation is set to `CLUSTER/NONCE`, a value never used
//! before, so the hub serves it once (it remembers the last value served per cluster in
//! `spec.inPlaceResets[].manualRequest`). The cluster is the one asked, which must be a current
//! placement, or else the single placement.
//!
//! The request's format is the contract between `lifeboatctl reset` and the hub, so it lives
//! here, pure: [`choose_cluster`] and [`request_value`]. The hub reads the value back (its
//! failover module); `lifeboatctl reset` reads the binding and writes the annotation
//! (`cli/src/reset.rs`).

use crate::binding::ResourceBinding;
use k8s_openapi::jiff::Timestamp;

/// Why a manual reset cannot be asked of this binding's placement.
#[derive(Debug, thiserror::Error)]
pub enum ManualResetError {
    #[error(
        "ResourceBinding {binding} is not placed on any cluster (spec.clusters is empty): nothing to reset"
    )]
    NotPlaced { binding: String },
    #[error(
        "ResourceBinding {binding} is placed on {} clusters ({}): name one with --cluster",
        choices.len(),
        choices.join(", ")
    )]
    WhichCluster {
        binding: String,
        choices: Vec<String>,
    },
    #[error(
        "--cluster {cluster}: ResourceBinding {binding} is not placed there (spec.clusters: {})",
        choices.join(", ")
    )]
    NotPlacedThere {
        binding: String,
        cluster: String,
        choices: Vec<String>,
    },
}

/// The cluster to reset in: `asked` if the binding is placed there, else its only placement.
pub fn choose_cluster(
    binding: &ResourceBinding,
    asked: Option<&str>,
) -> Result<String, ManualResetError> {
    let (namespace, name) = binding.key();
    let label = format!("{namespace}/{name}");
    let choices: Vec<String> = binding
        .spec
        .clusters
        .iter()
        .map(|c| c.name.clone())
        .collect();
    match (asked, choices.as_slice()) {
        (_, []) => Err(ManualResetError::NotPlaced { binding: label }),
        (Some(cluster), _) if choices.iter().any(|c| c == cluster) => Ok(cluster.to_string()),
        (Some(cluster), _) => Err(ManualResetError::NotPlacedThere {
            binding: label,
            cluster: cluster.to_string(),
            choices,
        }),
        (None, [only]) => Ok(only.clone()),
        (None, _) => Err(ManualResetError::WhichCluster {
            binding: label,
            choices,
        }),
    }
}

/// The annotation's value: the cluster, the time and a random part (`member-1/1900000000123456-9f3a0c1e`).
pub fn request_value(cluster: &str, now: Timestamp, random: [u8; 4]) -> String {
    let nonce: String = random.iter().map(|b| format!("{b:02x}")).collect();
    format!("{cluster}/{}-{nonce}", now.as_microsecond())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn placed_on(clusters: &[&str]) -> ResourceBinding {
        let clusters: Vec<_> = clusters.iter().map(|c| json!({"name": c})).collect();
        serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "train-pytorchjob", "namespace": "ml"},
            "spec": {"resource": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train"},
                     "clusters": clusters}
        }))
        .unwrap()
    }

    #[test]
    fn the_single_placement_is_chosen_or_the_one_named() {
        assert_eq!(choose_cluster(&placed_on(&["m1"]), None).unwrap(), "m1");
        assert_eq!(
            choose_cluster(&placed_on(&["m1", "m2"]), Some("m2")).unwrap(),
            "m2"
        );
    }

    #[test]
    fn a_choice_that_cannot_be_made_names_the_choices() {
        let err = choose_cluster(&placed_on(&["m1", "m2"]), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ResourceBinding ml/train-pytorchjob is placed on 2 clusters (m1, m2): name one with --cluster"
        );
        let err = choose_cluster(&placed_on(&["m1", "m2"]), Some("m3")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--cluster m3: ResourceBinding ml/train-pytorchjob is not placed there (spec.clusters: m1, m2)"
        );
        let err = choose_cluster(&placed_on(&[]), Some("m1")).unwrap_err();
        assert!(matches!(err, ManualResetError::NotPlaced { .. }), "{err}");
    }

    #[test]
    fn request_values_name_the_cluster_and_differ() {
        let now = Timestamp::from_microsecond(1_900_000_000_123_456).unwrap();
        let a = request_value("m1", now, [0x9f, 0x3a, 0x0c, 0x1e]);
        assert_eq!(a, "m1/1900000000123456-9f3a0c1e");
        assert_eq!(
            a.split('/').next(),
            Some("m1"),
            "the hub reads the cluster before '/'"
        );
        assert_ne!(a, request_value("m1", now, [0, 0, 0, 1]));
    }
}
