//! What the hub's own API server (and the controllers the hub runs) wrote into a template that
//! is not the user's and must not reach a member, per kind; pure.
//!
//! The hub's kube-apiserver treats a template like any object: it generates a Job's selector
//! and pod labels from the hub copy's UID, allocates a Service's cluster IP from the hub's range,
//! mounts the hub's service-account token into a Pod. Sent on, those values name things that do
//! not exist in the member (a UID, an IP range, a token) and the member's API server rejects the
//! copy or, worse, takes it. Each rule below removes only what the hub generated, so the
//! member's API server generates its own, and keeps what a user may have set (a Job with
//! `spec.manualSelector: true` keeps its selector, a headless Service its `clusterIP: None`).
//! Karmada prunes the same fields in its default native resource interpreter.
//!
//! Kept on purpose: a Service's `nodePort`s and `healthCheckNodePort` (an allocated port looks
//! the same as one the user chose; the member refuses a port it cannot give, and the agent
//! reports why) and a Pod's `nodeName` (the hub runs no scheduler, so only a user sets it).
//!
//! Metadata other than name, namespace, labels and annotations never reaches the manifest
//! ([`crate::work::dispatch::base_manifest`]), and status neither; this module sees the rest.

use serde_json::{Map, Value};

/// Labels the Job API generates on a Job's pod template (from the Job's name and UID) when its
/// selector is generated.
pub const JOB_GENERATED_TEMPLATE_LABELS: &[&str] = &[
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
];
/// The generated selector's keys (the UID of the Job they were generated for).
pub const JOB_GENERATED_SELECTOR_LABELS: &[&str] =
    &["controller-uid", "batch.kubernetes.io/controller-uid"];
/// The Deployment controller's revision bookkeeping.
pub const DEPLOYMENT_REVISION_ANNOTATIONS: &[&str] = &[
    "deployment.kubernetes.io/revision",
    "deployment.kubernetes.io/revision-history",
];
/// What the persistent-volume controller and the scheduler write on a claim they bind.
pub const PVC_BINDING_ANNOTATIONS: &[&str] = &[
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "volume.beta.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/selected-node",
];
/// The service-account admission plugin's projected token volume: this prefix and a random
/// suffix.
pub const SERVICE_ACCOUNT_VOLUME_PREFIX: &str = "kube-api-access-";
/// The service account (by UID) a token Secret was issued for.
pub const SERVICE_ACCOUNT_UID_ANNOTATION: &str = "kubernetes.io/service-account.uid";

/// Removes from `manifest` what the hub generated in its template, by the manifest's group and
/// kind (any version). Kinds without a rule, and non-objects, are left as they are.
pub fn remove_generated(manifest: &mut Value) {
    let Some(object) = manifest.as_object_mut() else {
        return;
    };
    let group = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .and_then(|v| v.rsplit_once('/'))
        .map_or("", |(group, _)| group)
        .to_string();
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    match (group.as_str(), kind.as_str()) {
        ("batch", "Job") => job(object),
        ("apps", "Deployment") => remove_keys(
            object,
            &["metadata", "annotations"],
            DEPLOYMENT_REVISION_ANNOTATIONS,
        ),
        ("", "Service") => service(object),
        ("", "PersistentVolumeClaim") => persistent_volume_claim(object),
        ("", "ServiceAccount") => service_account(object),
        ("", "Secret") => secret(object),
        ("", "Pod") => pod(object),
        _ => {}
    }
}

