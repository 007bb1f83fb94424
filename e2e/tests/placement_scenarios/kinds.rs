//! Every kind the hub places (`lifeboat_hub::binding::detector::TEMPLATE_KINDS`) but the AppWrapper, which
//! the other scenarios place: three Jobs (a generated selector, a manual selector, a TTL), a
//! Deployment, a StatefulSet, and the operator kinds JobSet, PyTorchJob and RayJob, applied to
//! the hub at once with one policy naming member-3 and followed concurrently.
//!
//! For each: the copy in member-3, the binding's item for member-3 applied and Healthy by the
//! built-in interpreter, the hub's template status aggregated from the copy's (the Deployment and
//! StatefulSet, scaled on the hub, observe their new generation once member-3 rolled it out; the
//! Job with a TTL completes and the hub's own TTL controller deletes it, taking the copy). The
//! built-in kinds' pods run in member-3 (kwok runs `sleep`). No operator runs on the fleet (their
//! CRDs are installed schemaless, [`install_crds`]), so the test writes each operator kind's
//! status in member-3 as its operator would.
//!
//! Template edits: a Job's mutable field (parallelism) edited on the hub reaches the copy; its pod
//! template, immutable, is refused by the hub's own API server, so nothing reaches the member. An
//! edit the hub takes but the member refuses (member-3's RayJob CRD, unlike the hub's, makes
//! `spec.entrypoint` immutable) shows on the binding (`applied: false`, an `appliedMessage`
//! naming the field and the reason) while the copy runs on unchanged; undoing the edit makes it
//! applied again.

use std::sync::Arc;

use futures::future::{BoxFuture, FutureExt, try_join_all};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use lifeboat_api::binding::{AggregatedStatusItem, ResourceBinding};
use lifeboat_e2e::fleet::lifeboat::apply_propagation_policy;
use lifeboat_e2e::harness::{TestContext, TestResult};
use lifeboat_e2e::wait;
use serde_json::{Value, json};

use super::{M3, Turn, healthy_in, in_member, until_binding, until_gone_from_member};
use crate::support::T;
use crate::support::hub::{install_operator_crd, install_operator_crd_with};

/// The operator kinds the hub places (group, version, kind), as `install_operator_crd` serves
/// them on the hub and member-3.
pub const OPERATOR_KINDS: [(&str, &str, &str); 3] = [
    ("jobset.x-k8s.io", "v1alpha2", "JobSet"),
    ("kubeflow.org", "v1", "PyTorchJob"),
    ("ray.io", "v1", "RayJob"),
];

pub fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// What member-3's RayJob CRD refuses that the hub's takes.
const ENTRYPOINT_IMMUTABLE: &str = "entrypoint is immutable";

/// The operator kinds' CRDs on the hub and on member-3; member-3's RayJob CRD is stricter than
/// the hub's: its `spec.entrypoint` cannot change (a CEL transition rule).
pub async fn install_crds(hub: &kube::Client, member: &kube::Client) -> TestResult {
    for (group, version, kind) in OPERATOR_KINDS {
        let resource = resource(group, version, kind);
        install_operator_crd(hub, &resource).await?;
        if kind == "RayJob" {
            let strict = json!({"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                "properties": {"entrypoint": {"type": "string", "x-kubernetes-validations": [
                    {"rule": "self == oldSelf", "message": ENTRYPOINT_IMMUTABLE}]}}}});
            install_operator_crd_with(member, &resource, strict).await?;
        } else {
            install_operator_crd(member, &resource).await?;
        }
    }
    Ok(())
}

/// The label the manual-selector Job selects its pods by.
const MANUAL_LABEL: &str = "e2e.lifeboat.dev/job";

fn container(command: &str) -> Value {
    json!({"name": "main", "image": "busybox", "command": ["sh", "-c", command],
           "resources": {"requests": {"cpu": "100m"}}})
}

fn job(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec})
}

