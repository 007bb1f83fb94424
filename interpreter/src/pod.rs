//! Pure pod-template helpers behind the `kube` Lua module: replica requirements (Karmada's
//! `GenerateReplicaRequirements`) and the objects a pod template depends on.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use lifeboat_api::quantity::{Quantity, QuantityFormat};

fn field<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut current = value;
    for key in path {
        current = current.as_object()?.get(*key)?;
    }
    if current.is_null() {
        None
    } else {
        Some(current)
    }
}

fn list<'a>(value: Option<&'a Value>, name: &str) -> Result<&'a [Value], String> {
    match value {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(format!("{name} must be a list, got {}", type_name(other))),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// Per-resource totals in the units Karmada keeps (milli-CPU, bytes, counts).
#[derive(Default)]
struct Resources {
    values: BTreeMap<String, i64>,
}

fn is_tracked(name: &str) -> bool {
    matches!(name, "cpu" | "memory" | "pods" | "ephemeral-storage")
        || name.starts_with("hugepages-")
        || name.starts_with("attachable-volumes-")
        || name.contains('/')
}

fn amount(name: &str, quantity: &Quantity) -> i64 {
    if name == "cpu" {
        quantity.milli_value()
    } else {
        quantity.value()
    }
}

fn resource_list(value: Option<&Value>, name: &str) -> Result<Vec<(String, Quantity)>, String> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let map = value
        .as_object()
        .ok_or_else(|| format!("{name} must be an object, got {}", type_name(value)))?;
    let mut out = Vec::with_capacity(map.len());
    for (resource, q) in map {
        if q.is_null() {
            continue;
        }
        let quantity = Quantity::from_json(q).map_err(|e| format!("{name}.{resource}: {e}"))?;
        out.push((resource.clone(), quantity));
    }
    Ok(out)
}

/// Requests of one container, defaulted from its limits (as the API server would).
fn container_requests(container: &Value, name: &str) -> Result<Vec<(String, Quantity)>, String> {
    let mut requests = resource_list(
        field(container, &["resources", "requests"]),
        &format!("{name}.resources.requests"),
    )?;
    let limits = resource_list(
        field(container, &["resources", "limits"]),
        &format!("{name}.resources.limits"),
    )?;
    for (resource, quantity) in limits {
        if !requests.iter().any(|(r, _)| *r == resource) {
            requests.push((resource, quantity));
        }
    }
    Ok(requests)
}

impl Resources {
    fn add(&mut self, list: &[(String, Quantity)]) {
        for (name, quantity) in list {
            if is_tracked(name) {
                let entry = self.values.entry(name.clone()).or_insert(0);
                *entry = entry.saturating_add(amount(name, quantity));
            }
        }
    }

    fn set_max(&mut self, list: &[(String, Quantity)]) {
        for (name, quantity) in list {
            if is_tracked(name) {
                let entry = self.values.entry(name.clone()).or_insert(0);
                *entry = (*entry).max(amount(name, quantity));
            }
        }
    }

    fn to_json(&self) -> Option<Value> {
        let mut out = Map::new();
        for (name, value) in &self.values {
            if *value <= 0 {
                continue;
            }
            let quantity = match name.as_str() {
                "cpu" => Quantity::new_milli(*value, QuantityFormat::DecimalSI),
                "memory" | "ephemeral-storage" => Quantity::new(*value, QuantityFormat::BinarySI),
                n if n.starts_with("hugepages-") => Quantity::new(*value, QuantityFormat::BinarySI),
                _ => Quantity::new(*value, QuantityFormat::DecimalSI),
            };
            out.insert(name.clone(), Value::String(quantity.canonical()));
        }
        if out.is_empty() {
            None
        } else {
            Some(Value::Object(out))
        }
    }
}

/// Keeps only the non-empty fields a typed Kubernetes object would re-serialize.
fn prune_empty(value: &Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::Array(items) => {
            let items: Vec<Value> = items.iter().filter_map(prune_empty).collect();
            if items.is_empty() {
                None
            } else {
                Some(Value::Array(items))
            }
        }
        Value::Object(map) => {
            let map: Map<String, Value> = map
                .iter()
                .filter_map(|(k, v)| prune_empty(v).map(|v| (k.clone(), v)))
                .collect();
            if map.is_empty() {
                None
            } else {
                Some(Value::Object(map))
            }
        }
        other => Some(other.clone()),
    }
}

