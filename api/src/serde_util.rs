//! Serde helpers shared by the API types.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::{Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer};

/// `field: null` (or a bare `field:` in YAML) means the same as an absent field: the apiserver
/// prunes such nulls, so files it accepts must deserialise too.
pub fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// metav1 Conditions as a list-map keyed by `type`, as upstream (`+listType=map`).
pub fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema
}

/// The schema of a list whose items are identified by `keys` (`x-kubernetes-list-type: map`),
/// so server-side apply merges items by key and lets different field managers own different
/// items.
pub fn list_map_schema<T: schemars::JsonSchema>(
    generator: &mut SchemaGenerator,
    keys: &[&str],
) -> Schema {
    let mut schema = generator.subschema_for::<Vec<T>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert("x-kubernetes-list-map-keys".into(), serde_json::json!(keys));
    schema
}