/// The templates, each with its kind's resource: every name is distinct (bindings are found by
/// the template's name).
fn templates() -> Vec<(ApiResource, Value)> {
    let jobs = resource("batch", "v1", "Job");
    let pod = |labels: Value, command: &str, restart: &str| {
        json!({"metadata": {"labels": labels},
               "spec": {"restartPolicy": restart, "containers": [container(command)]}})
    };
    let [jobset, pytorch, ray] = OPERATOR_KINDS.map(|(g, v, k)| resource(g, v, k));
    vec![
        // Two completions, one at a time: a parallelism edit shows as a second pod.
        (
            jobs.clone(),
            job(
                "train",
                json!({"completions": 2, "parallelism": 1, "backoffLimit": 0,
                       "template": pod(json!({"app": "train"}), "sleep 3600", "Never")}),
            ),
        ),
        (
            jobs.clone(),
            job(
                "manual",
                json!({"manualSelector": true,
                       "selector": {"matchLabels": {MANUAL_LABEL: "manual"}},
                       "template": pod(json!({MANUAL_LABEL: "manual"}), "sleep 3600", "Never")}),
            ),
        ),
        (
            jobs,
            job(
                "short",
                json!({"ttlSecondsAfterFinished": 5,
                       "template": pod(json!({"app": "short"}), "sleep 1", "Never")}),
            ),
        ),
        (
            resource("apps", "v1", "Deployment"),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                   "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                            "template": pod(json!({"app": "web"}), "sleep infinity", "Always")}}),
        ),
        (
            resource("apps", "v1", "StatefulSet"),
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
                   "spec": {"replicas": 2, "serviceName": "db",
                            "selector": {"matchLabels": {"app": "db"}},
                            "template": pod(json!({"app": "db"}), "sleep infinity", "Always")}}),
        ),
        (
            jobset,
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
                   "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1,
                       "template": {"spec": {"parallelism": 1, "completions": 1,
                           "template": pod(json!({}), "sleep 3600", "Never")}}}]}}),
        ),
        (
            pytorch,
            json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "ptj"},
                   "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "restartPolicy": "OnFailure",
                       "template": pod(json!({}), "sleep 3600", "OnFailure")}}}}),
        ),
        (
            ray,
            json!({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "ray"},
                   "spec": {"entrypoint": "python train.py",
                            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {},
                                "template": pod(json!({}), "sleep 3600", "Always")}}}}),
        ),
    ]
}

pub async fn every_kind_runs_in_its_member(ctx: Arc<TestContext>) -> TestResult {
    let turn = Turn::take(&ctx).await?;
    let (hub, ns) = (&turn.hub, turn.ns.clone());
    ctx.namespace(M3).await?;
    let mut selectors: Vec<Value> = Vec::new();
    for (r, _) in templates() {
        let selector = json!({"apiVersion": r.api_version, "kind": r.kind});
        if !selectors.contains(&selector) {
            selectors.push(selector);
        }
    }
    apply_propagation_policy(
        hub,
        &ns,
        "every-kind",
        json!({"resourceSelectors": selectors,
               "placement": {"clusterAffinity": {"clusterNames": [M3]}}}),
    )
    .await?;
    for (resource, template) in templates() {
        let api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ns, &resource);
        api.create(&PostParams::default(), &serde_json::from_value(template)?)
            .await?;
    }

    let k = Kinds {
        hub: hub.clone(),
        member: ctx.client(M3).await?,
        ns,
    };
    let [jobset, pytorch, ray] = OPERATOR_KINDS.map(|(g, v, k)| resource(g, v, k));
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let checks: Vec<BoxFuture<'_, TestResult>> = vec![
        k.job_with_a_generated_selector().boxed(),
        k.job_with_a_manual_selector().boxed(),
        k.job_with_a_ttl().boxed(),
        k.replicated("web", resource("apps", "v1", "Deployment"))
            .boxed(),
        k.replicated("db", resource("apps", "v1", "StatefulSet"))
            .boxed(),
        k.operator_kind(
            "js",
            jobset,
            json!({"restarts": 0, "replicatedJobsStatus": [{"name": "workers",
                "active": 1, "ready": 1, "succeeded": 0, "failed": 0, "suspended": 0}]}),
            |s| s["replicatedJobsStatus"][0]["active"] == 1,
        )
        .boxed(),
        k.operator_kind(
            "ptj",
            pytorch,
            json!({"startTime": now, "replicaStatuses": {"Master": {"active": 1}},
                "conditions": [
                    {"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
                     "lastTransitionTime": now},
                    {"type": "Running", "status": "True", "reason": "PyTorchJobRunning",
                     "message": "PyTorchJob ptj is running.", "lastTransitionTime": now}]}),
            |s| {
                s["conditions"][0]["type"] == "Running"
                    && s["replicaStatuses"]["Master"]["active"] == 1
            },
        )
        .boxed(),
        k.ray_job_edit_the_member_refuses(ray, &now).boxed(),
    ];
    try_join_all(checks).await?;
    Ok(())
}

