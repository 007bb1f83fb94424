//! The template's own status on the hub, from its members (the kind's AggregateStatus rule), so
//! `kubectl get appwrapper` on the hub shows the real phase. Written by server-side apply on the
//! status subresource, only when it changes.

use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use lifeboat_api::binding::{AggregatedStatusItem, ResourceBinding};
use lifeboat_interpreter::results::AggregatedStatusItem as InterpreterItem;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::binding::binder::{Caches, template_key_of};
use crate::interpreters::InterpreterHandle;
use crate::status::processor::FIELD_MANAGER;

#[derive(Debug, thiserror::Error)]
pub enum TemplateStatusError {
    #[error("AggregateStatus: {0}")]
    Interpret(String),
    #[error("writing the template status: {0}")]
    Kube(#[from] kube::Error),
    #[error("serializing the template: {0}")]
    Serialization(#[from] serde_json::Error),
}

/// The items as the AggregateStatus rule receives them (Karmada's `statusItems`).
pub fn interpreter_items(items: &[AggregatedStatusItem]) -> Vec<InterpreterItem> {
    items
        .iter()
        .map(|i| InterpreterItem {
            cluster_name: i.cluster_name.clone(),
            status: i.status.clone(),
            applied: i.applied,
            applied_message: i.applied_message.clone().unwrap_or_default(),
            health: i.health.as_str().to_string(),
        })
        .collect()
}

/// The status the template should have, or `None` when its kind has no AggregateStatus rule
/// or the rule leaves the status as it is.
pub fn aggregated_status(
    interpreters: &crate::interpreters::Interpreters,
    template: &Value,
    items: &[AggregatedStatusItem],
) -> Result<Option<Value>, TemplateStatusError> {
    let items = interpreter_items(items);
    let aggregated = interpreters
        .aggregate_status(template, Some(&items))
        .map_err(|e| TemplateStatusError::Interpret(e.to_string()))?;
    Ok(aggregated.and_then(|object| {
        let status = object.get("status").cloned().unwrap_or(Value::Null);
        (template.get("status") != Some(&status) && !status.is_null()).then_some(status)
    }))
}

/// Aggregates the template status of each binding as its watch delivers it (so the items are
/// the ones the binding now has, not a cache that may lag behind a write).
pub async fn run(
    client: kube::Client,
    caches: Caches,
    interpreters: InterpreterHandle,
    mut bindings: mpsc::UnboundedReceiver<Arc<ResourceBinding>>,
) {
    while let Some(binding) = bindings.recv().await {
        if let Err(e) = aggregate_one(&client, &caches, &interpreters, &binding).await {
            let (namespace, name) = binding.key();
            tracing::warn!(binding = %format!("{namespace}/{name}"), error = %e, "aggregating the template status failed");
        }
    }
}

async fn aggregate_one(
    client: &kube::Client,
    caches: &Caches,
    interpreters: &InterpreterHandle,
    binding: &Arc<ResourceBinding>,
) -> Result<(), TemplateStatusError> {
    let Some(key) = template_key_of(binding) else {
        return Ok(());
    };
    let Some(template) = caches.templates.get(&key) else {
        return Ok(());
    };
    let items = binding
        .status
        .as_ref()
        .map(|s| s.aggregated_status.clone())
        .unwrap_or_default();
    let template_json = serde_json::to_value(&*template)?;
    let Some(status) = aggregated_status(&interpreters.current(), &template_json, &items)? else {
        return Ok(());
    };
    let Some(api) = caches.templates.api(client, key.kind, &key.namespace) else {
        return Ok(());
    };
    let patch = serde_json::json!({
        "apiVersion": template_json.get("apiVersion"),
        "kind": template_json.get("kind"),
        "metadata": {"name": key.name, "namespace": key.namespace},
        "status": status,
    });
    api.patch_status(
        &key.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreters::Interpreters;
    use lifeboat_api::binding::ResourceHealth;
    use lifeboat_interpreter::{Runtime, RuntimeConfig};
    use lifeboat_runtime::mock::{ApiServer, Method};
    use serde_json::json;

    #[test]
    fn the_hub_appwrapper_shows_the_members_phase() {
        let builtin =
            Interpreters::builtin(Arc::new(Runtime::new(RuntimeConfig::default()))).unwrap();
        let (interpreters, _) = Interpreters::layered(builtin, &[]);
        let template = json!({
            "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"components": []}
        });
        let item = AggregatedStatusItem {
            cluster_name: "member-2".into(),
            applied: true,
            health: ResourceHealth::Healthy,
            status: Some(json!({"phase": "Running", "resettingCount": 1, "conditions": []})),
            ..Default::default()
        };
        let status = aggregated_status(&interpreters, &template, &[item])
            .unwrap()
            .unwrap();
        assert_eq!(status["phase"], "Running");
        assert_eq!(status["resettingCount"], 1);
        // once the template carries it, there is nothing to write
        let mut with_status = template.clone();
        with_status["status"] = status.clone();
        let item = AggregatedStatusItem {
            cluster_name: "member-2".into(),
            applied: true,
            health: ResourceHealth::Healthy,
            status: Some(json!({"phase": "Running", "resettingCount": 1, "conditions": []})),
            ..Default::default()
        };
        assert_eq!(
            aggregated_status(&interpreters, &with_status, &[item]).unwrap(),
            None
        );
    }

    /// An AppWrapper template `ml/train` held as its watch would, and its binding with one
    /// Healthy item whose member shows `Running`.
    fn held_template() -> (Caches, InterpreterHandle, Arc<ResourceBinding>) {
        use crate::binding::detector::TEMPLATE_KINDS;
        use crate::binding::templates::Templates;
        use kube::runtime::reflector::store;

        let kind = TEMPLATE_KINDS
            .iter()
            .find(|k| k.kind == "AppWrapper")
            .unwrap();
        let template: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": "train", "namespace": "ml", "uid": "template-uid"},
            "spec": {"components": []}
        }))
        .unwrap();
        let caches = Caches {
            templates: Arc::new(Templates::holding(kind, vec![template])),
            policies: store().0,
            cluster_policies: store().0,
            bindings: store().0,
            clusters: store().0,
        };
        let builtin =
            Interpreters::builtin(Arc::new(Runtime::new(RuntimeConfig::default()))).unwrap();
        let interpreters = InterpreterHandle::new(Interpreters::layered(builtin, &[]).0);
        let binding: ResourceBinding = serde_json::from_value(json!({
            "apiVersion": "work.lifeboat.dev/v1alpha1", "kind": "ResourceBinding",
            "metadata": {"name": "train-appwrapper", "namespace": "ml"},
            "spec": {"resource": {"apiVersion": "workload.codeflare.dev/v1beta2",
                "kind": "AppWrapper", "namespace": "ml", "name": "train"},
                "clusters": [{"name": "member-2"}]},
            "status": {"aggregatedStatus": [{"clusterName": "member-2", "applied": true,
                "health": "Healthy", "status": {"phase": "Running", "conditions": []}}]}
        }))
        .unwrap();
        (caches, interpreters, Arc::new(binding))
    }

