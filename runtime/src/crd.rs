//! Installing a CustomResourceDefinition the way a controller should at start: create it, or
//! update it by server-side apply only when what is stored differs (so restarts of many replicas
//! do not rewrite it), then wait until the apiserver serves it (Established).

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};

/// A sensible wait for a CRD to become Established.
pub const ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);

/// What [`ensure`] had to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdInstall {
    /// The CRD was absent and has been created.
    Created,
    /// The stored CRD differed from the desired one and has been updated.
    Updated,
    /// The stored CRD was already the desired one.
    Unchanged,
}

/// Why the CRD could not be installed. Each variant names the step and the CRD.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("reading CustomResourceDefinition {name}: {source}")]
    Read {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating CustomResourceDefinition {name}: {source}")]
    Create {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("comparing CustomResourceDefinition {name} (server-side apply dry run): {source}")]
    Compare {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "updating CustomResourceDefinition {name} (server-side apply as {field_manager}): {source}"
    )]
    Update {
        name: String,
        field_manager: String,
        #[source]
        source: kube::Error,
    },
    #[error("CustomResourceDefinition {name} is not Established after {timeout:?}")]
    NotEstablished { name: String, timeout: Duration },
    #[error("waiting for CustomResourceDefinition {name} to become Established: {source}")]
    Wait {
        name: String,
        #[source]
        source: kube::runtime::wait::Error,
    },
    #[error("a CustomResourceDefinition to install has no metadata.name")]
    Unnamed,
}

/// Creates the CRD, or updates it by server-side apply as `field_manager` when what is stored
/// differs from it, then waits until it is Established (at most `timeout`).
pub async fn ensure(
    client: &kube::Client,
    desired: &CustomResourceDefinition,
    field_manager: &str,
    timeout: Duration,
) -> Result<CrdInstall, InstallError> {
    let name = desired.metadata.name.clone().ok_or(InstallError::Unnamed)?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let current = api
        .get_opt(&name)
        .await
        .map_err(|source| InstallError::Read {
            name: name.clone(),
            source,
        })?;
    let outcome = match current {
        None => {
            let params = PostParams {
                field_manager: Some(field_manager.into()),
                ..Default::default()
            };
            match api.create(&params, desired).await {
                Ok(_) => CrdInstall::Created,
                // Another replica won the race; it created the same CRD.
                Err(kube::Error::Api(status)) if status.code == 409 => CrdInstall::Unchanged,
                Err(source) => {
                    return Err(InstallError::Create {
                        name: name.clone(),
                        source,
                    });
                }
            }
        }
        Some(current) => {
            // The apiserver defaults fields we do not set, so compare against what an apply
            // would store (a dry run) rather than against our own object.
            let apply = PatchParams::apply(field_manager).force();
            let would_store = api
                .patch(&name, &apply.clone().dry_run(), &Patch::Apply(desired))
                .await
                .map_err(|source| InstallError::Compare {
                    name: name.clone(),
                    source,
                })?;
            if differs(&current, &would_store) {
                api.patch(&name, &apply, &Patch::Apply(desired))
                    .await
                    .map_err(|source| InstallError::Update {
                        name: name.clone(),
                        field_manager: field_manager.to_string(),
                        source,
                    })?;
                CrdInstall::Updated
            } else {
                CrdInstall::Unchanged
            }
        }
    };
    let established = await_condition(api, &name, conditions::is_crd_established());
    match tokio::time::timeout(timeout, established).await {
        Ok(Ok(_)) => Ok(outcome),
        Ok(Err(source)) => Err(InstallError::Wait { name, source }),
        Err(_) => Err(InstallError::NotEstablished { name, timeout }),
    }
}

/// Whether the stored CRD differs from what applying ours would store: its spec, or the labels
/// and annotations we set.
fn differs(current: &CustomResourceDefinition, would_store: &CustomResourceDefinition) -> bool {
    current.spec != would_store.spec
        || current.metadata.labels != would_store.metadata.labels
        || current.metadata.annotations != would_store.metadata.annotations
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionSpec;

    fn crd(short: &str) -> CustomResourceDefinition {
        CustomResourceDefinition {
            metadata: kube::api::ObjectMeta {
                name: Some("widgets.example.com".into()),
                ..Default::default()
            },
            spec: CustomResourceDefinitionSpec {
                group: "example.com".into(),
                names: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionNames {
                    kind: "Widget".into(),
                    plural: "widgets".into(),
                    short_names: Some(vec![short.into()]),
                    ..Default::default()
                },
                scope: "Namespaced".into(),
                ..Default::default()
            },
            status: None,
        }
    }

    #[test]
    fn identical_crds_do_not_differ_and_any_spec_change_does() {
        let ours = crd("w");
        assert!(!differs(&ours, &ours.clone()));
        assert!(differs(&crd("other"), &ours));
        let mut relabelled = ours.clone();
        relabelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert("x".into(), "y".into());
        assert!(differs(&relabelled, &ours));
    }
}
