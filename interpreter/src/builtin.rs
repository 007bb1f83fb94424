//! Lifeboat's built-in interpreters (`interpreter-scripts/`), embedded in the binary.

use crate::error::CustomizationError;
use crate::interpreter::Interpreter;

/// (path, YAML) of every built-in customization.
pub const CUSTOMIZATIONS: &[(&str, &str)] = &[];

/// Loads every built-in customization into an interpreter.
pub fn load(interpreter: &mut Interpreter) -> Result<usize, CustomizationError> {
    let mut count = 0;
    for (_, yaml) in CUSTOMIZATIONS {
        count += interpreter.add_yaml(yaml)?;
    }
    Ok(count)
}
