//! JSON <-> Lua conversion with Karmada's observable behaviour.
//!
//! Into Lua: `null` fields are absent (nil), `null` list items are skipped, integral numbers
//! become Lua integers (so `tostring(3)` is `"3"` as in Karmada, whose numbers print without a
//! fraction), other numbers floats.
//!
//! Out of Lua: a table whose keys are exactly `1..n` is a list, any other non-empty table an
//! object (numeric keys become strings), an empty table is `[]` (see [`crate::empty`]);
//! integral floats become integers; functions, userdata and non-finite numbers are errors.

use mlua::{Lua, Table, Value as LuaValue};
use serde_json::{Map, Number, Value};

/// Deepest nesting accepted from Lua: guards against self-referencing tables.
const MAX_DEPTH: usize = 200;

/// Converts a JSON value to a Lua value.
pub fn json_to_lua(lua: &Lua, value: &Value) -> mlua::Result<LuaValue> {
    Ok(match value {
        Value::Null => LuaValue::Nil,
        Value::Bool(b) => LuaValue::Boolean(*b),
        Value::Number(n) => number_to_lua(n),
        Value::String(s) => LuaValue::String(lua.create_string(s)?),
        Value::Array(items) => LuaValue::Table(array_to_lua(lua, items)?),
        Value::Object(map) => LuaValue::Table(object_to_lua(lua, map)?),
    })
}

pub(crate) fn number_to_lua(n: &Number) -> LuaValue {
    if let Some(i) = n.as_i64() {
        return LuaValue::Integer(i);
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    float_to_lua(f)
}

pub(crate) fn float_to_lua(f: f64) -> LuaValue {
    if f.fract() == 0.0 && (-9.223_372_036_854_775e18..9.223_372_036_854_775e18).contains(&f) {
        LuaValue::Integer(f as i64)
    } else {
        LuaValue::Number(f)
    }
}

pub(crate) fn array_to_lua(lua: &Lua, items: &[Value]) -> mlua::Result<Table> {
    let table = lua.create_table_with_capacity(items.len(), 0)?;
    let mut index = 1;
    for item in items {
        if item.is_null() {
            continue;
        }
        table.raw_set(index, json_to_lua(lua, item)?)?;
        index += 1;
    }
    Ok(table)
}

pub(crate) fn object_to_lua(lua: &Lua, map: &Map<String, Value>) -> mlua::Result<Table> {
    let table = lua.create_table_with_capacity(0, map.len())?;
    for (key, item) in map {
        if item.is_null() {
            continue;
        }
        table.raw_set(key.as_str(), json_to_lua(lua, item)?)?;
    }
    Ok(table)
}

/// Why a Lua value could not become JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EncodeError(pub String);

/// Resolves a table that stands for a JSON value not yet converted to Lua.
pub type Resolver<'r> = &'r dyn Fn(&Table) -> Option<Value>;

/// Converts a Lua value to JSON (empty tables as `[]`).
pub fn lua_to_json(value: &LuaValue) -> Result<Value, EncodeError> {
    encode(value, 0, &|_| None)
}

/// Like [`lua_to_json`], with lazy tables resolved to their source.
pub fn lua_to_json_with(value: &LuaValue, resolve: Resolver<'_>) -> Result<Value, EncodeError> {
    encode(value, 0, resolve)
}

/// A JSON value as it comes back after a trip through Lua: nulls dropped, empty objects and
/// lists as `[]`, integral numbers as integers.
pub fn lua_shaped(value: &Value) -> Value {
    match value {
        Value::Number(n) => match number_to_lua(n) {
            LuaValue::Integer(i) => Value::Number(i.into()),
            _ => value.clone(),
        },
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|v| !v.is_null())
                .map(lua_shaped)
                .collect(),
        ),
        Value::Object(map) => {
            let shaped: Map<String, Value> = map
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), lua_shaped(v)))
                .collect();
            if shaped.is_empty() {
                Value::Array(Vec::new())
            } else {
                Value::Object(shaped)
            }
        }
        other => other.clone(),
    }
}

fn encode(value: &LuaValue, depth: usize, resolve: Resolver<'_>) -> Result<Value, EncodeError> {
    Ok(match value {
        LuaValue::Nil => Value::Null,
        LuaValue::Boolean(b) => Value::Bool(*b),
        LuaValue::Integer(i) => Value::Number((*i).into()),
        LuaValue::Number(f) => float_to_json(*f)?,
        LuaValue::String(s) => Value::String(s.to_string_lossy()),
        LuaValue::Table(table) => match resolve(table) {
            Some(source) => source,
            None => encode_table(table, depth, resolve)?,
        },
        other => {
            return Err(EncodeError(format!(
                "cannot encode a Lua {} as JSON",
                other.type_name()
            )));
        }
    })
}

