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
//! JSON value produced counts as a node (a shared table once per place it appears), every
//! string byte (keys and values) as a byte. The conversion first reads each distinct table once
//! and sums the size of its expansion from its children's, so a result past a bound is refused
//! with the limit that tripped (nodes, bytes, depth) in time proportional to the tables it is
//! made of, not to its expansion; only a result known to fit is then built (the evaluation's
//! deadline is checked in both passes).

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
    Encoder::new(Bounds::default(), &|_| None).encode(value)
}

/// Like [`lua_to_json`], within `bounds`, with lazy tables resolved to their JSON source.
pub fn lua_to_json_with(
    value: &LuaValue,
    bounds: Bounds,
    resolve: Resolver<'_>,
) -> Result<Value, EncodeError> {
    Encoder::new(bounds, resolve).encode(value)
}

/// Where a planned value comes from.
enum Node<'r> {
    /// A JSON scalar, already copied out of Lua.
    Scalar(Value),
    /// A table of the plan, by index.
    Table(usize),
    /// A lazy table never touched: its JSON source, shaped as Lua would return it.
    Source(&'r Value),
}

/// One distinct Lua table of a result, read once, with the size of its full expansion.
struct Planned<'r> {
    /// Object keys (`None` for a list); empty entries are the empty table `[]`.
    keys: Option<Vec<String>>,
    entries: Vec<Node<'r>>,
    /// JSON values and string bytes of its expansion, saturating.
    nodes: u64,
    bytes: u64,
    /// Levels of its expansion (1: no nested table).
    height: usize,
    /// Expansions of it still to come (the last one moves its entries instead of copying).
    uses: u64,
}

/// A table of the plan while it is being read (a reference to it then is a cycle).
const IN_PROGRESS: usize = usize::MAX;

/// A running conversion, in two passes. The plan reads every distinct Lua table once (by
/// identity) and computes the size of its expansion from its children's, so a result made of
/// shared references (`{t, t}` 64 times: 2^64 values) is measured in 64 steps and refused at
/// once, before anything is expanded. The expansion then builds JSON that is known to fit.
pub(crate) struct Encoder<'r> {
    bounds: Bounds,
    resolve: Resolver<'r>,
    /// Plan index of each table read, by address (`IN_PROGRESS` while it is read).
    seen: HashMap<usize, usize>,
    tables: Vec<Planned<'r>>,
    /// Size of resolved JSON sources, by address: returning the input object many times costs
    /// one walk of it, and is charged each time.
    sizes: HashMap<*const Value, (u64, u64)>,
    /// Values and string bytes copied out of Lua so far (a lower bound of the result's size).
    read_nodes: u64,
    read_bytes: u64,
    /// Values expanded so far, and when the deadline is looked at next.
    emitted: u64,
    next_deadline_check: u64,
}

