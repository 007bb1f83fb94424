//! Carrying out a decision: finalizer and status writes (with the resourceVersion they were
//! computed from), component creates and deletes, forceful deletion, Events.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, PropagationPolicy,
};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use lifeboat_api::appwrapper::constants::{APPWRAPPER_LABEL, FINALIZER};
use lifeboat_api::appwrapper::inject::{CreateContext, prepare_component};
use lifeboat_api::appwrapper::{AppWrapper, AppWrapperStatus};
use serde_json::json;

use super::{Context, Error};
use crate::index::AwKey;
use crate::machine::{Actions, CreateResult, EventNote, EventType as NoteType};

/// Writes to the AppWrapper, each conditional on the resourceVersion of the previous one.
pub struct Writer<'a> {
    aw: &'a AppWrapper,
    ctx: &'a Context,
    resource_version: Option<String>,
    finalizers: Vec<String>,
}

impl<'a> Writer<'a> {
    pub fn new(aw: &'a AppWrapper, ctx: &'a Context) -> Self {
        Self {
            aw,
            ctx,
            resource_version: aw.resource_version(),
            finalizers: aw.finalizers().to_vec(),
        }
    }

    /// A write succeeded: the cached copy this reconcile read is now stale.
    fn wrote(&self) {
        let key = AwKey::new(self.aw.namespace().unwrap_or_default(), self.aw.name_any());
        self.ctx
            .written
            .wrote(&key, self.aw.meta().resource_version.as_deref());
    }

    fn api(&self) -> Api<AppWrapper> {
        Api::namespaced(
            self.ctx.client.clone(),
            &self.aw.namespace().unwrap_or_default(),
        )
    }

    async fn patch_metadata(&mut self, finalizers: Vec<String>) -> Result<(), Error> {
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": self.resource_version}});
        let api = self.api();
        let name = self.aw.name_any();
        let updated = self
            .ctx
            .timed(
                "finalizer",
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await
            .map_err(|e| Error::kube("update finalizers", e))?;
        self.wrote();
        self.resource_version = updated.resource_version();
        self.finalizers = finalizers;
        Ok(())
    }

    pub async fn add_finalizer(&mut self) -> Result<(), Error> {
        if self.finalizers.iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let mut finalizers = self.finalizers.clone();
        finalizers.push(FINALIZER.to_string());
        self.patch_metadata(finalizers).await
    }

    pub async fn remove_finalizer(&mut self) -> Result<(), Error> {
        let finalizers: Vec<String> = self
            .finalizers
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        if finalizers.len() == self.finalizers.len() {
            return Ok(());
        }
        match self.patch_metadata(finalizers).await {
            // Already gone: nothing left to release.
            Err(Error::Kube(e)) if e.code() == Some(404) => Ok(()),
            other => other,
        }
    }

    /// Writes the status if it changed (JSON merge patch on the status subresource).
    pub async fn write_status(
        &mut self,
        old: &AppWrapperStatus,
        new: &AppWrapperStatus,
    ) -> Result<(), Error> {
        if old == new {
            return Ok(());
        }
        let status = serde_json::to_value(new).map_err(|source| Error::Serialization {
            what: "status",
            source,
        })?;
        let patch =
            json!({"metadata": {"resourceVersion": self.resource_version}, "status": status});
        let api = self.api();
        let name = self.aw.name_any();
        let updated = self
            .ctx
            .timed(
                "status",
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await
            .map_err(|e| Error::kube("write status", e))?;
        self.wrote();
        self.resource_version = updated.resource_version();
        Ok(())
    }
}

/// Creates the given components (idempotent: an object that already exists under this
/// AppWrapper's control counts as created).
pub async fn create_components(
    aw: &AppWrapper,
    status: &AppWrapperStatus,
    indexes: &[usize],
    ctx: &Context,
) -> Vec<Option<CreateResult>> {
    let mut results = vec![None; status.component_status.len()];
    for &i in indexes {
        results[i] = Some(create_component(aw, status, i, ctx).await);
    }
    results
}

async fn create_component(
    aw: &AppWrapper,
    status: &AppWrapperStatus,
    i: usize,
    ctx: &Context,
) -> CreateResult {
    let namespace = aw.namespace().unwrap_or_default();
    let name = aw.name_any();
    let (Some(component), Some(cs)) = (aw.spec.components.get(i), status.component_status.get(i))
    else {
        return CreateResult::Fatal(format!("spec.components[{i}] does not exist"));
    };
    let create_ctx = CreateContext {
        appwrapper_name: &name,
        appwrapper_namespace: &namespace,
        scheduler_name: Some(ctx.config.scheduler_name.as_str()).filter(|s| !s.is_empty()),
        autopilot: ctx.config.autopilot.as_ref(),
        owner: aw.controller_owner_ref(&()),
    };
    let prepared = match prepare_component(
        &component.template,
        &cs.pod_sets,
        &component.pod_set_infos,
        &create_ctx,
    ) {
        Ok(p) => p,
        Err(e) => return CreateResult::Fatal(e.to_string()),
    };
    for warning in &prepared.warnings {
        tracing::warn!(component = i, "{warning}");
    }
    let mut object: DynamicObject = match serde_json::from_value(prepared.object) {
        Ok(o) => o,
        Err(e) => return CreateResult::Fatal(format!("spec.components[{i}].template: {e}")),
    };
    // The name recorded in the status before this create (generateName resolved there).
    if !cs.name.is_empty() {
        object.metadata.name = Some(cs.name.clone());
        object.metadata.generate_name = None;
    }
    let (resource, _) = match ctx.components.kind(&cs.api_version, &cs.kind).await {
        Ok(found) => found,
        Err(e) if e.not_found => return CreateResult::Fatal(e.to_string()),
        Err(e) => return CreateResult::Retryable(e.to_string()),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, &resource);
    let err = match ctx
        .timed("create", api.create(&PostParams::default(), &object))
        .await
    {
        Ok(created) => {
            return CreateResult::Created {
                name: created.name_any(),
            };
        }
        Err(e) => e,
    };
    match classify_create_error(&err) {
        CreateFailure::AlreadyExists => {
            // Created before a crash, or by someone else: only ours counts as created.
            match api.get(&object.name_any()).await {
                Ok(existing) => {
                    let ours = existing.owner_references().iter().any(|o| {
                        o.controller == Some(true) && o.uid == aw.uid().unwrap_or_default()
                    });
                    if ours {
                        CreateResult::Created {
                            name: existing.name_any(),
                        }
                    } else {
                        CreateResult::Fatal(format!(
                            "resource {} {} exists, but is not controlled by appwrapper {name}",
                            cs.kind,
                            existing.name_any()
                        ))
                    }
                }
                Err(e) => CreateResult::Retryable(e.to_string()),
            }
        }
        CreateFailure::Fatal(message) => CreateResult::Fatal(message),
        CreateFailure::Retryable(message) => CreateResult::Retryable(message),
    }
}

/// What a failed component create means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateFailure {
    /// An object of that name exists: whether it counts as created depends on its controller.
    AlreadyExists,
    /// Retrying cannot help: the template is invalid or the kind is gone.
    Fatal(String),
    /// May succeed later: conflicts, quota, throttling, API server or network trouble.
    Retryable(String),
}

/// Classifies the error of a component create. Invalid (422) and BadRequest (400): the template
/// itself is wrong; NotFound (404): the kind (or the namespace) is gone. Every other answer,
/// including Forbidden (RBAC may be fixed) and a 409 that is not AlreadyExists, is retried.
pub fn classify_create_error(error: &kube::Error) -> CreateFailure {
    match error {
        kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists" => {
            CreateFailure::AlreadyExists
        }
        kube::Error::Api(s) => {
            let message = if s.message.is_empty() {
                format!("{} ({})", s.reason, s.code)
            } else {
                s.message.clone()
            };
            if matches!(s.code, 400 | 404 | 422) {
                CreateFailure::Fatal(message)
            } else {
                CreateFailure::Retryable(message)
            }
        }
        other => CreateFailure::Retryable(other.to_string()),
    }
}

