//! The hub's policy API rejects what cannot work, at the API, as a user meets it: each policy
//! below is applied with kubectl to the fleet hub's real kube-apiserver (the CRDs from
//! `lifeboat_api::crds::hub()`, their OpenAPI bounds and CEL rules), and the rejection must
//! name the field and the reason. A rejected update leaves the stored policy as it was, and
//! the names Karmada users bring (`Immediately`, `Graciously`) are accepted.

use std::process::ExitCode;
use std::sync::Arc;

use lifeboat_e2e::harness::{self, E2eTest, TestContext, TestError, TestResult};
use serde_json::{Value, json};

const HUB: &str = "hub";

fn main() -> ExitCode {
    harness::run(
        "policy-validation",
        |c| {
            c.members = 1;
            c.nodes_per_member = 1;
        },
        vec![
            E2eTest::new(
                "invalid_policies_are_rejected_naming_the_field_and_the_reason",
                invalid_policies_are_rejected,
            ),
            E2eTest::new(
                "karmadas_purge_mode_names_and_valid_policies_are_accepted",
                valid_policies_are_accepted,
            ),
            E2eTest::new(
                "a_rejected_update_keeps_the_stored_policy",
                rejected_update_keeps_the_policy,
            ),
        ],
    )
}

async fn install_crds(ctx: &TestContext) -> TestResult {
    let client = ctx.client(HUB).await?;
    for generated in lifeboat_api::crds::hub() {
        lifeboat_runtime::crd::ensure(
            &client,
            &generated.crd,
            "lifeboat-e2e",
            lifeboat_runtime::crd::ESTABLISHED_TIMEOUT,
        )
        .await?;
    }
    Ok(())
}

/// A policy of `kind` named `name` with this `spec` (selecting Deployments), as JSON for kubectl.
fn policy(kind: &str, namespace: Option<&str>, name: &str, spec: Value) -> String {
    let mut spec = spec;
    spec["resourceSelectors"] = json!([{"apiVersion": "apps/v1", "kind": "Deployment"}]);
    let mut metadata = json!({"name": name});
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    json!({
        "apiVersion": "policy.lifeboat.dev/v1alpha1",
        "kind": kind,
        "metadata": metadata,
        "spec": spec,
    })
    .to_string()
}

async fn kubectl_apply(
    ctx: &TestContext,
    manifest: String,
) -> Result<Result<String, String>, TestError> {
    let kubeconfig = ctx.fleet.kubeconfig(HUB)?;
    lifeboat_e2e::kubectl::run(&kubeconfig, None, &["apply", "-f", "-"], Some(manifest)).await
}

/// One policy that must be refused: the field path and the reason kubectl must print.
struct Invalid {
    case: &'static str,
    spec: Value,
    field: &'static str,
    reason: &'static str,
}

