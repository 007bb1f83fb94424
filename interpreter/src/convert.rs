//! JSON <-> Lua conversion with Karmada's observable behaviour.
//!
//! Into Lua: `null` fields are absent (nil), `null` list items are skipped, integral numbers
//! become Lua integers (so `tostring(3)` is `"3"` as in Karmada, whose numbers print without a
//! fraction), other numbers floats.
//!
//! Out of Lua: a table whose keys are exactly `1..n` is a list, any other non-empty table an
//! object (numeric keys become strings), an empty table is `[]` (see [`crate::empty`]);
//! integral floats become integers; functions, userdata and non-finite numbers are errors.
//!
//! Out of Lua is bounded ([`Bounds`]): a small table graph with shared references, or the input
//! object referenced many times, would otherwise expand without end on the Rust heap. Every
//! JSON value produced counts as a node, every string byte (keys and values) as a byte, and the
//! conversion stops with the limit that tripped (nodes, bytes, depth or the evaluation's
//! deadline) before it allocates past the bound.

use std::collections::HashMap;
use std::time::Instant;

use mlua::{Lua, Table, Value as LuaValue};
use serde_json::{Map, Number, Value};

use crate::error::Limit;

/// Converts a JSON value to a Lua value (plain tables).
pub fn json_to_lua(lua: &Lua, value: &Value) -> mlua::Result<LuaValue> {
    json_to_lua_with(lua, value, None)
}

/// Converts a JSON value to a Lua value; every table gets `metatable` (the sandbox's
/// insertion-order metatable, so keys a script adds later keep their order).
pub(crate) fn json_to_lua_with(
    lua: &Lua,
    value: &Value,
    metatable: Option<&Table>,
) -> mlua::Result<LuaValue> {
    Ok(match value {
        Value::Null => LuaValue::Nil,
        Value::Bool(b) => LuaValue::Boolean(*b),
        Value::Number(n) => number_to_lua(n),
        Value::String(s) => LuaValue::String(lua.create_string(s)?),
        Value::Array(items) => LuaValue::Table(array_to_lua(lua, items, metatable)?),
        Value::Object(map) => LuaValue::Table(object_to_lua(lua, map, metatable)?),
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

fn array_to_lua(lua: &Lua, items: &[Value], metatable: Option<&Table>) -> mlua::Result<Table> {
    let table = lua.create_table_with_capacity(items.len(), 0)?;
    let mut index = 1;
    for item in items {
        if item.is_null() {
            continue;
        }
        table.raw_set(index, json_to_lua_with(lua, item, metatable)?)?;
        index += 1;
    }
    table.set_metatable(metatable.cloned())?;
    Ok(table)
}

fn object_to_lua(
    lua: &Lua,
    map: &Map<String, Value>,
    metatable: Option<&Table>,
) -> mlua::Result<Table> {
    let table = lua.create_table_with_capacity(0, map.len())?;
    for (key, item) in map {
        if item.is_null() {
            continue;
        }
        table.raw_set(key.as_str(), json_to_lua_with(lua, item, metatable)?)?;
    }
    table.set_metatable(metatable.cloned())?;
    Ok(table)
}

/// Why a Lua value could not become JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The value has no JSON form (a function, a table key that is a table, NaN, ...).
    #[error("{0}")]
    Invalid(String),
    /// The conversion reached one of its [`Bounds`].
    #[error("{}", .0.message())]
    Limit(Limit),
}

/// Resolves a table that stands for a JSON value not yet converted to Lua.
pub type Resolver<'r> = &'r dyn Fn(&Table) -> Option<&'r Value>;

/// Bounds of one conversion out of Lua.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// JSON values produced (objects, lists and scalars each count one).
    pub nodes: u64,
    /// String bytes produced (object keys and string values).
    pub bytes: u64,
    /// Nesting levels.
    pub depth: usize,
    /// The evaluation's deadline, checked every few thousand nodes.
    pub deadline: Option<Instant>,
}

impl Default for Bounds {
    /// The bounds of [`crate::Limits::default`], without a deadline.
    fn default() -> Self {
        let limits = crate::Limits::default();
        Bounds {
            nodes: limits.result_nodes,
            bytes: limits.result_bytes,
            depth: limits.result_depth,
            deadline: None,
        }
    }
}

/// Nodes between two deadline checks.
const DEADLINE_CHECK_INTERVAL: u64 = 4096;

/// Converts a Lua value to JSON (empty tables as `[]`) within the default bounds.
pub fn lua_to_json(value: &LuaValue) -> Result<Value, EncodeError> {
    Encoder::new(Bounds::default(), &|_| None).encode(value, 0)
}

/// Like [`lua_to_json`], within `bounds`, with lazy tables resolved to their JSON source.
pub fn lua_to_json_with(
    value: &LuaValue,
    bounds: Bounds,
    resolve: Resolver<'_>,
) -> Result<Value, EncodeError> {
    Encoder::new(bounds, resolve).encode(value, 0)
}

/// A running conversion: what is left of the bounds.
pub(crate) struct Encoder<'r> {
    nodes_left: u64,
    bytes_left: u64,
    depth: usize,
    deadline: Option<Instant>,
    next_deadline_check: u64,
    resolve: Resolver<'r>,
    /// Size of resolved JSON sources, by address: returning the input object many times costs
    /// one walk of it, and is charged each time.
    sizes: HashMap<*const Value, (u64, u64)>,
}

