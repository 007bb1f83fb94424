//! Installs (or repairs) the AppWrapper CustomResourceDefinition in the member cluster, so the
//! agent can run as a plain AppWrapper controller on a cluster nobody prepared for it.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use lifeboat_api::appwrapper::crd::crd;

/// Field manager of everything the agent applies with server-side apply.
pub const FIELD_MANAGER: &str = "lifeboat-agent";

/// How long [`ensure_crd`] waits for the CRD to become Established.
pub const ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);

/// What [`ensure_crd`] had to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdInstall {
    /// The CRD was absent and has been created.
    Created,
    /// The CRD differed from this agent's and has been updated.
    Updated,
    /// The CRD was already the one this agent serves.
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
        "updating CustomResourceDefinition {name} (server-side apply as {FIELD_MANAGER}): {source}"
    )]
    Update {
        name: String,
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
    #[error("the generated AppWrapper CustomResourceDefinition has no metadata.name")]
    Unnamed,
}

/// Creates the AppWrapper CRD when absent, updates it (server-side apply, field manager
/// `lifeboat-agent`) when it differs from this agent's, then waits until it is Established.
pub async fn ensure_crd(client: &kube::Client) -> Result<CrdInstall, InstallError> {
    ensure_crd_within(client, ESTABLISHED_TIMEOUT).await
}

/// [`ensure_crd`] with a chosen wait for Established.
pub async fn ensure_crd_within(
    client: &kube::Client,
    timeout: Duration,
) -> Result<CrdInstall, InstallError> {
    let desired = crd();
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
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            match api.create(&params, &desired).await {
                Ok(_) => CrdInstall::Created,
                // Another agent won the race; it created the same CRD.
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
            let apply = PatchParams::apply(FIELD_MANAGER).force();
            let would_store = api
                .patch(&name, &apply.clone().dry_run(), &Patch::Apply(&desired))
                .await
                .map_err(|source| InstallError::Compare {
                    name: name.clone(),
                    source,
                })?;
            if differs(&current, &would_store) {
                api.patch(&name, &apply, &Patch::Apply(&desired))
                    .await
                    .map_err(|source| InstallError::Update {
                        name: name.clone(),
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

    #[test]
    fn identical_crds_do_not_differ_and_any_spec_change_does() {
        let ours = crd();
        assert!(!differs(&ours, &ours.clone()));
        let mut drifted = ours.clone();
        drifted.spec.names.short_names = Some(vec!["other".into()]);
        assert!(differs(&drifted, &ours));
        let mut relabelled = ours.clone();
        relabelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert("x".into(), "y".into());
        assert!(differs(&relabelled, &ours));
    }

    #[test]
    fn the_generated_crd_is_named_for_the_appwrapper_api() {
        assert_eq!(
            crd().metadata.name.as_deref(),
            Some("appwrappers.workload.codeflare.dev")
        );
    }
}
