//! ResourceInterpreterCustomizations on the real hub (`lifeboat_hub::process::run` with its
//! admission webhook, as the binary runs it) and an agent in hub mode, on the local fleet (hub +
//! 1 member):
//!
//! - the hub registers its webhook at start, and a customization whose Lua does not compile is
//!   refused at the hub's apiserver (kubectl apply), naming the script's field and the line; an
//!   update to a broken script is refused and the stored customization keeps its script;
//! - a customization whose InterpretHealth raises, applied to a placed, Healthy AppWrapper's
//!   kind, makes the binding's `Healthy` condition name the customization and the error
//!   (reason `InterpreterError`) without the object changing in its member, and posts a Warning
//!   Event `InterpreterError` on the binding naming them. Removing the customization brings the
//!   binding back to Healthy, again without a report of a changed object.

mod support;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use lifeboat_api::binding::ResourceBinding;
use lifeboat_api::config::ResourceInterpreterCustomization;
use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use lifeboat_e2e::wait;
use lifeboat_hub::admission::{FailurePolicy, WebhookOptions};
use lifeboat_runtime::webhook::ClientConfigTarget;
use serde_json::{Value, json};
use support::T;
use support::hub::{
    CA_SECRET, appwrapper_resource, bootstrap, start_agent, start_hub_with, tempfile_dir,
    until_clusters_ready,
};

fn main() -> ExitCode {
    harness::run(
        "customizations",
        |c| {
            c.members = 1;
            c.nodes_per_member = 1;
            c.gpus_per_node = 8;
        },
        // One test: both parts share the one hub this process may run.
        vec![E2eTest::new(
            "customizations_are_checked_at_admission_and_their_runtime_errors_reach_the_binding",
            customizations,
        )],
    )
}

const HEALTH_FIELD: &str = "spec.customizations.healthInterpretation.luaScript";

fn customization(name: &str, api_version: &str, kind: &str, health: &str) -> Value {
    json!({
        "apiVersion": "config.lifeboat.dev/v1alpha1",
        "kind": "ResourceInterpreterCustomization",
        "metadata": {"name": name},
        "spec": {
            "target": {"apiVersion": api_version, "kind": kind},
            "customizations": {"healthInterpretation": {"luaScript": health}}
        }
    })
}

async fn kubectl_apply(
    ctx: &TestContext,
    manifest: &Value,
) -> Result<Result<String, String>, TestError> {
    let kubeconfig = ctx.fleet.kubeconfig("hub")?;
    lifeboat_e2e::kubectl::run(
        &kubeconfig,
        None,
        &["apply", "-f", "-"],
        Some(manifest.to_string()),
    )
    .await
}

async fn customizations(ctx: Arc<TestContext>) -> TestResult {
    let dir = tempfile_dir(&ctx.namespace)?;
    let hub = ctx.client("hub").await?;
    lifeboat_agent::install::ensure_crd(&hub).await?;
    let webhook_port = lifeboat_e2e::ports::free_port()?;
    let hub_url = start_hub_with(&ctx, |o| {
        o.webhook = Some(WebhookOptions {
            bind: ([127, 0, 0, 1], webhook_port).into(),
            target: ClientConfigTarget::Url {
                host: "127.0.0.1".into(),
                port: None,
            },
            failure_policy: FailurePolicy::Ignore,
            ca_secret: CA_SECRET.into(),
            configuration: lifeboat_hub::admission::CONFIGURATION.into(),
        });
    })
    .await?;
    refused_at_admission(&ctx).await?;
    runtime_errors_reach_the_binding(&ctx, &hub, &hub_url, &dir).await
}