/// Background deletes, and the forceful deletes after the grace.
pub async fn deletions(
    aw: &AppWrapper,
    status: &AppWrapperStatus,
    actions: &Actions,
    key: &AwKey,
    ctx: &Context,
) -> Result<(), Error> {
    let background = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    let forceful = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for (indexes, params) in [
        (&actions.delete, &background),
        (&actions.force_delete, &forceful),
    ] {
        for &i in indexes {
            let Some(cs) = status.component_status.get(i) else {
                continue;
            };
            let Ok((resource, _)) = ctx.components.kind(&cs.api_version, &cs.kind).await else {
                continue;
            };
            let api: Api<DynamicObject> = Api::namespaced_with(
                ctx.client.clone(),
                &aw.namespace().unwrap_or_default(),
                &resource,
            );
            match ctx.timed("delete", api.delete(&cs.name, params)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete {} {}", cs.kind, cs.name), e)),
            }
        }
    }
    if actions.force_delete_pods {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.namespace);
        let selector = format!("{APPWRAPPER_LABEL}={}", key.name);
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| Error::kube("list pods for forceful deletion", e))?;
        for pod in list.items {
            match pods.delete(&pod.name_any(), &forceful).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(Error::kube(
                        format!("force delete pod {}", pod.name_any()),
                        e,
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Records the decision's Events on the AppWrapper (best effort: a lost Event is logged).
pub async fn publish_events(aw: &AppWrapper, events: &[EventNote], ctx: &Context) {
    if events.is_empty() {
        return;
    }
    let reference: ObjectReference = aw.object_ref(&());
    for note in events {
        let event = Event {
            type_: match note.type_ {
                NoteType::Normal => EventType::Normal,
                NoteType::Warning => EventType::Warning,
            },
            reason: note.reason.clone(),
            note: Some(truncate(&note.note, 1024)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = ctx
            .timed("event", ctx.recorder.publish(&event, &reference))
            .await
        {
            tracing::warn!(reason = %note.reason, error = %e, "could not record an Event");
        }
    }
}

pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests;