/// What the checks share: the hub, member-3, the scenario's namespace.
struct Kinds {
    hub: kube::Client,
    member: kube::Client,
    ns: String,
}

impl Kinds {
    fn on_hub(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.hub.clone(), &self.ns, resource)
    }

    fn in_member(&self, resource: &ApiResource) -> Api<DynamicObject> {
        in_member(self.member.clone(), &self.ns, resource)
    }

    /// Waits until the copy of `name` is in member-3 and `check` holds of it; returns it.
    async fn until_copy(
        &self,
        resource: &ApiResource,
        name: &str,
        what: &str,
        check: impl Fn(&DynamicObject) -> Result<(), String>,
    ) -> Result<DynamicObject, lifeboat_e2e::harness::TestError> {
        let api = self.in_member(resource);
        Ok(wait::until(&format!("{name} {what} in {M3}"), T, || async {
            let copy = api
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no copy yet")?;
            check(&copy).map(|()| copy)
        })
        .await?)
    }

    async fn until_healthy(&self, name: &str) -> TestResult {
        until_binding(
            &self.hub,
            &self.ns,
            name,
            "applied and Healthy in member-3",
            |b| healthy_in(b, M3),
        )
        .await
    }

    /// Waits until member-3 runs `count` pods selected by `selector` (and none is being
    /// deleted).
    async fn until_pods_running(&self, selector: &str, count: usize) -> TestResult {
        let pods: Api<Pod> = Api::namespaced(self.member.clone(), &self.ns);
        wait::until(
            &format!("{count} pods {selector} Running in {M3}"),
            T,
            || async {
                let list = pods
                    .list(&ListParams::default().labels(selector))
                    .await
                    .map_err(|e| e.to_string())?;
                let running = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count();
                if running == count {
                    Ok(())
                } else {
                    Err(format!("{running} Running of {} pods", list.items.len()))
                }
            },
        )
        .await?;
        Ok(())
    }

    /// Waits until the hub's template `name` has a status `check` accepts.
    async fn until_hub_status(
        &self,
        resource: &ApiResource,
        name: &str,
        what: &str,
        check: impl Fn(&DynamicObject) -> bool,
    ) -> TestResult {
        let api = self.on_hub(resource);
        wait::until(&format!("the hub's {name} {what}"), T, || async {
            let template = api.get(name).await.map_err(|e| e.to_string())?;
            if check(&template) {
                Ok(())
            } else {
                Err(format!("status {}", template.data["status"]))
            }
        })
        .await?;
        Ok(())
    }

    /// The Job the hub's API server gave a generated selector (from the hub copy's UID) runs
    /// with the member's own; its edits on the hub: parallelism reaches the copy, a pod template
    /// edit is refused by the member and said so on the binding, and undone is applied again.
    async fn job_with_a_generated_selector(&self) -> TestResult {
        let jobs = resource("batch", "v1", "Job");
        let hub_uid = self.on_hub(&jobs).get("train").await?.metadata.uid;
        let copy = self
            .until_copy(&jobs, "train", "with its own generated selector", |copy| {
                let uid = copy.metadata.uid.clone().unwrap_or_default();
                let selector = &copy.data["spec"]["selector"]["matchLabels"];
                let labels = &copy.data["spec"]["template"]["metadata"]["labels"];
                if selector == &json!({"batch.kubernetes.io/controller-uid": uid})
                    && labels["batch.kubernetes.io/controller-uid"] == uid.as_str()
                    && labels["app"] == "train"
                {
                    Ok(())
                } else {
                    Err(format!(
                        "uid {uid}, selector {selector}, pod labels {labels}"
                    ))
                }
            })
            .await?;
        assert_ne!(
            copy.metadata.uid, hub_uid,
            "the copy is an object of its own"
        );
        self.until_healthy("train").await?;
        let pods = "batch.kubernetes.io/job-name=train";
        self.until_pods_running(pods, 1).await?;
        self.until_hub_status(&jobs, "train", "shows the running pod", |t| {
            t.data["status"]["active"] == 1
        })
        .await?;

        // A mutable field: the member's copy follows.
        let on_hub = self.on_hub(&jobs);
        on_hub
            .patch(
                "train",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"parallelism": 2}})),
            )
            .await?;
        self.until_copy(&jobs, "train", "with parallelism 2", |copy| {
            match copy.data["spec"]["parallelism"].as_i64() {
                Some(2) => Ok(()),
                other => Err(format!("parallelism {other:?}")),
            }
        })
        .await?;
        self.until_pods_running(pods, 2).await?;
        self.until_healthy("train").await?;

        // The pod template is immutable once the Job exists, on the hub as in the member: the
        // hub's API server refuses the edit, so nothing reaches the member.
        let edit =
            json!({"spec": {"template": {"spec": {"containers": [container("sleep 7200")]}}}});
        match on_hub
            .patch("train", &PatchParams::default(), &Patch::Merge(&edit))
            .await
        {
            Err(kube::Error::Api(s))
                if s.code == 422
                    && s.message.contains("spec.template")
                    && s.message.contains("field is immutable") => {}
            other => return Err(format!("the hub took a Job pod template edit: {other:?}").into()),
        }
        let after = self.in_member(&jobs).get("train").await?;
        assert_eq!(after.metadata.uid, copy.metadata.uid, "the same copy");
        assert_eq!(
            after.data["spec"]["template"]["spec"]["containers"][0]["command"],
            json!(["sh", "-c", "sleep 3600"]),
            "the copy keeps its pod template"
        );
        self.until_healthy("train").await?;
        Ok(())
    }

    /// A Job whose selector the user chose keeps it in the member.
    async fn job_with_a_manual_selector(&self) -> TestResult {
        let jobs = resource("batch", "v1", "Job");
        self.until_copy(&jobs, "manual", "with the user's selector", |copy| {
            let selector = &copy.data["spec"]["selector"];
            if selector == &json!({"matchLabels": {MANUAL_LABEL: "manual"}})
                && copy.data["spec"]["manualSelector"] == true
            {
                Ok(())
            } else {
                Err(format!("selector {selector}"))
            }
        })
        .await?;
        self.until_healthy("manual").await?;
        self.until_pods_running(&format!("{MANUAL_LABEL}=manual"), 1)
            .await
    }

    /// A Job's TTL is the hub's: the copy has none, and once the copy completed the hub's own
    /// TTL controller deletes the template (its reflected status says Complete), which takes
    /// the copy away.
    async fn job_with_a_ttl(&self) -> TestResult {
        let jobs = resource("batch", "v1", "Job");
        self.until_copy(
            &jobs,
            "short",
            "without a TTL",
            |copy| match copy.data["spec"].get("ttlSecondsAfterFinished") {
                None => Ok(()),
                Some(ttl) => Err(format!("ttlSecondsAfterFinished {ttl}")),
            },
        )
        .await?;
        until_gone_from_member(&self.on_hub(&jobs), "the hub", "short").await?;
        until_gone_from_member(&self.in_member(&jobs), M3, "short").await
    }

    /// A Deployment or StatefulSet of 2 replicas (pods labelled `app=<name>`): its pods run, and
    /// the hub's template counts them ready and has observed its generation; scaled to 3 on the
    /// hub, the hub's template observes the new generation once member-3 has rolled it out.
    async fn replicated(&self, name: &str, resource: ApiResource) -> TestResult {
        let ready_and_observed = |replicas: i64| {
            move |t: &DynamicObject| {
                t.data["status"]["readyReplicas"] == replicas
                    && t.data["status"]["observedGeneration"] == t.metadata.generation.unwrap_or(-1)
            }
        };
        self.until_healthy(name).await?;
        self.until_pods_running(&format!("app={name}"), 2).await?;
        self.until_hub_status(&resource, name, "ready and observed", ready_and_observed(2))
            .await?;
        self.on_hub(&resource)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"replicas": 3}})),
            )
            .await?;
        self.until_pods_running(&format!("app={name}"), 3).await?;
        self.until_hub_status(
            &resource,
            name,
            "scaled to 3, ready and observed",
            ready_and_observed(3),
        )
        .await?;
        self.until_healthy(name).await
    }

    /// An operator kind: once the copy is in member-3 its status is written there as the
    /// operator would; the binding says Healthy and the hub's template status `reflects` it.
    async fn operator_kind(
        &self,
        name: &str,
        resource: ApiResource,
        status: Value,
        reflects: impl Fn(&Value) -> bool,
    ) -> TestResult {
        self.until_copy(&resource, name, "applied", |_| Ok(()))
            .await?;
        self.in_member(&resource)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await?;
        self.until_healthy(name).await?;
        self.until_hub_status(&resource, name, "reflects its operator's status", |t| {
            reflects(&t.data["status"])
        })
        .await
    }

    /// A RayJob (as `operator_kind`) whose entrypoint is then edited on the hub: member-3 refuses
    /// the edit, the binding says so naming the field, the copy keeps its entrypoint; the edit
    /// undone, the copy is applied and Healthy again.
    async fn ray_job_edit_the_member_refuses(&self, ray: ApiResource, now: &str) -> TestResult {
        self.operator_kind(
            "ray",
            ray.clone(),
            json!({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "startTime": now}),
            |s| s["jobDeploymentStatus"] == "Running" && s["jobStatus"] == "RUNNING",
        )
        .await?;
        let copy = self.in_member(&ray).get("ray").await?;
        let entrypoint = |e: &str| json!({"spec": {"entrypoint": e}});
        let on_hub = self.on_hub(&ray);
        on_hub
            .patch(
                "ray",
                &PatchParams::default(),
                &Patch::Merge(&entrypoint("python train.py --resume")),
            )
            .await?;
        let message = until_binding(
            &self.hub,
            &self.ns,
            "ray",
            "the entrypoint edit refused in member-3",
            |b| {
                let item = item_in(b, M3)?;
                let message = item.applied_message.clone().unwrap_or_default();
                if !item.applied
                    && message.contains("spec.entrypoint")
                    && message.contains(ENTRYPOINT_IMMUTABLE)
                {
                    Ok(message)
                } else {
                    Err(format!("applied {}, message {message:?}", item.applied))
                }
            },
        )
        .await?;
        eprintln!("member-3's refusal as the binding says it: {message}");
        let after = self.in_member(&ray).get("ray").await?;
        assert_eq!(after.metadata.uid, copy.metadata.uid, "the same copy");
        assert_eq!(after.data["spec"]["entrypoint"], "python train.py");
        on_hub
            .patch(
                "ray",
                &PatchParams::default(),
                &Patch::Merge(&entrypoint("python train.py")),
            )
            .await?;
        self.until_healthy("ray").await
    }
}

/// The binding's item for `cluster`.
fn item_in<'a>(b: &'a ResourceBinding, cluster: &str) -> Result<&'a AggregatedStatusItem, String> {
    b.status
        .as_ref()
        .and_then(|s| {
            s.aggregated_status
                .iter()
                .find(|i| i.cluster_name == cluster)
        })
        .ok_or_else(|| format!("no status item for {cluster} yet"))
}