pub(crate) fn float_to_json(f: f64) -> Result<Value, EncodeError> {
    if !f.is_finite() {
        return Err(EncodeError(format!("cannot encode the number {f} as JSON")));
    }
    if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
        return Ok(Value::Number((f as i64).into()));
    }
    Number::from_f64(f)
        .map(Value::Number)
        .ok_or_else(|| EncodeError(format!("cannot encode the number {f} as JSON")))
}

fn encode_table(table: &Table, depth: usize, resolve: Resolver<'_>) -> Result<Value, EncodeError> {
    if depth >= MAX_DEPTH {
        return Err(EncodeError(
            "table nesting too deep (a table that contains itself?)".to_string(),
        ));
    }
    let mut entries: Vec<(LuaValue, LuaValue)> = Vec::new();
    for pair in table.pairs::<LuaValue, LuaValue>() {
        let pair = pair.map_err(|e| EncodeError(e.to_string()))?;
        entries.push(pair);
    }
    if entries.is_empty() {
        return Ok(Value::Array(Vec::new()));
    }
    // A list when the keys are exactly 1..n.
    let mut indexed: Vec<(i64, &LuaValue)> = Vec::with_capacity(entries.len());
    let mut is_list = true;
    for (key, item) in &entries {
        match key {
            LuaValue::Integer(i) if *i >= 1 => indexed.push((*i, item)),
            _ => {
                is_list = false;
                break;
            }
        }
    }
    if is_list {
        indexed.sort_unstable_by_key(|(i, _)| *i);
        if indexed
            .iter()
            .enumerate()
            .all(|(pos, (i, _))| *i == pos as i64 + 1)
        {
            let mut items = Vec::with_capacity(indexed.len());
            for (_, item) in indexed {
                items.push(encode(item, depth + 1, resolve)?);
            }
            return Ok(Value::Array(items));
        }
    }
    let mut map = Map::new();
    for (key, item) in &entries {
        let key = match key {
            LuaValue::String(s) => s.to_string_lossy(),
            LuaValue::Integer(i) => i.to_string(),
            LuaValue::Number(f) => f.to_string(),
            other => {
                return Err(EncodeError(format!(
                    "cannot encode a table with a {} key as JSON",
                    other.type_name()
                )));
            }
        };
        map.insert(key, encode(item, depth + 1, resolve)?);
    }
    Ok(Value::Object(map))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_keeps_karmada_shapes() {
        let lua = Lua::new();
        let input = json!({
            "a": 3, "b": 2.5, "c": 2.0, "d": null, "e": [1, null, 2], "f": {}, "g": [], "s": "x"
        });
        let value = json_to_lua(&lua, &input).unwrap();
        let table = value.as_table().unwrap();
        assert!(matches!(
            table.raw_get::<LuaValue>("a").unwrap(),
            LuaValue::Integer(3)
        ));
        assert!(matches!(
            table.raw_get::<LuaValue>("c").unwrap(),
            LuaValue::Integer(2)
        ));
        assert!(table.raw_get::<LuaValue>("d").unwrap().is_nil());
        let back = lua_to_json(&value).unwrap();
        assert_eq!(
            back,
            json!({"a": 3, "b": 2.5, "c": 2, "e": [1, 2], "f": [], "g": [], "s": "x"})
        );
    }

    #[test]
    fn tables_become_lists_or_objects() {
        let lua = Lua::new();
        let v: LuaValue = lua
            .load("return {list = {'a', 'b'}, sparse = {[1] = 'a', [3] = 'c'}, half = 4 / 2}")
            .eval()
            .unwrap();
        assert_eq!(
            lua_to_json(&v).unwrap(),
            json!({"list": ["a", "b"], "sparse": {"1": "a", "3": "c"}, "half": 2})
        );
    }

    #[test]
    fn functions_and_cycles_are_errors() {
        let lua = Lua::new();
        let f: LuaValue = lua.load("return {f = function() end}").eval().unwrap();
        assert!(lua_to_json(&f).is_err());
        let cycle: LuaValue = lua
            .load("local t = {}; t.self = t; return t")
            .eval()
            .unwrap();
        assert!(lua_to_json(&cycle).is_err());
        let nan: LuaValue = lua.load("return 0/0").eval().unwrap();
        assert!(lua_to_json(&nan).is_err());
    }
}