/// A Job's selector and pod labels are generated from the hub copy's UID unless the user chose
/// them (`spec.manualSelector: true`); the member's API server refuses another Job's UID
/// ("selector not auto-generated"). Its TTL is the hub's to apply: the hub deletes the template
/// once its reflected status is finished, which withdraws the copies; a member that deleted its
/// own finished copy would have it re-created (and run again) by the agent's next full apply.
fn job(object: &mut Map<String, Value>) {
    if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("ttlSecondsAfterFinished");
    }
    let manual = object
        .get("spec")
        .and_then(|s| s.get("manualSelector"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if manual {
        return;
    }
    remove_keys(
        object,
        &["spec", "template", "metadata", "labels"],
        JOB_GENERATED_TEMPLATE_LABELS,
    );
    remove_keys(
        object,
        &["spec", "selector", "matchLabels"],
        JOB_GENERATED_SELECTOR_LABELS,
    );
    // A selector that was only the generated one goes: the member generates its own.
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let selector_empty = spec
        .get("selector")
        .and_then(Value::as_object)
        .is_some_and(|selector| {
            selector.iter().all(|(_, v)| match v {
                Value::Null => true,
                Value::Object(m) => m.is_empty(),
                Value::Array(a) => a.is_empty(),
                _ => false,
            })
        });
    if selector_empty {
        spec.remove("selector");
    }
}

/// The cluster IP(s) come from the hub's service range; a headless Service (`None`) keeps its.
fn service(object: &mut Map<String, Value>) {
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
    if !headless {
        spec.remove("clusterIP");
        spec.remove("clusterIPs");
    }
}

/// A claim bound on the hub carries the hub's binding: its annotations, and the volume the hub's
/// controller chose (`bound-by-controller`); a volume the user named is kept.
fn persistent_volume_claim(object: &mut Map<String, Value>) {
    let bound_by_controller = object
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get("pv.kubernetes.io/bound-by-controller"))
        .and_then(Value::as_str)
        == Some("yes");
    remove_keys(
        object,
        &["metadata", "annotations"],
        PVC_BINDING_ANNOTATIONS,
    );
    if bound_by_controller && let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut)
    {
        spec.remove("volumeName");
    }
}

/// The legacy token Secrets generated for a service account (`<name>-token-<random>`).
fn service_account(object: &mut Map<String, Value>) {
    let prefix = format!(
        "{}-token-",
        object
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
    );
    let Some(secrets) = object.get_mut("secrets").and_then(Value::as_array_mut) else {
        return;
    };
    secrets.retain(|s| {
        !s.get("name")
            .and_then(Value::as_str)
            .is_some_and(|name| name.starts_with(&prefix))
    });
    if secrets.is_empty() {
        object.remove("secrets");
    }
}

/// A service-account token Secret is filled by the hub's token controller for the hub's service
/// account (its UID): the member's fills it for its own. The member's controller deletes a token
/// Secret whose UID annotation names another account.
fn secret(object: &mut Map<String, Value>) {
    if object.get("type").and_then(Value::as_str) != Some("kubernetes.io/service-account-token") {
        return;
    }
    object.remove("data");
    remove_keys(
        object,
        &["metadata", "annotations"],
        &[SERVICE_ACCOUNT_UID_ANNOTATION],
    );
}

/// The hub's service-account admission mounted a projected token volume into the Pod; the
/// member's mounts its own.
fn pod(object: &mut Map<String, Value>) {
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let mut removed = Vec::new();
    if let Some(volumes) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
        volumes.retain(|volume| {
            let name = volume
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let token = name.starts_with(SERVICE_ACCOUNT_VOLUME_PREFIX)
                && volume
                    .get("projected")
                    .and_then(|p| p.get("sources"))
                    .and_then(Value::as_array)
                    .is_some_and(|sources| {
                        sources
                            .iter()
                            .any(|s| s.get("serviceAccountToken").is_some())
                    });
            if token {
                removed.push(name.to_string());
            }
            !token
        });
        if volumes.is_empty() {
            spec.remove("volumes");
        }
    }
    if removed.is_empty() {
        return;
    }
    for containers in ["initContainers", "containers", "ephemeralContainers"] {
        let Some(list) = spec.get_mut(containers).and_then(Value::as_array_mut) else {
            continue;
        };
        for container in list.iter_mut().filter_map(Value::as_object_mut) {
            let Some(mounts) = container
                .get_mut("volumeMounts")
                .and_then(Value::as_array_mut)
            else {
                continue;
            };
            mounts.retain(|m| {
                !m.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|name| removed.iter().any(|r| r == name))
            });
            if mounts.is_empty() {
                container.remove("volumeMounts");
            }
        }
    }
}

