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
}