/// Part 1: the webhook the hub registered refuses scripts that do not compile.
async fn refused_at_admission(ctx: &TestContext) -> TestResult {
    let broken = customization(
        "widgets-broken",
        "example.com/v1",
        "Widget",
        "function InterpretHealth(obj)\n  local healthy = obj.status.ready\n  return healthy ==\nend",
    );
    // The hub registers its webhook in the background after it starts: wait until it answers.
    let refusal = wait::until(
        "the hub's webhook refuses a script that does not compile",
        T,
        || async {
            match kubectl_apply(ctx, &broken)
                .await
                .map_err(|e| e.to_string())?
            {
                // kubectl shows the webhook's causes as it shows a schema error: the field, why.
                Err(stderr) if stderr.contains(HEALTH_FIELD) => Ok(stderr),
                Err(stderr) => Err(format!("refused, not by the webhook yet: {stderr}")),
                Ok(_) => {
                    // Admitted before the webhook was live: remove it and try again.
                    let kubeconfig = ctx.fleet.kubeconfig("hub").map_err(|e| e.to_string())?;
                    let _ = lifeboat_e2e::kubectl::run(
                        &kubeconfig,
                        None,
                        &[
                            "delete",
                            "resourceinterpretercustomization",
                            "widgets-broken",
                            "--ignore-not-found",
                        ],
                        None,
                    )
                    .await;
                    Err("admitted: the webhook is not registered yet".into())
                }
            }
        },
    )
    .await?;
    for expected in [
        "resourceinterpretercustomizations \"widgets-broken\" is invalid",
        HEALTH_FIELD,
        "does not compile",
        // the line of the error
        "widgets-broken/healthInterpretation:4:",
    ] {
        if !refusal.contains(expected) {
            return Err(format!("the refusal does not say {expected:?}: {refusal}").into());
        }
    }
    // The registration is the hub's, with the hub's CA bundle.
    let configs: Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
        Api::all(ctx.client("hub").await?);
    let registered = configs.get(lifeboat_hub::admission::CONFIGURATION).await?;
    let webhook = &registered.webhooks.unwrap_or_default()[0];
    let url = webhook.client_config.url.clone().unwrap_or_default();
    if url
        != format!(
            "https://127.0.0.1:{}{}",
            url_port(&url)?,
            lifeboat_hub::admission::VALIDATE_PATH
        )
        || webhook.client_config.ca_bundle.is_none()
    {
        return Err(format!("unexpected registration: {url}").into());
    }

    // A good one is admitted; changing it to a broken script is refused and it keeps its script.
    let good_script = "function InterpretHealth(obj) return obj.status ~= nil end";
    let good = customization("widgets", "example.com/v1", "Widget", good_script);
    kubectl_apply(ctx, &good)
        .await?
        .map_err(|e| format!("a good customization was refused: {e}"))?;
    let mut changed = good.clone();
    changed["spec"]["customizations"]["healthInterpretation"]["luaScript"] =
        json!("function InterpretHealth(obj) return ( end");
    match kubectl_apply(ctx, &changed).await? {
        Ok(out) => return Err(format!("a broken update was admitted: {out}").into()),
        Err(stderr)
            if stderr.contains(HEALTH_FIELD)
                && stderr.contains("widgets/healthInterpretation:1:") => {}
        Err(stderr) => return Err(format!("refused for another reason: {stderr}").into()),
    }
    let stored: Api<ResourceInterpreterCustomization> = Api::all(ctx.client("hub").await?);
    let kept = serde_json::to_value(stored.get("widgets").await?)?;
    if kept["spec"]["customizations"]["healthInterpretation"]["luaScript"] != json!(good_script) {
        return Err(format!("the stored customization changed: {kept}").into());
    }
    stored.delete("widgets", &DeleteParams::default()).await?;
    Ok(())
}

fn url_port(url: &str) -> Result<u16, TestError> {
    url.trim_start_matches("https://127.0.0.1:")
        .split('/')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("no port in {url}").into())
}

