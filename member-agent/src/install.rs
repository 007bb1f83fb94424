//! Installing (or repairing) the AppWrapper CRD at start, before the webhook and controller need
//! it; the mechanics are `lifeboat_runtime::crd`'s, shared with the hub.

use std::time::Duration;

use lifeboat_api::appwrapper::crd::crd;
pub use lifeboat_runtime::crd::{CrdInstall, ESTABLISHED_TIMEOUT, InstallError};

/// The field manager of everything the agent applies to its own cluster's API.
pub const FIELD_MANAGER: &str = "lifeboat-agent";

/// Installs or updates the AppWrapper CRD and waits until it is served.
pub async fn ensure_crd(client: &kube::Client) -> Result<CrdInstall, InstallError> {
    ensure_crd_within(client, ESTABLISHED_TIMEOUT).await
}

/// [`ensure_crd`] with a custom wait.
pub async fn ensure_crd_within(
    client: &kube::Client,
    timeout: Duration,
) -> Result<CrdInstall, InstallError> {
    lifeboat_runtime::crd::ensure(client, &crd(), FIELD_MANAGER, timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_crd_is_named_for_the_appwrapper_api() {
        assert_eq!(
            crd().metadata.name.as_deref(),
            Some("appwrappers.workload.codeflare.dev")
        );
    }
}
