//! Installing (or checking) the AppWrapper CRD at start.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use lifeboat_api::appwrapper::crd::crd;

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("applying the AppWrapper CRD: {0}")]
    Apply(#[source] kube::Error),
    #[error("the AppWrapper CRD did not become Established within {0:?}")]
    NotEstablished(Duration),
}

/// Creates or updates the AppWrapper CRD (server-side apply) and waits until it is Established.
pub async fn ensure_crd(client: &kube::Client) -> Result<(), InstallError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply("lifeboat-agent").force(),
        &Patch::Apply(&crd),
    )
    .await
    .map_err(InstallError::Apply)?;
    let timeout = Duration::from_secs(30);
    tokio::time::timeout(
        timeout,
        await_condition(api, &name, conditions::is_crd_established()),
    )
    .await
    .map_err(|_| InstallError::NotEstablished(timeout))?
    .map_err(|_| InstallError::NotEstablished(timeout))?;
    Ok(())
}