fn invalid_cases() -> Vec<Invalid> {
    let app = |failover: Value| json!({"failover": {"application": failover}});
    vec![
        Invalid {
            case: "unknown purge mode",
            spec: app(json!({"purgeMode": "Soon"})),
            field: "spec.failover.application.purgeMode",
            reason: "Unsupported value: \"Soon\"",
        },
        Invalid {
            case: "negative toleration",
            spec: app(json!({"decisionConditions": {"tolerationSeconds": -1}})),
            field: "spec.failover.application.decisionConditions.tolerationSeconds",
            reason: "should be greater than or equal to 0",
        },
        Invalid {
            case: "negative delay",
            spec: app(json!({"preConditions": {"delaySeconds": -5}})),
            field: "spec.failover.application.preConditions.delaySeconds",
            reason: "should be greater than or equal to 0",
        },
        Invalid {
            case: "negative block-predecessor period",
            spec: app(json!({"blockPredecessorSeconds": -1})),
            field: "spec.failover.application.blockPredecessorSeconds",
            reason: "should be greater than or equal to 0",
        },
        Invalid {
            case: "grace period with Directly",
            spec: app(json!({"purgeMode": "Directly", "gracePeriodSeconds": 30})),
            field: "spec.failover.application.gracePeriodSeconds",
            reason: "gracePeriodSeconds only takes effect when purgeMode is Gracefully",
        },
        Invalid {
            case: "grace period with Never",
            spec: app(json!({"purgeMode": "Never", "gracePeriodSeconds": 30})),
            field: "spec.failover.application.gracePeriodSeconds",
            reason: "gracePeriodSeconds only takes effect when purgeMode is Gracefully",
        },
        Invalid {
            case: "negative cluster toleration",
            spec: json!({"failover": {"cluster": {"tolerationSeconds": -10}}}),
            field: "spec.failover.cluster.tolerationSeconds",
            reason: "should be greater than or equal to 0",
        },
        Invalid {
            case: "state preservation label that is not a label name",
            spec: app(json!({"statePreservation": {"rules": [
                {"aliasLabelName": "not a label!", "jsonPath": "{.jobID}"}
            ]}})),
            field: "spec.failover.application.statePreservation.rules[0].aliasLabelName",
            reason: "must be a valid label name",
        },
        Invalid {
            case: "state preservation path without braces",
            spec: app(json!({"statePreservation": {"rules": [
                {"aliasLabelName": "app.example.com/jobid", "jsonPath": ".jobID"}
            ]}})),
            field: "spec.failover.application.statePreservation.rules[0].jsonPath",
            reason: "must be a JSONPath template in braces",
        },
        Invalid {
            case: "spread by region without a cluster constraint",
            spec: json!({"placement": {"spreadConstraints": [
                {"spreadByField": "region", "maxGroups": 2, "minGroups": 1}
            ]}}),
            field: "spec.placement.spreadConstraints",
            reason: "a constraint with spreadByField 'cluster' is required",
        },
        Invalid {
            case: "the same spread field twice",
            spec: json!({"placement": {"spreadConstraints": [
                {"spreadByField": "cluster", "maxGroups": 2},
                {"spreadByField": "cluster", "maxGroups": 3}
            ]}}),
            field: "spec.placement.spreadConstraints",
            reason: "each spreadByField may appear only once",
        },
        Invalid {
            case: "maxGroups below minGroups",
            spec: json!({"placement": {"spreadConstraints": [
                {"spreadByField": "cluster", "maxGroups": 1, "minGroups": 2}
            ]}}),
            field: "spec.placement.spreadConstraints[0].maxGroups",
            reason: "maxGroups lower than minGroups is not allowed",
        },
        Invalid {
            case: "spread by field and by label",
            spec: json!({"placement": {"spreadConstraints": [
                {"spreadByField": "cluster", "spreadByLabel": "team"}
            ]}}),
            field: "spec.placement.spreadConstraints[0]",
            reason: "spreadByLabel should not co-exist with spreadByField",
        },
        Invalid {
            case: "cluster toleration with Lt",
            spec: json!({"placement": {"clusterTolerations": [
                {"key": "gpu", "operator": "Lt", "value": "4", "effect": "NoSchedule"}
            ]}}),
            field: "spec.placement.clusterTolerations",
            reason: "operator must be Equal or Exists",
        },
        Invalid {
            case: "field selector on a field clusters do not have",
            spec: json!({"placement": {"clusterAffinity": {"fieldSelector": {"matchExpressions": [
                {"key": "color", "operator": "In", "values": ["blue"]}
            ]}}}}),
            field: "spec.placement.clusterAffinity.fieldSelector.matchExpressions",
            reason: "key must be one of provider, region, zone",
        },
        Invalid {
            case: "in-place reset limit above its bound",
            spec: app(json!({"inPlaceReset": {"limit": 50}})),
            field: "spec.failover.application.inPlaceReset.limit",
            reason: "should be less than or equal to 10",
        },
        Invalid {
            case: "in-place reset timeout of zero",
            spec: app(json!({"inPlaceReset": {"limit": 1, "timeoutSeconds": 0}})),
            field: "spec.failover.application.inPlaceReset.timeoutSeconds",
            reason: "should be greater than or equal to 1",
        },
    ]
}

