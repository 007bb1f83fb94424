//! Lifeboat's built-in interpreters (`interpreter-scripts/`), embedded in the binary.

use crate::error::CustomizationError;
use crate::interpreter::Interpreter;

macro_rules! builtin {
    ($path:literal) => {
        (
            $path,
            include_str!(concat!(
                "../../interpreter-scripts/",
                $path,
                "/customizations.yaml"
            )),
        )
    };
}

/// (folder, YAML) of every built-in customization.
pub const CUSTOMIZATIONS: &[(&str, &str)] = &[
    builtin!("apps/v1/DaemonSet"),
    builtin!("apps/v1/Deployment"),
    builtin!("apps/v1/StatefulSet"),
    builtin!("batch/v1/Job"),
    builtin!("core/v1/Pod"),
    builtin!("jobset.x-k8s.io/v1alpha2/JobSet"),
    builtin!("kubeflow.org/v1/PyTorchJob"),
    builtin!("leaderworkerset.x-k8s.io/v1/LeaderWorkerSet"),
    builtin!("ray.io/v1/RayJob"),
    builtin!("workload.codeflare.dev/v1beta2/AppWrapper"),
];

/// Loads every built-in customization into an interpreter.
pub fn load(interpreter: &mut Interpreter) -> Result<usize, CustomizationError> {
    let mut count = 0;
    for (_, yaml) in CUSTOMIZATIONS {
        count += interpreter.add_yaml(yaml)?;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::runtime::{Runtime, RuntimeConfig};

    #[test]
    fn every_builtin_loads_and_compiles() {
        let mut interpreter = Interpreter::new(Arc::new(Runtime::new(RuntimeConfig::default())));
        assert_eq!(load(&mut interpreter).unwrap(), CUSTOMIZATIONS.len());
        let job =
            serde_json::json!({"apiVersion": "batch/v1", "kind": "Job", "status": {"active": 1}});
        assert_eq!(
            interpreter
                .interpret_health(&job)
                .unwrap()
                .unwrap()
                .healthy(),
            Some(true)
        );
        assert!(interpreter.has("batch/v1", "Job", crate::Operation::InterpretHealth));
        assert!(interpreter.has(
            "workload.codeflare.dev/v1beta2",
            "AppWrapper",
            crate::Operation::InterpretComponent
        ));
    }
}