impl<'r> Encoder<'r> {
    pub(crate) fn new(bounds: Bounds, resolve: Resolver<'r>) -> Encoder<'r> {
        Encoder {
            nodes_left: bounds.nodes,
            bytes_left: bounds.bytes,
            depth: bounds.depth,
            deadline: bounds.deadline,
            next_deadline_check: bounds.nodes.saturating_sub(DEADLINE_CHECK_INTERVAL),
            resolve,
            sizes: HashMap::new(),
        }
    }

    /// Charges `nodes` and `bytes`, checking the deadline now and then.
    fn charge(&mut self, nodes: u64, bytes: u64) -> Result<(), EncodeError> {
        if nodes > self.nodes_left {
            return Err(EncodeError::Limit(Limit::ResultNodes));
        }
        if bytes > self.bytes_left {
            return Err(EncodeError::Limit(Limit::ResultBytes));
        }
        self.nodes_left -= nodes;
        self.bytes_left -= bytes;
        if self.nodes_left <= self.next_deadline_check {
            self.next_deadline_check = self.nodes_left.saturating_sub(DEADLINE_CHECK_INTERVAL);
            if self
                .deadline
                .is_some_and(|deadline| Instant::now() > deadline)
            {
                return Err(EncodeError::Limit(Limit::WallClock));
            }
        }
        Ok(())
    }

    pub(crate) fn encode(&mut self, value: &LuaValue, depth: usize) -> Result<Value, EncodeError> {
        Ok(match value {
            LuaValue::Nil => {
                self.charge(1, 0)?;
                Value::Null
            }
            LuaValue::Boolean(b) => {
                self.charge(1, 0)?;
                Value::Bool(*b)
            }
            LuaValue::Integer(i) => {
                self.charge(1, 0)?;
                Value::Number((*i).into())
            }
            LuaValue::Number(f) => {
                self.charge(1, 0)?;
                float_to_json(*f)?
            }
            LuaValue::String(s) => {
                let bytes = s.as_bytes();
                self.charge(1, bytes.len() as u64)?;
                Value::String(String::from_utf8_lossy(&bytes).into_owned())
            }
            LuaValue::Table(table) => match (self.resolve)(table) {
                Some(source) => {
                    let (nodes, bytes) = *self
                        .sizes
                        .entry(source as *const Value)
                        .or_insert_with(|| shaped_size(source));
                    self.charge(nodes, bytes)?;
                    lua_shaped(source)
                }
                None => self.encode_table(table, depth)?,
            },
            other => {
                return Err(EncodeError::Invalid(format!(
                    "cannot encode a Lua {} as JSON",
                    other.type_name()
                )));
            }
        })
    }

    fn encode_table(&mut self, table: &Table, depth: usize) -> Result<Value, EncodeError> {
        if depth >= self.depth {
            return Err(EncodeError::Limit(Limit::ResultDepth));
        }
        self.charge(1, 0)?;
        let mut entries: Vec<(LuaValue, LuaValue)> = Vec::new();
        for pair in table.pairs::<LuaValue, LuaValue>() {
            let pair = pair.map_err(|e| EncodeError::Invalid(e.to_string()))?;
            // A table's own entries are already in Lua memory: charging them here only keeps
            // a very wide table from being listed twice over the bound.
            if entries.len() as u64 >= self.nodes_left {
                return Err(EncodeError::Limit(Limit::ResultNodes));
            }
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
                    items.push(self.encode(item, depth + 1)?);
                }
                return Ok(Value::Array(items));
            }
        }
        let mut map = Map::new();
        for (key, item) in &entries {
            let key = match key {
                LuaValue::String(s) => String::from_utf8_lossy(&s.as_bytes()).into_owned(),
                LuaValue::Integer(i) => i.to_string(),
                LuaValue::Number(f) => f.to_string(),
                other => {
                    return Err(EncodeError::Invalid(format!(
                        "cannot encode a table with a {} key as JSON",
                        other.type_name()
                    )));
                }
            };
            self.charge(0, key.len() as u64)?;
            let item = self.encode(item, depth + 1)?;
            map.insert(key, item);
        }
        Ok(Value::Object(map))
    }
}

/// Nodes and string bytes of `lua_shaped(value)`, without building it.
fn shaped_size(value: &Value) -> (u64, u64) {
    match value {
        Value::String(s) => (1, s.len() as u64),
        Value::Array(items) => items
            .iter()
            .filter(|v| !v.is_null())
            .map(shaped_size)
            .fold((1, 0), |(n, b), (dn, db)| (n + dn, b + db)),
        Value::Object(map) => map
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| {
                let (n, b) = shaped_size(v);
                (n, b + k.len() as u64)
            })
            .fold((1, 0), |(n, b), (dn, db)| (n + dn, b + db)),
        _ => (1, 0),
    }
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

pub(crate) fn float_to_json(f: f64) -> Result<Value, EncodeError> {
    let invalid = || EncodeError::Invalid(format!("cannot encode the number {f} as JSON"));
    if !f.is_finite() {
        return Err(invalid());
    }
    if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
        return Ok(Value::Number((f as i64).into()));
    }
    Number::from_f64(f).map(Value::Number).ok_or_else(invalid)
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
