//! `ResourceInterpreterCustomization` documents (`config.lifeboat.dev/v1alpha1` and Karmada's
//! `config.karmada.io/v1alpha1`, same schema).

use serde::{Deserialize, Serialize};

use crate::error::CustomizationError;
use crate::operation::Operation;

/// API versions accepted for customization documents.
pub const API_VERSIONS: [&str; 2] = ["config.lifeboat.dev/v1alpha1", "config.karmada.io/v1alpha1"];
pub const KIND: &str = "ResourceInterpreterCustomization";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceInterpreterCustomization {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: Metadata,
    pub spec: CustomizationSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CustomizationSpec {
    pub target: CustomizationTarget,
    #[serde(default)]
    pub customizations: Customizations,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CustomizationTarget {
    pub api_version: String,
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LuaScript {
    pub lua_script: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Customizations {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<LuaScript>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_resource: Option<LuaScript>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component_resource: Option<LuaScript>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_revision: Option<LuaScript>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reflection: Option<LuaScript>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_aggregation: Option<LuaScript>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_interpretation: Option<LuaScript>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency_interpretation: Option<LuaScript>,
}

impl Customizations {
    /// The script for an operation, if defined and not blank.
    pub fn script(&self, operation: Operation) -> Option<&str> {
        let script = match operation {
            Operation::Retain => &self.retention,
            Operation::InterpretReplica => &self.replica_resource,
            Operation::InterpretComponent => &self.component_resource,
            Operation::ReviseReplica => &self.replica_revision,
            Operation::InterpretStatus => &self.status_reflection,
            Operation::AggregateStatus => &self.status_aggregation,
            Operation::InterpretHealth => &self.health_interpretation,
            Operation::InterpretDependency => &self.dependency_interpretation,
        };
        script
            .as_ref()
            .map(|s| s.lua_script.as_str())
            .filter(|s| !s.trim().is_empty())
    }

    /// The operations this customization defines.
    pub fn operations(&self) -> Vec<Operation> {
        Operation::ALL
            .into_iter()
            .filter(|op| self.script(*op).is_some())
            .collect()
    }
}

impl ResourceInterpreterCustomization {
    /// Parses every document of a YAML (or JSON) text; empty documents are skipped.
    pub fn parse_documents(
        text: &str,
    ) -> Result<Vec<ResourceInterpreterCustomization>, CustomizationError> {
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(text)
            .map_err(|e| CustomizationError::Parse(e.to_string()))?;
        docs.into_iter()
            .filter(|doc| !doc.is_null())
            .map(|doc| {
                let c: ResourceInterpreterCustomization = serde_json::from_value(doc)
                    .map_err(|e| CustomizationError::Parse(e.to_string()))?;
                c.validate()?;
                Ok(c)
            })
            .collect()
    }

    /// Checks the document header and target.
    pub fn validate(&self) -> Result<(), CustomizationError> {
        let invalid = |reason: String| CustomizationError::Invalid {
            name: self.metadata.name.clone(),
            reason,
        };
        if !API_VERSIONS.contains(&self.api_version.as_str()) {
            return Err(invalid(format!(
                "apiVersion must be one of {}, got {:?}",
                API_VERSIONS.join(", "),
                self.api_version
            )));
        }
        if self.kind != KIND {
            return Err(invalid(format!("kind must be {KIND}, got {:?}", self.kind)));
        }
        if self.metadata.name.is_empty() {
            return Err(invalid("metadata.name is required".to_string()));
        }
        if self.spec.target.api_version.is_empty() {
            return Err(invalid("spec.target.apiVersion is required".to_string()));
        }
        if self.spec.target.kind.is_empty() {
            return Err(invalid("spec.target.kind is required".to_string()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"
apiVersion: config.karmada.io/v1alpha1
kind: ResourceInterpreterCustomization
metadata:
  name: example
spec:
  target:
    apiVersion: apps/v1
    kind: Deployment
  customizations:
    healthInterpretation:
      luaScript: |
        function InterpretHealth(obj) return true end
    componentRevision:
      luaScript: "ignored: newer Karmada field"
---
"#;

    #[test]
    fn parses_karmada_documents() {
        let docs = ResourceInterpreterCustomization::parse_documents(DOC).unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].spec.target.kind, "Deployment");
        assert_eq!(
            docs[0].spec.customizations.operations(),
            vec![Operation::InterpretHealth]
        );
    }

    #[test]
    fn rejects_foreign_api_versions() {
        let doc = DOC.replace("config.karmada.io", "config.example.com");
        let err = ResourceInterpreterCustomization::parse_documents(&doc).unwrap_err();
        assert!(err.to_string().contains("apiVersion"), "{err}");
    }
}
