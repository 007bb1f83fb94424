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
pub const CUSTOMIZATIONS: &[(&str, &str)] = &[builtin!("apps/v1/Deployment")];

/// Loads every built-in customization into an interpreter.
pub fn load(interpreter: &mut Interpreter) -> Result<usize, CustomizationError> {
    let mut count = 0;
    for (_, yaml) in CUSTOMIZATIONS {
        count += interpreter.add_yaml(yaml)?;
    }
    Ok(count)
}