impl<'r> Encoder<'r> {
    pub(crate) fn new(bounds: Bounds, resolve: Resolver<'r>) -> Encoder<'r> {
        Encoder {
            bounds,
            resolve,
            seen: HashMap::new(),
            tables: Vec::new(),
            sizes: HashMap::new(),
            read_nodes: 0,
            read_bytes: 0,
            emitted: 0,
            next_deadline_check: DEADLINE_CHECK_INTERVAL,
        }
    }

    pub(crate) fn encode(mut self, value: &LuaValue) -> Result<Value, EncodeError> {
        let root = self.plan(value, 0)?;
        let (nodes, bytes, height) = self.size(&root);
        self.check(nodes, bytes, height)?;
        self.count_uses(&root);
        self.emit(root)
    }

    /// How many times each table is expanded. A table's children are planned before it, so a
    /// walk from the last table (the root) down gives each its parents' counts first.
    fn count_uses(&mut self, root: &Node<'_>) {
        if let Node::Table(root) = root {
            self.tables[*root].uses = 1;
        }
        for index in (0..self.tables.len()).rev() {
            let uses = self.tables[index].uses;
            let children: Vec<usize> = self.tables[index]
                .entries
                .iter()
                .filter_map(|node| match node {
                    Node::Table(child) => Some(*child),
                    _ => None,
                })
                .collect();
            for child in children {
                let c = &mut self.tables[child].uses;
                *c = c.saturating_add(uses);
            }
        }
    }

    /// Refuses an expansion past the bounds.
    fn check(&self, nodes: u64, bytes: u64, height: usize) -> Result<(), EncodeError> {
        if nodes > self.bounds.nodes {
            return Err(EncodeError::Limit(Limit::ResultNodes));
        }
        if bytes > self.bounds.bytes {
            return Err(EncodeError::Limit(Limit::ResultBytes));
        }
        if height > self.bounds.depth {
            return Err(EncodeError::Limit(Limit::ResultDepth));
        }
        Ok(())
    }

    /// Counts values and bytes copied out of Lua (each is also part of the expansion, so past a
    /// bound the expansion is too), checking the deadline now and then.
    fn read(&mut self, nodes: u64, bytes: u64) -> Result<(), EncodeError> {
        self.read_nodes = self.read_nodes.saturating_add(nodes);
        self.read_bytes = self.read_bytes.saturating_add(bytes);
        self.check(self.read_nodes, self.read_bytes, 0)?;
        self.tick(nodes)
    }

    fn tick(&mut self, nodes: u64) -> Result<(), EncodeError> {
        self.emitted = self.emitted.saturating_add(nodes);
        if self.emitted >= self.next_deadline_check {
            self.next_deadline_check = self.emitted.saturating_add(DEADLINE_CHECK_INTERVAL);
            if self
                .bounds
                .deadline
                .is_some_and(|deadline| Instant::now() > deadline)
            {
                return Err(EncodeError::Limit(Limit::WallClock));
            }
        }
        Ok(())
    }

    /// Nodes, bytes and levels of a node's expansion.
    fn size(&self, node: &Node<'_>) -> (u64, u64, usize) {
        match node {
            Node::Scalar(Value::String(s)) => (1, s.len() as u64, 0),
            Node::Scalar(_) => (1, 0, 0),
            Node::Table(i) => {
                let t = &self.tables[*i];
                (t.nodes, t.bytes, t.height)
            }
            Node::Source(source) => {
                let (nodes, bytes) = self
                    .sizes
                    .get(&(*source as *const Value))
                    .copied()
                    .unwrap_or_default();
                (nodes, bytes, 0)
            }
        }
    }

    /// Reads `value` out of Lua: scalars are copied, each distinct table is read once.
    fn plan(&mut self, value: &LuaValue, depth: usize) -> Result<Node<'r>, EncodeError> {
        let scalar = match value {
            LuaValue::Nil => Value::Null,
            LuaValue::Boolean(b) => Value::Bool(*b),
            LuaValue::Integer(i) => Value::Number((*i).into()),
            LuaValue::Number(f) => float_to_json(*f)?,
            LuaValue::String(s) => {
                let bytes = s.as_bytes();
                // Counted before it is copied.
                self.read(1, bytes.len() as u64)?;
                return Ok(Node::Scalar(Value::String(
                    String::from_utf8_lossy(&bytes).into_owned(),
                )));
            }
            LuaValue::Table(table) => return self.plan_table(table, depth),
            other => {
                return Err(EncodeError::Invalid(format!(
                    "cannot encode a Lua {} as JSON",
                    other.type_name()
                )));
            }
        };
        self.read(1, 0)?;
        Ok(Node::Scalar(scalar))
    }

    fn plan_table(&mut self, table: &Table, depth: usize) -> Result<Node<'r>, EncodeError> {
        if let Some(source) = (self.resolve)(table) {
            let (nodes, bytes) = *self
                .sizes
                .entry(source as *const Value)
                .or_insert_with(|| shaped_size(source));
            self.check(nodes, bytes, 0)?;
            self.tick(1)?;
            return Ok(Node::Source(source));
        }
        let address = table.to_pointer() as usize;
        match self.seen.get(&address) {
            // A table that contains itself expands without end.
            Some(&IN_PROGRESS) => return Err(EncodeError::Limit(Limit::ResultDepth)),
            Some(&index) => return Ok(Node::Table(index)),
            None => {}
        }
        if depth >= self.bounds.depth {
            return Err(EncodeError::Limit(Limit::ResultDepth));
        }
        self.seen.insert(address, IN_PROGRESS);
        self.read(1, 0)?;
        let mut pairs: Vec<(LuaValue, LuaValue)> = Vec::new();
        for pair in table.pairs::<LuaValue, LuaValue>() {
            let pair = pair.map_err(|e| EncodeError::Invalid(e.to_string()))?;
            // Each entry is at least one value of the result.
            if self.read_nodes.saturating_add(pairs.len() as u64) >= self.bounds.nodes {
                return Err(EncodeError::Limit(Limit::ResultNodes));
            }
            pairs.push(pair);
        }
        let keys = if is_list(&mut pairs) {
            None
        } else {
            let mut keys = Vec::with_capacity(pairs.len());
            for (key, _) in &pairs {
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
                self.read(0, key.len() as u64)?;
                keys.push(key);
            }
            Some(keys)
        };
        let mut entries = Vec::with_capacity(pairs.len());
        let (mut nodes, mut bytes, mut height) = (1u64, 0u64, 0usize);
        for (_, item) in &pairs {
            let node = self.plan(item, depth + 1)?;
            let (n, b, h) = self.size(&node);
            nodes = nodes.saturating_add(n);
            bytes = bytes.saturating_add(b);
            height = height.max(h);
            // Refused as soon as a part is known too big: the rest is not read.
            self.check(nodes, bytes, height + 1)?;
            entries.push(node);
        }
        if let Some(keys) = &keys {
            bytes = keys
                .iter()
                .fold(bytes, |b, k| b.saturating_add(k.len() as u64));
        }
        let index = self.tables.len();
        self.tables.push(Planned {
            keys,
            entries,
            nodes,
            bytes,
            height: height + 1,
            uses: 0,
        });
        self.check(nodes, bytes, height + 1)?;
        self.seen.insert(address, index);
        Ok(Node::Table(index))
    }

    /// Builds the JSON of a planned node (known to be within the bounds).
    fn emit(&mut self, node: Node<'r>) -> Result<Value, EncodeError> {
        self.tick(1)?;
        match node {
            Node::Scalar(value) => Ok(value),
            Node::Source(source) => Ok(lua_shaped(source)),
            Node::Table(index) => self.emit_table(index),
        }
    }

    fn emit_table(&mut self, index: usize) -> Result<Value, EncodeError> {
        let planned = &mut self.tables[index];
        planned.uses = planned.uses.saturating_sub(1);
        // The last reference takes the entries; earlier ones copy them.
        let (keys, entries) = if planned.uses == 0 {
            (planned.keys.take(), std::mem::take(&mut planned.entries))
        } else {
            let entries = planned
                .entries
                .iter()
                .map(|node| match node {
                    Node::Scalar(value) => Node::Scalar(value.clone()),
                    Node::Table(i) => Node::Table(*i),
                    Node::Source(source) => Node::Source(source),
                })
                .collect();
            (planned.keys.clone(), entries)
        };
        if entries.is_empty() {
            return Ok(Value::Array(Vec::new()));
        }
        match keys {
            None => {
                let mut items = Vec::with_capacity(entries.len());
                for node in entries {
                    items.push(self.emit(node)?);
                }
                Ok(Value::Array(items))
            }
            Some(keys) => {
                let mut map = Map::new();
                for (key, node) in keys.into_iter().zip(entries) {
                    let item = self.emit(node)?;
                    map.insert(key, item);
                }
                Ok(Value::Object(map))
            }
        }
    }
}