/// Removes `keys` from the map at `path`; the map goes too when that leaves it empty.
fn remove_keys(object: &mut Map<String, Value>, path: &[&str], keys: &[&str]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut parent = object;
    for step in parents {
        match parent.get_mut(*step).and_then(Value::as_object_mut) {
            Some(next) => parent = next,
            None => return,
        }
    }
    let Some(map) = parent.get_mut(*last).and_then(Value::as_object_mut) else {
        return;
    };
    for key in keys {
        map.remove(*key);
    }
    if map.is_empty() {
        parent.remove(*last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pruned(mut manifest: Value) -> Value {
        remove_generated(&mut manifest);
        manifest
    }

    /// A Job as the hub's API server stores it (its UID `hub-uid`).
    fn hub_job(manual: Option<bool>) -> Value {
        let mut job = json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "ml", "labels": {"team": "a"}},
            "spec": {
                "backoffLimit": 6, "completions": 1, "parallelism": 1,
                "ttlSecondsAfterFinished": 60,
                "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "hub-uid"}},
                "template": {
                    "metadata": {"labels": {
                        "app": "train",
                        "controller-uid": "hub-uid", "batch.kubernetes.io/controller-uid": "hub-uid",
                        "job-name": "train", "batch.kubernetes.io/job-name": "train"}},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}
                }
            }
        });
        if let Some(manual) = manual {
            job["spec"]["manualSelector"] = json!(manual);
        }
        job
    }

    #[test]
    fn a_jobs_generated_selector_and_pod_labels_go_and_its_own_stay() {
        for manual in [None, Some(false)] {
            let job = pruned(hub_job(manual));
            assert_eq!(job["spec"].get("selector"), None, "{manual:?}");
            assert_eq!(
                job["spec"]["template"]["metadata"]["labels"],
                json!({"app": "train"}),
                "{manual:?}"
            );
            assert_eq!(job["spec"].get("ttlSecondsAfterFinished"), None);
            assert_eq!(job["spec"]["backoffLimit"], 6, "defaults are kept");
            assert_eq!(job["metadata"]["labels"], json!({"team": "a"}));
        }
        // A selector the user added to the generated one keeps the user's part.
        let mut job = hub_job(None);
        job["spec"]["selector"]["matchLabels"]["app"] = json!("train");
        job["spec"]["selector"]["matchExpressions"] =
            json!([{"key": "tier", "operator": "Exists"}]);
        let job = pruned(job);
        assert_eq!(
            job["spec"]["selector"],
            json!({"matchLabels": {"app": "train"},
                   "matchExpressions": [{"key": "tier", "operator": "Exists"}]})
        );
        // Only the generated labels: the template's label map goes.
        let mut job = hub_job(None);
        job["spec"]["template"]["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("app");
        let job = pruned(job);
        assert_eq!(job["spec"]["template"]["metadata"], json!({}));
    }

    #[test]
    fn a_job_with_a_manual_selector_keeps_it() {
        let mut job = hub_job(Some(true));
        job["spec"]["selector"] = json!({"matchLabels": {"controller-uid": "mine"}});
        let expected = {
            let mut e = job.clone();
            e["spec"]
                .as_object_mut()
                .unwrap()
                .remove("ttlSecondsAfterFinished");
            e
        };
        assert_eq!(pruned(job), expected);
    }

    #[test]
    fn other_versions_of_the_group_and_other_groups_kinds() {
        // Any version of batch.
        let mut job = hub_job(None);
        job["apiVersion"] = json!("batch/v2");
        assert_eq!(pruned(job)["spec"].get("selector"), None);
        // A Job of another group is not the Job API's.
        let mut other = hub_job(None);
        other["apiVersion"] = json!("example.com/v1");
        assert_eq!(pruned(other.clone()), other);
        // Kinds without a rule, and non-objects, are unchanged.
        let job_spec = hub_job(None)["spec"].clone();
        let jobset = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "j"},
            "spec": {"replicatedJobs": [{"name": "w", "template": job_spec}]}});
        assert_eq!(pruned(jobset.clone()), jobset);
        assert_eq!(pruned(json!("text")), json!("text"));
        assert_eq!(pruned(json!({"kind": "Job"})), json!({"kind": "Job"}));
    }

    #[test]
    fn a_deployment_loses_the_controllers_revision_annotations() {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "annotations": {
                "deployment.kubernetes.io/revision": "3",
                "deployment.kubernetes.io/revision-history": "1,2",
                "keep": "me"}},
            "spec": {"replicas": 2}});
        let out = pruned(deployment);
        assert_eq!(out["metadata"]["annotations"], json!({"keep": "me"}));
        assert_eq!(out["spec"]["replicas"], 2);
        let only = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "annotations": {"deployment.kubernetes.io/revision": "1"}}});
        assert_eq!(pruned(only)["metadata"], json!({"name": "web"}));
    }

    #[test]
    fn a_service_loses_its_hub_cluster_ip_unless_headless_and_keeps_its_ports() {
        let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"type": "NodePort", "clusterIP": "10.0.0.17", "clusterIPs": ["10.0.0.17"],
                     "ipFamilies": ["IPv4"],
                     "ports": [{"port": 80, "nodePort": 30080}]}});
        assert_eq!(
            pruned(service)["spec"],
            json!({"type": "NodePort", "ipFamilies": ["IPv4"],
                   "ports": [{"port": 80, "nodePort": 30080}]})
        );
        let headless = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"clusterIP": "None", "clusterIPs": ["None"]}});
        assert_eq!(pruned(headless.clone()), headless);
    }

    #[test]
    fn a_claim_loses_the_hubs_binding_but_keeps_a_volume_the_user_named() {
        let bound = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "annotations": {
                "pv.kubernetes.io/bind-completed": "yes",
                "pv.kubernetes.io/bound-by-controller": "yes",
                "volume.kubernetes.io/selected-node": "hub-node",
                "volume.kubernetes.io/storage-provisioner": "ebs.csi.aws.com",
                "volume.beta.kubernetes.io/storage-provisioner": "ebs.csi.aws.com",
                "team": "a"}},
            "spec": {"volumeName": "pvc-123", "storageClassName": "gp3"}});
        let out = pruned(bound);
        assert_eq!(out["metadata"]["annotations"], json!({"team": "a"}));
        assert_eq!(out["spec"], json!({"storageClassName": "gp3"}));
        // Pre-bound by the user: the volume stays, the hub's completion mark goes.
        let prebound = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"volumeName": "shared-nfs"}});
        let out = pruned(prebound);
        assert_eq!(out["spec"]["volumeName"], "shared-nfs");
        assert_eq!(out["metadata"].get("annotations"), None);
    }

    #[test]
    fn a_service_account_loses_its_generated_token_secrets() {
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "runner"},
            "secrets": [{"name": "runner-token-x7k2p"}, {"name": "registry-pull"}]});
        assert_eq!(pruned(sa)["secrets"], json!([{"name": "registry-pull"}]));
        let only = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "runner"},
            "secrets": [{"name": "runner-token-x7k2p"}]});
        assert_eq!(pruned(only).get("secrets"), None);
    }

    #[test]
    fn a_token_secret_loses_the_hubs_token_and_account_uid() {
        let token = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
            "metadata": {"name": "t", "annotations": {
                "kubernetes.io/service-account.name": "runner",
                "kubernetes.io/service-account.uid": "hub-sa-uid"}},
            "data": {"token": "aHVi"}});
        assert_eq!(
            pruned(token),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
                "metadata": {"name": "t", "annotations": {"kubernetes.io/service-account.name": "runner"}}})
        );
        let opaque = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "o", "annotations": {"kubernetes.io/service-account.uid": "x"}},
            "data": {"k": "dg=="}});
        assert_eq!(pruned(opaque.clone()), opaque);
    }

    #[test]
    fn a_pod_loses_the_hubs_token_volume_and_its_mounts_only() {
        let token_volume = json!({"name": "kube-api-access-9xk2d", "projected": {"sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt"}}]}});
        let mount = json!({"name": "kube-api-access-9xk2d", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true});
        let own_mount = json!({"name": "data", "mountPath": "/data"});
        // A volume of that prefix without a token source is the user's.
        let look_alike = json!({"name": "kube-api-access-mine", "emptyDir": {}});
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"nodeName": "pinned", "serviceAccountName": "default",
                "volumes": [token_volume, {"name": "data", "emptyDir": {}}, look_alike],
                "initContainers": [{"name": "i", "volumeMounts": [mount]}],
                "containers": [{"name": "c", "volumeMounts": [mount, own_mount]}]}});
        let out = pruned(pod);
        assert_eq!(
            out["spec"],
            json!({"nodeName": "pinned", "serviceAccountName": "default",
                "volumes": [{"name": "data", "emptyDir": {}}, look_alike],
                "initContainers": [{"name": "i"}],
                "containers": [{"name": "c", "volumeMounts": [own_mount]}]})
        );
        let plain = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c"}]}});
        assert_eq!(pruned(plain.clone()), plain);
    }
}
