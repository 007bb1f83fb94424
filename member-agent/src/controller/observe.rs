//! Building the state machine's [`Observation`] from the indexes. A verdict that depends on an
//! absence (a component is missing, deletion is complete) is confirmed with a read from the API
//! server first: the upstream controller failed healthy workloads after a restart because its
//! cache had not seen them yet (appwrapper#416).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams};
use lifeboat_api::appwrapper::constants::{APPWRAPPER_LABEL, condition_types as ct, reasons as r};
use lifeboat_api::appwrapper::{
    AppWrapper, AppWrapperComponentStatus, AppWrapperPhase as Phase, AppWrapperStatus,
};

use super::{Context, Error};
use crate::index::{AwKey, ComponentIndex, ComponentInfo};
use crate::machine::{ComponentObservation, Observation};
use crate::params::Params;
use crate::pods;

/// Phases (or deletion) in which the machine deletes resources and needs exact answers.
fn deleting_phase(aw: &AppWrapper, status: &AppWrapperStatus) -> bool {
    aw.metadata.deletion_timestamp.is_some()
        || matches!(
            status.phase,
            Phase::Resetting | Phase::Suspending | Phase::Failed | Phase::Succeeded
        )
}

pub async fn observe(
    aw: &AppWrapper,
    status: &AppWrapperStatus,
    key: &AwKey,
    params: &Params,
    ctx: &Context,
) -> Result<Observation, Error> {
    let needs_components = aw.metadata.deletion_timestamp.is_some()
        || matches!(
            status.phase,
            Phase::Running
                | Phase::Resetting
                | Phase::Suspending
                | Phase::Failed
                | Phase::Succeeded
        );
    // Once a reset has deleted everything (ResourcesDeployed False) it only waits out its
    // pause: nothing reads the pods until it resumes, so an empty cache needs no confirming list.
    let reset_done = status.phase == Phase::Resetting
        && !status
            .conditions
            .iter()
            .any(|c| c.type_ == ct::RESOURCES_DEPLOYED && c.status == "True");
    let exact =
        aw.metadata.deletion_timestamp.is_some() || (deleting_phase(aw, status) && !reset_done);
    let mut pod_list = {
        let index = ctx.pods.read().unwrap_or_else(|e| e.into_inner());
        index.is_synced().then(|| index.pods_of(key))
    };
    // Deletion completes only when every labelled pod is gone: never trust an empty cache.
    if pod_list.as_ref().is_none_or(|p| p.is_empty() && exact) {
        pod_list = Some(list_pods(key, ctx).await?);
    }
    let pod_list = pod_list.unwrap_or_default();
    let summary = {
        let nodes = ctx.nodes.read().unwrap_or_else(|e| e.into_inner());
        pods::summarize(&pod_list, &nodes, params, ctx.monitor_nodes())
    };
    let mut components = Vec::with_capacity(status.component_status.len());
    if needs_components {
        for cs in &status.component_status {
            components.push(component(cs, &key.namespace, ctx).await?);
        }
    }
    Ok(Observation {
        components,
        pods: summary,
        create_results: None,
    })
}

async fn list_pods(key: &AwKey, ctx: &Context) -> Result<Vec<Pod>, Error> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let selector = format!("{APPWRAPPER_LABEL}={}", key.name);
    ctx.timed(
        "list_pods",
        api.list(&ListParams::default().labels(&selector)),
    )
    .await
    .map(|l| l.items)
    .map_err(|e| Error::kube(format!("list pods of {}", key.name), e))
}

fn from_info(info: &ComponentInfo) -> ComponentObservation {
    if info.deleting {
        ComponentObservation::Deleting
    } else if let Some(reason) = &info.failed {
        ComponentObservation::Failed(reason.clone())
    } else {
        ComponentObservation::Present
    }
}