async fn invalid_policies_are_rejected(ctx: Arc<TestContext>) -> TestResult {
    install_crds(&ctx).await?;
    let ns = ctx.namespace(HUB).await?;
    let mut failures = Vec::new();
    for (i, case) in invalid_cases().into_iter().enumerate() {
        // Every rule holds for both kinds (they share the spec); alternate to cover both.
        let (kind, namespace) = if i % 2 == 0 {
            ("PropagationPolicy", Some(ns.as_str()))
        } else {
            ("ClusterPropagationPolicy", None)
        };
        let name = format!("invalid-{i}");
        match kubectl_apply(&ctx, policy(kind, namespace, &name, case.spec)).await? {
            Ok(out) => failures.push(format!("{} ({kind}): accepted: {out}", case.case)),
            Err(stderr) => {
                let names_both = stderr.contains(&format!("{kind} \"{name}\" is invalid"))
                    && stderr.contains(case.field)
                    && stderr.contains(case.reason);
                if !names_both {
                    failures.push(format!(
                        "{} ({kind}): expected `{}` and `{}` in: {stderr}",
                        case.case, case.field, case.reason
                    ));
                }
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

async fn valid_policies_are_accepted(ctx: Arc<TestContext>) -> TestResult {
    install_crds(&ctx).await?;
    let ns = ctx.namespace(HUB).await?;
    let cases = [
        (
            "immediately",
            json!({"failover": {"application": {"purgeMode": "Immediately"}}}),
        ),
        (
            "graciously",
            json!({"failover": {"application": {"purgeMode": "Graciously", "gracePeriodSeconds": 120}}}),
        ),
        (
            "gracefully-by-default",
            json!({"failover": {"application": {"gracePeriodSeconds": 60, "decisionConditions": {"tolerationSeconds": 0}, "blockPredecessorSeconds": 0}}}),
        ),
        (
            "cluster-failover",
            json!({"failover": {"cluster": {"purgeMode": "Directly", "tolerationSeconds": 0}}}),
        ),
        (
            "spread",
            json!({"placement": {"spreadConstraints": [
                {"spreadByField": "cluster", "maxGroups": 3, "minGroups": 1},
                {"spreadByField": "region", "maxGroups": 2, "minGroups": 2}
            ]}}),
        ),
    ];
    for (name, spec) in cases {
        kubectl_apply(&ctx, policy("PropagationPolicy", Some(&ns), name, spec))
            .await?
            .map_err(|stderr| format!("{name} was refused: {stderr}"))?;
    }
    // The aliases are stored as written (Karmada's own CRD keeps them too) and read as the
    // current modes by the hub.
    let kubeconfig = ctx.fleet.kubeconfig(HUB)?;
    let stored = lifeboat_e2e::kubectl::run(
        &kubeconfig,
        None,
        &[
            "get",
            "propagationpolicy",
            "immediately",
            "-n",
            &ns,
            "-o",
            "json",
        ],
        None,
    )
    .await?
    .map_err(|stderr| format!("kubectl get: {stderr}"))?;
    let stored: lifeboat_api::policy::PropagationPolicy = serde_json::from_str(&stored)?;
    let app = stored
        .spec
        .failover
        .and_then(|f| f.application)
        .ok_or("the stored policy lost its failover block")?;
    if app.purge_mode() != lifeboat_api::policy::PurgeMode::Directly {
        return Err(format!("Immediately read as {:?}", app.purge_mode()).into());
    }
    Ok(())
}

async fn rejected_update_keeps_the_policy(ctx: Arc<TestContext>) -> TestResult {
    install_crds(&ctx).await?;
    let ns = ctx.namespace(HUB).await?;
    let good = json!({"failover": {"application": {"purgeMode": "Gracefully", "gracePeriodSeconds": 300}}});
    kubectl_apply(&ctx, policy("PropagationPolicy", Some(&ns), "kept", good))
        .await?
        .map_err(|stderr| format!("the valid policy was refused: {stderr}"))?;
    let bad =
        json!({"failover": {"application": {"purgeMode": "Directly", "gracePeriodSeconds": 300}}});
    if let Ok(out) =
        kubectl_apply(&ctx, policy("PropagationPolicy", Some(&ns), "kept", bad)).await?
    {
        return Err(format!("the invalid update was accepted: {out}").into());
    }
    let kubeconfig = ctx.fleet.kubeconfig(HUB)?;
    let stored = lifeboat_e2e::kubectl::run(
        &kubeconfig,
        None,
        &[
            "get",
            "propagationpolicy",
            "kept",
            "-n",
            &ns,
            "-o",
            "jsonpath={.spec.failover.application.purgeMode}/{.spec.failover.application.gracePeriodSeconds}",
        ],
        None,
    )
    .await?
    .map_err(|stderr| format!("kubectl get: {stderr}"))?;
    if stored != "Gracefully/300" {
        return Err(format!("the stored policy changed: {stored}").into());
    }
    Ok(())
}
