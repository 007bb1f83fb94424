//! `metadata`: name, generateName, namespace, labels and annotations carry over; finalizers and
//! owner references of the legacy deployment are dropped.

use std::collections::BTreeMap;

use kube::api::ObjectMeta;
use serde_json::Value;

use super::{ConvertError, Warning};

/// The AppWrapper's metadata; a missing name (and generateName) makes it unconvertible.
pub(super) fn convert_metadata(
    metadata: Option<&Value>,
    warnings: &mut Vec<Warning>,
) -> Result<ObjectMeta, ConvertError> {
    let mut out = ObjectMeta::default();
    let Some(metadata) = metadata.filter(|m| !m.is_null()) else {
        return Err(ConvertError::one(
            "metadata",
            "missing: an AppWrapper needs a name",
        ));
    };
    let Value::Object(metadata) = metadata else {
        return Err(ConvertError::one("metadata", "not a map"));
    };
    let string = |key: &str| -> Result<Option<String>, ConvertError> {
        match metadata.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ConvertError::one(format!("metadata.{key}"), "not a string")),
        }
    };
    let string_map = |key: &str| -> Result<Option<BTreeMap<String, String>>, ConvertError> {
        match metadata.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    _ => Err(ConvertError::one(
                        format!("metadata.{key}[{k}]"),
                        "not a string",
                    )),
                })
                .collect::<Result<BTreeMap<_, _>, _>>()
                .map(Some),
            Some(_) => Err(ConvertError::one(format!("metadata.{key}"), "not a map")),
        }
    };
    out.name = string("name")?;
    out.generate_name = string("generateName")?;
    out.namespace = string("namespace")?;
    out.labels = string_map("labels")?.filter(|m| !m.is_empty());
    out.annotations = string_map("annotations")?;
    if out.name.is_none() && out.generate_name.is_none() {
        return Err(ConvertError::one(
            "metadata.name",
            "missing: an AppWrapper needs a name or generateName",
        ));
    }
    // kubectl's record of the legacy object would confuse the next `kubectl apply`.
    if let Some(annotations) = &mut out.annotations {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    for (key, reason) in [
        (
            "finalizers",
            "dropped: MCAD's finalizers would block deletion under the v1beta2 controller",
        ),
        (
            "ownerReferences",
            "dropped: owner references name objects of the legacy deployment",
        ),
    ] {
        if metadata
            .get(key)
            .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
        {
            warnings.push(Warning {
                field: format!("metadata.{key}"),
                reason: reason.into(),
            });
        }
    }
    Ok(out)
}
