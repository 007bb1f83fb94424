//! The `kube` Lua module (`local kube = require("kube")`): Karmada's helpers for quantities and
//! pod templates.
//!
//! Arguments are bounded before Rust copies them: quantity and namespace strings by length,
//! pod templates by the result limits (`Limits::result_nodes`, `result_bytes`,
//! `result_depth`) and the evaluation's deadline. Results are tables with the sandbox's
//! insertion-order metatable.

use std::sync::Arc;

use lifeboat_api::quantity::Quantity;
use mlua::{Lua, MultiValue, Table, Value as LuaValue};

use crate::convert::{EncodeError, float_to_lua, json_to_lua_with, lua_to_json_with};
use crate::empty::repair_empty_tables;
use crate::error::Limit;
use crate::pod;
use crate::sandbox::Budget;

/// Longest quantity string accepted (Kubernetes quantities are a few dozen bytes).
pub const MAX_QUANTITY_BYTES: usize = 128;
/// Longest namespace accepted (a DNS subdomain).
pub const MAX_NAMESPACE_BYTES: usize = 253;

fn arg_error(function: &str, position: usize, expected: &str, got: &LuaValue) -> mlua::Error {
    mlua::Error::runtime(format!(
        "bad argument #{position} to '{function}' ({expected} expected, got {})",
        got.type_name()
    ))
}

/// A string argument no longer than `max` bytes, copied only once its length is known.
fn short_string(
    function: &str,
    position: usize,
    value: &mlua::LuaString,
    max: usize,
) -> mlua::Result<String> {
    let bytes = value.as_bytes();
    if bytes.len() > max {
        return Err(mlua::Error::runtime(format!(
            "bad argument #{position} to '{function}' (string of {} bytes, at most {max} accepted)",
            bytes.len()
        )));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A pod template passed from Lua, as Karmada converts it (empty tables dropped), within the
/// result limits.
fn template_from_lua(
    function: &str,
    value: &LuaValue,
    budget: &Budget,
) -> mlua::Result<serde_json::Value> {
    if !value.is_table() {
        return Err(arg_error(function, 1, "table", value));
    }
    let json = lua_to_json_with(value, budget.bounds(), &|_| None).map_err(|e| match e {
        EncodeError::Limit(limit) => {
            if limit == Limit::WallClock {
                // Out of time inside Rust: stop the script as the hook would.
                budget.trip_wall_clock();
            }
            mlua::Error::runtime(format!(
                "{function}: argument #1: {}",
                budget.limits().exceeded(limit)
            ))
        }
        EncodeError::Invalid(message) => mlua::Error::runtime(format!("{function}: {message}")),
    })?;
    Ok(repair_empty_tables(json, true, &[]))
}

/// Builds the module table.
pub(crate) fn module(lua: &Lua, ordered: Table, budget: Arc<Budget>) -> mlua::Result<Table> {
    let module = lua.create_table()?;

    module.raw_set(
        "resourceAdd",
        lua.create_function(|_, args: MultiValue| {
            let mut sum = Quantity::ZERO;
            for (i, arg) in args.iter().enumerate() {
                let quantity = match arg {
                    LuaValue::Nil => continue,
                    LuaValue::String(s) => {
                        let text = short_string("resourceAdd", i + 1, s, MAX_QUANTITY_BYTES)?;
                        Quantity::parse(&text)
                            .map_err(|e| mlua::Error::runtime(format!("resourceAdd: {e}")))?
                    }
                    other => return Err(arg_error("resourceAdd", i + 1, "string", other)),
                };
                sum = sum
                    .checked_add(&quantity)
                    .ok_or_else(|| mlua::Error::runtime("resourceAdd: quantity overflow"))?;
            }
            Ok(sum.canonical())
        })?,
    )?;

    let (requirements_budget, requirements_ordered) = (budget.clone(), ordered.clone());
    module.raw_set(
        "accuratePodRequirements",
        lua.create_function(move |lua, args: MultiValue| {
            if args.len() != 1 {
                return Err(mlua::Error::runtime(
                    "accuratePodRequirements only accepts one argument",
                ));
            }
            let template =
                template_from_lua("accuratePodRequirements", &args[0], &requirements_budget)?;
            match pod::replica_requirements(&template)
                .map_err(|e| mlua::Error::runtime(format!("accuratePodRequirements: {e}")))?
            {
                Some(requirements) => {
                    json_to_lua_with(lua, &requirements, Some(&requirements_ordered))
                }
                None => Ok(LuaValue::Nil),
            }
        })?,
    )?;

    module.raw_set(
        "getPodDependencies",
        lua.create_function(move |lua, args: MultiValue| {
            if args.len() != 2 {
                return Err(mlua::Error::runtime(
                    "getPodDependencies only accepts two arguments",
                ));
            }
            let template = template_from_lua("getPodDependencies", &args[0], &budget)?;
            let namespace = match &args[1] {
                LuaValue::Nil => "default".to_string(),
                LuaValue::String(s) => {
                    short_string("getPodDependencies", 2, s, MAX_NAMESPACE_BYTES)?
                }
                LuaValue::Integer(i) => i.to_string(),
                LuaValue::Number(n) => n.to_string(),
                other => return Err(arg_error("getPodDependencies", 2, "string", other)),
            };
            let dependencies = pod::pod_dependencies(&template, &namespace)
                .map_err(|e| mlua::Error::runtime(format!("getPodDependencies: {e}")))?;
            json_to_lua_with(lua, &serde_json::Value::Array(dependencies), Some(&ordered))
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
                LuaValue::String(s) => {
                    short_string("getResourceQuantity", 1, s, MAX_QUANTITY_BYTES)?
                }
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