/// Whether the status says the component may exist (created, or creation initiated).
fn may_exist(cs: &AppWrapperComponentStatus) -> bool {
    cs.conditions.iter().any(|c| {
        c.type_ == ct::RESOURCES_DEPLOYED
            && c.reason != r::COMPONENT_DELETED
            && c.reason != r::COMPONENT_CREATION_ERRORED
    })
}

async fn component(
    cs: &AppWrapperComponentStatus,
    namespace: &str,
    ctx: &Context,
) -> Result<ComponentObservation, Error> {
    if cs.name.is_empty() {
        return Ok(ComponentObservation::Absent);
    }
    let (resource, index) = match ctx.components.kind(&cs.api_version, &cs.kind).await {
        Ok(found) => found,
        // The kind is not installed: nothing of it can exist.
        Err(e) if e.not_found => return Ok(ComponentObservation::Absent),
        Err(e) => return Err(Error::Discovery(e)),
    };
    {
        let index = index.read().unwrap_or_else(|e| e.into_inner());
        if let Some(info) = index.get(namespace, &cs.name) {
            return Ok(from_info(info));
        }
        // Known gone and the watch is live: no need to ask again.
        if index.is_synced() && !may_exist(cs) {
            return Ok(ComponentObservation::Absent);
        }
    }
    // Not in the index: confirm with the API server before anyone acts on the absence.
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, &resource);
    match ctx.timed("get_component", api.get_opt(&cs.name)).await {
        Ok(Some(obj)) => {
            let probe = ComponentIndex::new(&cs.api_version, &cs.kind);
            let info = probe.info(&obj);
            tracing::debug!(component = %cs.name, uid = %obj.uid().unwrap_or_default(), "component found by a direct read");
            Ok(from_info(&info))
        }
        Ok(None) => Ok(ComponentObservation::Absent),
        Err(e) => Err(Error::kube(format!("get {} {}", cs.kind, cs.name), e)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::controller::mock::{ApiServer, Method, context};

    /// A Resetting AppWrapper without components whose ResourcesDeployed is `deployed`.
    fn resetting(deployed: &str) -> AppWrapper {
        serde_json::from_value(json!({
            "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": "train", "namespace": "team", "uid": "uid-1", "resourceVersion": "7"},
            "spec": {"components": []},
            "status": {"phase": "Resetting", "conditions": [{"type": "ResourcesDeployed",
                "status": deployed, "reason": "Resetting", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .expect("a valid AppWrapper")
    }

    #[tokio::test]
    async fn a_reset_whose_deletion_is_done_does_not_list_pods_but_one_deleting_does() {
        for (deployed, lists) in [("False", false), ("True", true)] {
            let (client, mut server) = ApiServer::new();
            let ctx = context(client);
            // The pod cache is synced and holds no pod of the AppWrapper.
            ctx.pods
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .reset(Vec::new());
            let aw = resetting(deployed);
            let status = aw.status.clone().unwrap_or_default();
            let key = AwKey::new("team", "train");
            let (params, _) =
                Params::from_annotations(aw.annotations(), &ctx.config.fault_tolerance);
            let observed = observe(&aw, &status, &key, &params, &ctx);
            if lists {
                let answer = async {
                    let call = server
                        .next()
                        .await
                        .expect(Method::GET, "/api/v1/namespaces/team/pods");
                    call.reply(
                        200,
                        json!({"apiVersion": "v1", "kind": "PodList",
                            "metadata": {"resourceVersion": "1"}, "items": []}),
                    );
                };
                let (result, ()) = tokio::join!(observed, answer);
                assert_eq!(result.expect("observed").pods.total, 0);
            } else {
                // Nothing answers: a request would hang until the timeout.
                let result = tokio::time::timeout(std::time::Duration::from_secs(1), observed)
                    .await
                    .expect("no request was sent");
                assert_eq!(result.expect("observed").pods.total, 0);
                drop(ctx);
                assert!(server.is_idle().await);
            }
        }
    }
}
