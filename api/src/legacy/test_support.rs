//! Legacy documents and checks shared by the conversion tests.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::Conversion;

pub(super) fn legacy(spec: Value) -> Value {
    json!({"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": "aw", "namespace": "ns"}, "spec": spec})
}

pub(super) fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name,
        "labels": {"appwrapper.mcad.ibm.com": "placeholder", "keep": "me"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox",
            "resources": {"requests": {"cpu": "500m"}}}]}})
}

pub(super) fn warned(conversion: &Conversion, field: &str) -> bool {
    conversion.warnings.iter().any(|w| w.field == field)
}

pub(super) fn annotations(conversion: &Conversion) -> BTreeMap<String, String> {
    conversion
        .appwrapper
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
}