    const TEMPLATE_STATUS_PATH: &str =
        "/apis/workload.codeflare.dev/v1beta2/namespaces/ml/appwrappers/train/status";

    /// The template status write's exact request, against a mock client: the aggregated
    /// status by server-side apply on the template's status subresource, field manager
    /// `lifeboat-hub/status`, forced.
    #[tokio::test]
    async fn the_template_status_is_applied_forced_on_its_status_subresource() {
        let (caches, interpreters, binding) = held_template();
        let (client, mut server) = ApiServer::new();
        let write = aggregate_one(&client, &caches, &interpreters, &binding);
        let answer = async {
            let call = server
                .next()
                .await
                .expect(Method::PATCH, TEMPLATE_STATUS_PATH);
            assert_eq!(
                call.uri.split_once('?').map(|(_, q)| q),
                Some("&force=true&fieldManager=lifeboat-hub%2Fstatus")
            );
            assert_eq!(
                call.content_type.as_deref(),
                Some("application/apply-patch+yaml")
            );
            let body = call.body.clone();
            assert_eq!(
                (&body["apiVersion"], &body["kind"], &body["metadata"]),
                (
                    &json!("workload.codeflare.dev/v1beta2"),
                    &json!("AppWrapper"),
                    &json!({"name": "train", "namespace": "ml"})
                )
            );
            assert!(
                body.get("spec").is_none(),
                "the status write carries no spec"
            );
            assert_eq!(body["status"]["phase"], "Running");
            call.reply(200, body);
        };
        let (written, ()) = tokio::join!(write, answer);
        written.expect("the template status is written");
    }

    #[tokio::test]
    async fn a_conflict_on_the_template_status_write_is_an_api_error() {
        let (caches, interpreters, binding) = held_template();
        let (client, mut server) = ApiServer::new();
        let write = aggregate_one(&client, &caches, &interpreters, &binding);
        let answer = async {
            let call = server
                .next()
                .await
                .expect(Method::PATCH, TEMPLATE_STATUS_PATH);
            call.fail(409, "Conflict", "the object has been modified");
        };
        let (written, ()) = tokio::join!(write, answer);
        let error = written.expect_err("a conflict fails the write");
        assert!(
            matches!(&error, TemplateStatusError::Kube(kube::Error::Api(s)) if s.code == 409),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .starts_with("writing the template status: "),
            "{error}"
        );
    }
}
