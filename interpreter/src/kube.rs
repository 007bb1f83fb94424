//! The `kube` Lua module (`local kube = require("kube")`): Karmada's helpers for quantities and
//! pod templates.

use mlua::{Lua, MultiValue, Table, Value as LuaValue};

use crate::convert::{float_to_lua, json_to_lua, lua_to_json};
use crate::empty::repair_empty_tables;
use crate::pod;
use lifeboat_api::quantity::Quantity;

fn arg_error(function: &str, position: usize, expected: &str, got: &LuaValue) -> mlua::Error {
    mlua::Error::runtime(format!(
        "bad argument #{position} to '{function}' ({expected} expected, got {})",
        got.type_name()
    ))
}

/// A pod template passed from Lua, as Karmada converts it (empty tables dropped).
fn template_from_lua(function: &str, value: &LuaValue) -> mlua::Result<serde_json::Value> {
    if !value.is_table() {
        return Err(arg_error(function, 1, "table", value));
    }
    let json = lua_to_json(value).map_err(|e| mlua::Error::runtime(format!("{function}: {e}")))?;
    Ok(repair_empty_tables(json, true, &[]))
}

/// Builds the module table.
pub fn module(lua: &Lua) -> mlua::Result<Table> {
    let module = lua.create_table()?;

    module.raw_set(
        "resourceAdd",
        lua.create_function(|_, args: MultiValue| {
            let mut sum = Quantity::ZERO;
            for (i, arg) in args.iter().enumerate() {
                let quantity = match arg {
                    LuaValue::Nil => continue,
                    LuaValue::String(s) => Quantity::parse(&s.to_string_lossy())
                        .map_err(|e| mlua::Error::runtime(format!("resourceAdd: {e}")))?,
                    other => return Err(arg_error("resourceAdd", i + 1, "string", other)),
                };
                sum = sum
                    .checked_add(&quantity)
                    .ok_or_else(|| mlua::Error::runtime("resourceAdd: quantity overflow"))?;
            }
            Ok(sum.canonical())
        })?,
    )?;

    module.raw_set(
        "accuratePodRequirements",
        lua.create_function(|lua, args: MultiValue| {
            if args.len() != 1 {
                return Err(mlua::Error::runtime(
                    "accuratePodRequirements only accepts one argument",
                ));
            }
            let template = template_from_lua("accuratePodRequirements", &args[0])?;
            match pod::replica_requirements(&template)
                .map_err(|e| mlua::Error::runtime(format!("accuratePodRequirements: {e}")))?
            {
                Some(requirements) => json_to_lua(lua, &requirements),
                None => Ok(LuaValue::Nil),
            }
        })?,
    )?;

    module.raw_set(
        "getPodDependencies",
        lua.create_function(|lua, args: MultiValue| {
            if args.len() != 2 {
                return Err(mlua::Error::runtime(
                    "getPodDependencies only accepts two arguments",
                ));
            }
            let template = template_from_lua("getPodDependencies", &args[0])?;
            let namespace = match &args[1] {
                LuaValue::Nil => "default".to_string(),
                LuaValue::String(s) => s.to_string_lossy(),
                LuaValue::Integer(i) => i.to_string(),
                LuaValue::Number(n) => n.to_string(),
                other => return Err(arg_error("getPodDependencies", 2, "string", other)),
            };
            let dependencies = pod::pod_dependencies(&template, &namespace)
                .map_err(|e| mlua::Error::runtime(format!("getPodDependencies: {e}")))?;
            json_to_lua(lua, &serde_json::Value::Array(dependencies))
        })?,
    )?;

    module.raw_set(
        "getResourceQuantity",
        lua.create_function(|_, args: MultiValue| {
            if args.len() != 1 {
                return Err(mlua::Error::runtime(
                    "getResourceQuantity only accepts one argument",
                ));
            }
            let text = match &args[0] {
                LuaValue::String(s) => s.to_string_lossy(),
                other => return Err(arg_error("getResourceQuantity", 1, "string", other)),
            };
            let quantity = Quantity::parse(&text)
                .map_err(|e| mlua::Error::runtime(format!("getResourceQuantity: {e}")))?;
            if quantity.is_negative() {
                return Err(mlua::Error::runtime(format!(
                    "getResourceQuantity: negative quantity {text:?}"
                )));
            }
            let value = quantity.as_f64();
            if !value.is_finite() {
                return Err(mlua::Error::runtime(format!(
                    "getResourceQuantity: {text:?} is too large"
                )));
            }
            Ok(float_to_lua(value))
        })?,
    )?;

    Ok(module)
}