/// Whether a table's entries are a list (keys exactly `1..n`); if so they are put in order.
fn is_list(pairs: &mut [(LuaValue, LuaValue)]) -> bool {
    if !pairs
        .iter()
        .all(|(key, _)| matches!(key, LuaValue::Integer(i) if *i >= 1))
    {
        return false;
    }
    let index = |key: &LuaValue| match key {
        LuaValue::Integer(i) => *i,
        _ => 0,
    };
    pairs.sort_unstable_by_key(|(key, _)| index(key));
    pairs
        .iter()
        .enumerate()
        .all(|(pos, (key, _))| index(key) == pos as i64 + 1)
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

    #[test]
    fn shared_tables_expand_in_every_place_they_appear() {
        let lua = Lua::new();
        let v: LuaValue = lua
            .load("local a = {x = 1, s = 'y'}\nlocal b = {a, a, {}}\nreturn {b, b, a, a}")
            .eval()
            .unwrap();
        let a = json!({"x": 1, "s": "y"});
        let b = json!([a, a, []]);
        assert_eq!(lua_to_json(&v).unwrap(), json!([b, b, a, a]));
    }

    #[test]
    fn a_shared_reference_bomb_is_refused_before_it_is_expanded() {
        // 2^64 values as JSON, 64 tables in Lua. Bounds so high that only an exact count of the
        // expansion can refuse it, and no deadline: expanding would not end.
        let lua = Lua::new();
        let bomb: LuaValue = lua
            .load("local t = {}\nfor i = 1, 64 do t = {t, t} end\nreturn {expanded = t}")
            .eval()
            .unwrap();
        let bounds = Bounds {
            nodes: u64::MAX / 2,
            bytes: u64::MAX / 2,
            depth: 200,
            deadline: None,
        };
        assert_eq!(
            lua_to_json_with(&bomb, bounds, &|_| None),
            Err(EncodeError::Limit(Limit::ResultNodes))
        );
        // Strings shared the same way are counted per place too (2^40 copies of 1,000 bytes).
        let strings: LuaValue = lua
            .load("local t = {string.rep('x', 1000)}\nfor i = 1, 40 do t = {t, t} end\nreturn t")
            .eval()
            .unwrap();
        let bytes_bound = Bounds {
            bytes: Bounds::default().bytes,
            ..bounds
        };
        assert_eq!(
            lua_to_json_with(&strings, bytes_bound, &|_| None),
            Err(EncodeError::Limit(Limit::ResultBytes))
        );
        // Just within the bounds it is built, every copy in full.
        let small: LuaValue = lua
            .load("local t = {1}\nfor i = 1, 10 do t = {t, t} end\nreturn t")
            .eval()
            .unwrap();
        let exact = Bounds {
            nodes: 2u64.pow(11) - 1 + 2u64.pow(10),
            ..Bounds::default()
        };
        let json = lua_to_json_with(&small, exact, &|_| None).unwrap();
        assert_eq!(json.to_string().matches('1').count(), 1024);
        assert_eq!(
            lua_to_json_with(
                &small,
                Bounds {
                    nodes: exact.nodes - 1,
                    ..exact
                },
                &|_| None
            ),
            Err(EncodeError::Limit(Limit::ResultNodes))
        );
    }
}