/// The replica requirements of a pod template: node claim and summed resource requests.
/// Returns `None` when there is nothing to report.
pub fn replica_requirements(template: &Value) -> Result<Option<Value>, String> {
    if !template.is_object() {
        return Err(format!(
            "pod template must be an object, got {}",
            type_name(template)
        ));
    }
    let spec = field(template, &["spec"]);
    let empty = Value::Object(Map::new());
    let spec = spec.unwrap_or(&empty);

    let mut node_claim = Map::new();
    if let Some(selector) = field(spec, &["nodeSelector"]) {
        let map = selector.as_object().ok_or_else(|| {
            format!(
                "spec.nodeSelector must be an object, got {}",
                type_name(selector)
            )
        })?;
        node_claim.insert("nodeSelector".into(), Value::Object(map.clone()));
    }
    let tolerations = list(field(spec, &["tolerations"]), "spec.tolerations")?;
    if !tolerations.is_empty() {
        let pruned: Vec<Value> = tolerations
            .iter()
            .map(|t| prune_empty(t).unwrap_or(json!({})))
            .collect();
        node_claim.insert("tolerations".into(), Value::Array(pruned));
    }
    if let Some(affinity) = field(
        spec,
        &[
            "affinity",
            "nodeAffinity",
            "requiredDuringSchedulingIgnoredDuringExecution",
        ],
    ) {
        node_claim.insert(
            "hardNodeAffinity".into(),
            prune_empty(affinity).unwrap_or(json!({})),
        );
    }

    let mut resources = Resources::default();
    for (i, container) in list(field(spec, &["containers"]), "spec.containers")?
        .iter()
        .enumerate()
    {
        resources.add(&container_requests(
            container,
            &format!("spec.containers[{i}]"),
        )?);
    }
    for (i, container) in list(field(spec, &["initContainers"]), "spec.initContainers")?
        .iter()
        .enumerate()
    {
        resources.set_max(&container_requests(
            container,
            &format!("spec.initContainers[{i}]"),
        )?);
    }
    resources.add(&resource_list(field(spec, &["overhead"]), "spec.overhead")?);

    let mut out = Map::new();
    if !node_claim.is_empty() {
        out.insert("nodeClaim".into(), Value::Object(node_claim));
    }
    if let Some(requests) = resources.to_json() {
        out.insert("resourceRequest".into(), requests);
    }
    Ok(if out.is_empty() {
        None
    } else {
        Some(Value::Object(out))
    })
}

fn names_at(items: &[Value], path: &[&str], into: &mut BTreeSet<String>) {
    for item in items {
        if let Some(Value::String(name)) = field(item, path)
            && !name.is_empty()
        {
            into.insert(name.clone());
        }
    }
}