/// Part 2: a script that raises on a placed AppWrapper's kind shows on its binding at once.
async fn runtime_errors_reach_the_binding(
    ctx: &TestContext,
    hub: &kube::Client,
    hub_url: &str,
    dir: &std::path::Path,
) -> TestResult {
    bootstrap(hub, dir).await?;
    let member = ctx
        .fleet
        .member_names()
        .first()
        .cloned()
        .ok_or("the fleet needs a member")?;
    let _agent = start_agent(ctx, &member, hub_url, dir, "us-east-1").await?;
    until_clusters_ready(hub, [&member]).await?;

    let ns = ctx.namespace("hub").await?;
    lifeboat_e2e::fleet::lifeboat::apply_propagation_policy(
        hub,
        &ns,
        "train-policy",
        json!({
            "resourceSelectors": [{"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": "train"}],
            "placement": {"clusterAffinity": {"clusterNames": [member]}}
        }),
    )
    .await?;
    let appwrappers: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &ns, &appwrapper_resource());
    let mut train = serde_json::to_value(support::appwrapper(
        "train",
        &[],
        vec![support::job("train-job", "sleep 3600", 1, 1)],
    )?)?;
    train["metadata"]["namespace"] = json!(ns);
    appwrappers
        .create(&PostParams::default(), &serde_json::from_value(train)?)
        .await?;
    let bindings: Api<ResourceBinding> = Api::namespaced(hub.clone(), &ns);
    let healthy = |b: &ResourceBinding| condition(b, "Healthy").map(|(s, r, _)| (s, r));
    let binding = wait::until("the binding Healthy", T, || async {
        let b = lifeboat_e2e::fleet::lifeboat::binding_of(&bindings, "train").await?;
        match healthy(&b) {
            Some((s, _)) if s == "True" => Ok(b),
            other => Err(format!("Healthy condition {other:?}")),
        }
    })
    .await?;
    let name = binding.metadata.name.clone().unwrap_or_default();
    let revision = observed_revision(&binding);

    // The customization: InterpretHealth raises on line 2.
    let applied = Instant::now();
    kubectl_apply(
        ctx,
        &customization(
            "appwrapper-health-broken",
            "workload.codeflare.dev/v1beta2",
            "AppWrapper",
            "function InterpretHealth(obj)\n  error('no health for ' .. obj.metadata.name)\nend",
        ),
    )
    .await?
    .map_err(|e| format!("the customization was refused: {e}"))?;
    let broken = wait::until(
        "the Healthy condition names the customization and the error",
        T,
        || async {
            let b = bindings.get(&name).await.map_err(|e| e.to_string())?;
            match condition(&b, "Healthy") {
                Some((status, reason, message))
                    if status == "Unknown"
                        && reason == "InterpreterError"
                        && message.contains(
                            "customization appwrapper-health-broken failed in InterpretHealth",
                        )
                        && message.contains(HEALTH_FIELD)
                        && message.contains(":2: no health for train") =>
                {
                    Ok(b)
                }
                other => Err(format!("Healthy condition {other:?}")),
            }
        },
    )
    .await?;
    let took = applied.elapsed();
    tracing::info!(
        seconds = took.as_secs_f64(),
        "the binding named the failing customization"
    );
    eprintln!(
        "the binding's Healthy condition named the customization {took:?} after it was applied"
    );
    // The object in the member did not change: the agent's report is the same revision.
    if observed_revision(&broken) != revision {
        return Err(format!(
            "the reported revision changed ({revision:?} -> {:?}): not a re-interpretation of the same object",
            observed_revision(&broken)
        )
        .into());
    }
    // The Warning Event on the binding, naming the customization and the error.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(hub.clone(), &ns);
    wait::until(
        "the InterpreterError Event on the binding",
        Duration::from_secs(30),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some("InterpreterError")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(name.as_str())
                        && e.note.as_deref().is_some_and(|n| {
                            n.contains("customization appwrapper-health-broken")
                                && n.contains("no health for train")
                        })
                })
                .map(|_| ())
                .ok_or_else(|| format!("{} Events, none yet", list.items.len()))
        },
    )
    .await?;

    // Removing it: the built-in judges again, Healthy without a new object.
    let customizations: Api<ResourceInterpreterCustomization> = Api::all(hub.clone());
    customizations
        .delete("appwrapper-health-broken", &DeleteParams::default())
        .await?;
    wait::until("the binding Healthy again", T, || async {
        let b = bindings.get(&name).await.map_err(|e| e.to_string())?;
        match healthy(&b) {
            Some((s, _)) if s == "True" => Ok(()),
            other => Err(format!("Healthy condition {other:?}")),
        }
    })
    .await?;
    Ok(())
}

fn condition(b: &ResourceBinding, type_: &str) -> Option<(String, String, String)> {
    b.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn observed_revision(b: &ResourceBinding) -> Option<i64> {
    b.status
        .as_ref()?
        .aggregated_status
        .first()
        .and_then(|i| i.observed_revision)
}
