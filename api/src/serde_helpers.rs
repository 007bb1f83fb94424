//! Serde and schema helpers shared by the API types and the interpreter's result types.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::{Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer};

/// `field: null` (or a bare `field:` in YAML) means the same as an absent field: the apiserver
/// prunes such nulls and Karmada's Go structs decode them as zero values, so documents they
/// accept must deserialise too. Use with `#[serde(default, deserialize_with = "null_as_default")]`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, Deserialize)]
    struct Example {
        #[serde(default, deserialize_with = "null_as_default")]
        name: String,
        #[serde(default, deserialize_with = "null_as_default")]
        items: Vec<u32>,
    }

    #[test]
    fn null_and_absent_are_the_default() {
        let null: Example = serde_json::from_str(r#"{"name": null, "items": null}"#).unwrap();
        let absent: Example = serde_json::from_str("{}").unwrap();
        assert_eq!(null, Example::default());
        assert_eq!(absent, Example::default());
        let set: Example = serde_json::from_str(r#"{"name": "a", "items": [1]}"#).unwrap();
        assert_eq!(set.name, "a");
        assert_eq!(set.items, [1]);
        assert!(serde_json::from_str::<Example>(r#"{"name": 1}"#).is_err());
    }
}