/// The ConfigMaps, Secrets, ServiceAccount and PersistentVolumeClaims a pod template uses, as
/// dependency references in `namespace`.
pub fn pod_dependencies(template: &Value, namespace: &str) -> Result<Vec<Value>, String> {
    if !template.is_object() {
        return Err(format!(
            "pod template must be an object, got {}",
            type_name(template)
        ));
    }
    let empty = Value::Object(Map::new());
    let spec = field(template, &["spec"]).unwrap_or(&empty);
    let mut config_maps = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    let mut claims = BTreeSet::new();

    let volumes = list(field(spec, &["volumes"]), "spec.volumes")?;
    names_at(volumes, &["configMap", "name"], &mut config_maps);
    names_at(volumes, &["secret", "secretName"], &mut secrets);
    names_at(
        volumes,
        &["persistentVolumeClaim", "claimName"],
        &mut claims,
    );
    for path in [
        &["azureFile", "secretName"][..],
        &["cephfs", "secretRef", "name"],
        &["cinder", "secretRef", "name"],
        &["flexVolume", "secretRef", "name"],
        &["rbd", "secretRef", "name"],
        &["scaleIO", "secretRef", "name"],
        &["iscsi", "secretRef", "name"],
        &["storageos", "secretRef", "name"],
        &["csi", "nodePublishSecretRef", "name"],
    ] {
        names_at(volumes, path, &mut secrets);
    }
    for volume in volumes {
        let sources = list(
            field(volume, &["projected", "sources"]),
            "spec.volumes[].projected.sources",
        )?;
        names_at(sources, &["configMap", "name"], &mut config_maps);
        names_at(sources, &["secret", "name"], &mut secrets);
    }
    names_at(
        list(field(spec, &["imagePullSecrets"]), "spec.imagePullSecrets")?,
        &["name"],
        &mut secrets,
    );
    for kind in ["containers", "initContainers", "ephemeralContainers"] {
        for container in list(field(spec, &[kind]), &format!("spec.{kind}"))? {
            let env_from = list(field(container, &["envFrom"]), "envFrom")?;
            names_at(env_from, &["configMapRef", "name"], &mut config_maps);
            names_at(env_from, &["secretRef", "name"], &mut secrets);
            let env = list(field(container, &["env"]), "env")?;
            names_at(
                env,
                &["valueFrom", "configMapKeyRef", "name"],
                &mut config_maps,
            );
            names_at(env, &["valueFrom", "secretKeyRef", "name"], &mut secrets);
        }
    }
    let mut accounts = BTreeSet::new();
    if let Some(Value::String(account)) = field(spec, &["serviceAccountName"])
        && !account.is_empty()
        && account != "default"
    {
        accounts.insert(account.clone());
    }

    let mut out = Vec::new();
    for (kind, names) in [
        ("ConfigMap", config_maps),
        ("Secret", secrets),
        ("ServiceAccount", accounts),
        ("PersistentVolumeClaim", claims),
    ] {
        for name in names {
            out.push(
                json!({"apiVersion": "v1", "kind": kind, "namespace": namespace, "name": name}),
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_sum_containers_max_init_add_overhead() {
        let template = json!({"spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": 2}}},
                {"resources": {"requests": {"cpu": "1", "memory": "512Mi", "foo": "3"}}}
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "4", "memory": "100Mi"}}}],
            "overhead": {"memory": "10Mi"},
            "nodeSelector": {"zone": "a"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "value": ""}]
        }});
        let got = replica_requirements(&template).unwrap().unwrap();
        assert_eq!(
            got,
            json!({
                "nodeClaim": {"nodeSelector": {"zone": "a"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]},
                "resourceRequest": {"cpu": "4", "memory": "1546Mi", "nvidia.com/gpu": "2"}
            })
        );
    }

    #[test]
    fn empty_template_has_no_requirements_and_bad_quantity_fails() {
        assert_eq!(replica_requirements(&json!({"spec": {}})).unwrap(), None);
        let bad = json!({"spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}});
        assert!(replica_requirements(&bad).unwrap_err().contains("cpu"));
    }

    #[test]
    fn dependencies_cover_volumes_env_and_accounts() {
        let template = json!({"spec": {
            "serviceAccountName": "runner",
            "imagePullSecrets": [{"name": "pull"}],
            "volumes": [
                {"configMap": {"name": "cm1"}},
                {"secret": {"secretName": "s1"}},
                {"persistentVolumeClaim": {"claimName": "data"}},
                {"projected": {"sources": [{"configMap": {"name": "cm2"}}]}}
            ],
            "containers": [{"env": [{"valueFrom": {"secretKeyRef": {"name": "s2"}}}], "envFrom": [{"configMapRef": {"name": "cm1"}}]}]
        }});
        let deps = pod_dependencies(&template, "ns").unwrap();
        let names: Vec<String> = deps
            .iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["name"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                "ConfigMap/cm1",
                "ConfigMap/cm2",
                "Secret/pull",
                "Secret/s1",
                "Secret/s2",
                "ServiceAccount/runner",
                "PersistentVolumeClaim/data"
            ]
        );
        assert!(deps.iter().all(|d| d["namespace"] == "ns"));
    }
}
