//! One sandboxed Lua 5.4 state: restricted libraries, per-evaluation limits, clean globals and
//! a compiled-chunk cache.
//!
//! Clean globals without re-parsing: each script is compiled once per state as
//! `return function(_ENV, ...) <script> end`. An evaluation calls that factory with a fresh
//! environment table holding the base functions and the read-only libraries, so the script's
//! top-level code (and its `local`s) run anew and nothing it writes survives the call.
//!
//! Limits: a count hook charges an instruction budget and checks the wall clock; the state's
//! allocator enforces a memory ceiling. `pcall`/`xpcall` are wrapped so that once a limit has
//! tripped they re-raise instead of letting the script carry on. Values leaving Lua (results,
//! `kube` helper arguments, error messages) are bounded too: see [`Limits`].
//!
//! Determinism: a result is a pure function of the script and its inputs. Table iteration
//! follows gopher-lua's order (`order.rs` and `sandbox.lua`), `tostring` and `string.format`
//! print sequence numbers instead of addresses, `math.random` starts from a fixed seed in every
//! evaluation and `table.sort` does not use the C sort's random pivots.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mlua::{
    Function, HookTriggers, IntoLua, Lua, LuaOptions, MultiValue, StdLib, Table, Value as LuaValue,
    VmState,
};

use serde_json::Value;

use crate::convert::{Bounds, EncodeError, json_to_lua_with, lua_to_json_with, number_to_lua};
use crate::error::{Exceeded, Limit, RunError};
use crate::kube;
use crate::order;

/// Instructions between two budget checks. Small enough that a tripped limit stops a script
/// within microseconds, large enough that the hook costs little.
const HOOK_INTERVAL: u32 = 1000;

/// Scripts cached per state before the cache is dropped and rebuilt (bounds memory when
/// customizations are replaced many times).
const MAX_CACHED_SCRIPTS: usize = 512;

/// The message Lua uses for allocation failures.
const LUA_MEMORY_ERROR: &str = "not enough memory";

/// Longest error message kept from Lua (bytes); longer ones are cut, in Lua, before they are
/// copied out of the state.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 4096;

/// Per-evaluation limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Lua VM instructions one evaluation may execute.
    pub instructions: u64,
    /// Bytes one evaluation may allocate on top of what the state already holds.
    pub memory_bytes: usize,
    /// Wall-clock time one evaluation may take, the conversion of its result included.
    pub wall_clock: Duration,
    /// JSON values (objects, lists, scalars) one conversion out of Lua may produce: the
    /// result, or one argument of a `kube` helper. Shared references and the input object
    /// returned many times count every time they are expanded.
    pub result_nodes: u64,
    /// String bytes (object keys and string values) one conversion out of Lua may produce.
    pub result_bytes: u64,
    /// Nesting levels of one conversion out of Lua (a table that contains itself stops here).
    pub result_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            instructions: 10_000_000,
            memory_bytes: 32 * 1024 * 1024,
            wall_clock: Duration::from_secs(1),
            // A Kubernetes object is at most 1.5 MiB (etcd's request limit): real results
            // stay far below these.
            result_nodes: 1_000_000,
            result_bytes: 16 * 1024 * 1024,
            result_depth: 200,
        }
    }
}

impl Limits {
    /// The configured bound of `limit`, in its unit (milliseconds for the wall clock).
    pub fn bound(&self, limit: Limit) -> u64 {
        match limit {
            Limit::Instructions => self.instructions,
            Limit::Memory => self.memory_bytes as u64,
            Limit::WallClock => u64::try_from(self.wall_clock.as_millis()).unwrap_or(u64::MAX),
            Limit::ResultNodes => self.result_nodes,
            Limit::ResultBytes => self.result_bytes,
            Limit::ResultDepth => self.result_depth as u64,
        }
    }

    /// `limit` with its bound, for an error.
    pub fn exceeded(&self, limit: Limit) -> Exceeded {
        Exceeded {
            limit,
            bound: self.bound(limit),
        }
    }
}

/// A compiled-once unit: a named Lua script.
#[derive(Debug)]
pub struct Script {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) source: String,
}

impl Script {
    pub fn new(name: impl Into<String>, source: impl Into<String>) -> Script {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Script {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            name: name.into(),
            source: source.into(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn source(&self) -> &str {
        &self.source
    }
}

const TRIP_NONE: u8 = 0;
const TRIP_INSTRUCTIONS: u8 = 1;
const TRIP_WALL_CLOCK: u8 = 2;
const TRIP_MEMORY: u8 = 3;

/// Shared between the hook, the pcall guard, the `kube` helpers and the evaluation.
pub(crate) struct Budget {
    instructions_left: AtomicI64,
    deadline_nanos: AtomicU64,
    tripped: AtomicU8,
    epoch: Instant,
    limits: Limits,
}

impl Budget {
    fn trip(&self, what: u8) {
        let _ =
            self.tripped
                .compare_exchange(TRIP_NONE, what, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Stops the running script: the wall clock ran out in Rust code (a conversion).
    pub(crate) fn trip_wall_clock(&self) {
        self.trip(TRIP_WALL_CLOCK);
    }

    /// The bounds of a conversion out of Lua during the running evaluation.
    pub(crate) fn bounds(&self) -> Bounds {
        let deadline = self.deadline_nanos.load(Ordering::Relaxed);
        Bounds {
            nodes: self.limits.result_nodes,
            bytes: self.limits.result_bytes,
            depth: self.limits.result_depth,
            deadline: (deadline != u64::MAX).then(|| self.epoch + Duration::from_nanos(deadline)),
        }
    }

    fn tripped(&self) -> Option<Limit> {
        match self.tripped.load(Ordering::Relaxed) {
            TRIP_INSTRUCTIONS => Some(Limit::Instructions),
            TRIP_WALL_CLOCK => Some(Limit::WallClock),
            TRIP_MEMORY => Some(Limit::Memory),
            _ => None,
        }
    }
}

/// A Lua state ready to run scripts.
pub struct Sandbox {
    lua: Lua,
    run: Function,
    lazy_metatable: Table,
    /// Tables whose keys keep their insertion order (see `sandbox.lua`).
    ordered_metatable: Table,
    factories: HashMap<u64, Function>,
    budget: Arc<Budget>,
    limits: Limits,
}

/// Lua code run once per state with the real globals: builds the base environment scripts see.
const SETUP: &str = include_str!("sandbox.lua");

impl Sandbox {
    /// Builds a fresh state with the restricted libraries.
    pub fn new(limits: Limits) -> Result<Sandbox, RunError> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH | StdLib::OS,
            LuaOptions::new(),
        )
        .map_err(|e| RunError::Setup(e.to_string()))?;
        let budget = Arc::new(Budget {
            instructions_left: AtomicI64::new(i64::MAX),
            deadline_nanos: AtomicU64::new(u64::MAX),
            tripped: AtomicU8::new(TRIP_NONE),
            epoch: Instant::now(),
            limits,
        });

        let fatal_budget = budget.clone();
        let fatal = lua
            .create_function(move |_, error: LuaValue| {
                if fatal_budget.tripped().is_some() {
                    return Ok(true);
                }
                let memory = match &error {
                    LuaValue::String(s) => s.as_bytes().as_ref() == LUA_MEMORY_ERROR.as_bytes(),
                    LuaValue::Error(e) => matches!(e.as_ref(), mlua::Error::MemoryError(_)),
                    _ => false,
                };
                if memory {
                    fatal_budget.trip(TRIP_MEMORY);
                }
                Ok(memory)
            })
            .map_err(|e| RunError::Setup(e.to_string()))?;
        let setup_error = |e: mlua::Error| RunError::Setup(e.to_string());
        // What pcall hands a script for an error raised in Rust (a helper's argument error):
        // its message, as Karmada's Go helpers give, not an opaque userdata.
        let error_text = lua
            .create_function(|lua, error: LuaValue| match error {
                LuaValue::Error(e) => {
                    Ok(LuaValue::String(lua.create_string(lua_error_message(&e))?))
                }
                other => Ok(other),
            })
            .map_err(setup_error)?;
        let ordered_metatable = lua.create_table().map_err(setup_error)?;
        let kube =
            kube::module(&lua, ordered_metatable.clone(), budget.clone()).map_err(setup_error)?;
        let (run, lazy_metatable): (Function, Table) = lua
            .load(SETUP)
            .set_name("=lifeboat-sandbox")
            .call((
                fatal,
                error_text,
                kube,
                ordered_metatable.clone(),
                MAX_ERROR_MESSAGE_BYTES,
                limits.result_depth,
            ))
            .map_err(setup_error)?;

        // Only the sandbox's environment tables reach scripts: drop the real globals that the
        // setup captured, so nothing else can find them.
        let globals = lua.globals();
        for pair in globals.clone().pairs::<LuaValue, LuaValue>() {
            let (key, _) = pair.map_err(|e| RunError::Setup(e.to_string()))?;
            globals
                .raw_set(key, LuaValue::Nil)
                .map_err(|e| RunError::Setup(e.to_string()))?;
        }

        // Evaluations leave only short-lived garbage: the generational collector handles that
        // with less work than full incremental cycles.
        lua.gc_set_mode(mlua::state::GcMode::Generational(
            mlua::state::GcGenParams::default(),
        ));

        let hook_budget = budget.clone();
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(HOOK_INTERVAL),
            move |_, _| {
                if let Some(limit) = hook_budget.tripped() {
                    return Err(mlua::Error::runtime(limit.message()));
                }
                let left = hook_budget
                    .instructions_left
                    .fetch_sub(i64::from(HOOK_INTERVAL), Ordering::Relaxed)
                    - i64::from(HOOK_INTERVAL);
                if left < 0 {
                    hook_budget.trip(TRIP_INSTRUCTIONS);
                    return Err(mlua::Error::runtime(Limit::Instructions.message()));
                }
                let now = hook_budget.epoch.elapsed().as_nanos() as u64;
                if now > hook_budget.deadline_nanos.load(Ordering::Relaxed) {
                    hook_budget.trip(TRIP_WALL_CLOCK);
                    return Err(mlua::Error::runtime(Limit::WallClock.message()));
                }
                Ok(VmState::Continue)
            },
        )
        .map_err(|e| RunError::Setup(e.to_string()))?;

        Ok(Sandbox {
            lua,
            run,
            lazy_metatable,
            ordered_metatable,
            factories: HashMap::new(),
            budget,
            limits,
        })
    }

    /// The Lua state (for converting values in and out).
    pub fn lua(&self) -> &Lua {
        &self.lua
    }

    /// Compiles a script (once per state). Errors carry the Lua message with its line.
    pub fn compile(&mut self, script: &Script) -> Result<Function, RunError> {
        if let Some(f) = self.factories.get(&script.id) {
            return Ok(f.clone());
        }
        // `_ENV` as the first parameter gives each call its own globals; the constructor hooks
        // follow (see order.rs). The script stays on the first line so error lines match the
        // customization.
        let source = order::rewrite_constructors(&script.source).map_err(RunError::Compile)?;
        let wrapped = format!(
            "return function(_ENV, {}, {}, ...) {source}\nend",
            order::TABLE_HOOK,
            order::KEY_HOOK
        );
        let chunk = self
            .lua
            .load(wrapped)
            .set_name(format!("={}", script.name))
            .into_function()
            .map_err(|e| RunError::Compile(lua_error_message(&e)))?;
        let factory: Function = chunk
            .call(())
            .map_err(|e| RunError::Compile(lua_error_message(&e)))?;
        if self.factories.len() >= MAX_CACHED_SCRIPTS {
            self.factories.clear();
        }
        self.factories.insert(script.id, factory.clone());
        Ok(factory)
    }

    /// Runs `function_name` from `script` with `args`, and hands the results to `take_results`
    /// while the state (and the lazy arguments' sources) are still at hand.
    pub fn evaluate<'a, R>(
        &mut self,
        script: &Script,
        function_name: &str,
        args: &[Arg<'a>],
        take_results: impl FnOnce(&Lua, MultiValue, &Outputs<'_, 'a>) -> Result<R, RunError>,
    ) -> Result<R, RunError> {
        let factory = self.compile(script)?;
        let lua = &self.lua;
        let lazy = Lazy {
            nodes: RefCell::new(HashMap::new()),
            metatable: self.lazy_metatable.clone(),
            ordered: self.ordered_metatable.clone(),
        };
        let budget = &self.budget;
        let limits = self.limits;
        let run = &self.run;

        let scoped = lua.scope(|scope| {
            let materializer =
                scope.create_function(|lua, table: Table| lazy.materialize(lua, &table))?;
            let mut lua_args = Vec::with_capacity(args.len() + 3);
            lua_args.push(LuaValue::Function(factory.clone()));
            lua_args.push(LuaValue::String(lua.create_string(function_name)?));
            lua_args.push(LuaValue::Function(materializer));
            for arg in args {
                lua_args.push(match arg {
                    Arg::Object(value) => lazy.value(lua, value)?,
                    Arg::Integer(i) => LuaValue::Integer(*i),
                });
            }

            // Arm the limits.
            budget.instructions_left.store(
                i64::try_from(limits.instructions).unwrap_or(i64::MAX),
                Ordering::Relaxed,
            );
            let deadline = budget.epoch.elapsed() + limits.wall_clock;
            budget.deadline_nanos.store(
                u64::try_from(deadline.as_nanos()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            budget.tripped.store(TRIP_NONE, Ordering::Relaxed);
            let ceiling = lua.used_memory().saturating_add(limits.memory_bytes);
            let _ = lua.set_memory_limit(ceiling);

            let outcome = run.call::<MultiValue>(MultiValue::from_vec(lua_args));

            let _ = lua.set_memory_limit(0);
            let tripped = budget.tripped();
            // Disarm the hook; the deadline stays for the conversion of the results.
            budget.instructions_left.store(i64::MAX, Ordering::Relaxed);
            budget.tripped.store(TRIP_NONE, Ordering::Relaxed);
            let outputs = Outputs {
                lazy: &lazy,
                bounds: budget.bounds(),
                limits,
            };
            budget.deadline_nanos.store(u64::MAX, Ordering::Relaxed);

            if let Some(limit) = tripped {
                if limit == Limit::Memory {
                    let _ = lua.gc_collect();
                }
                return Ok(Err(RunError::Limit(limits.exceeded(limit))));
            }
            Ok(match outcome {
                Ok(results) => take_results(lua, results, &outputs),
                Err(e) => {
                    if is_memory_error(&e) {
                        let _ = lua.gc_collect();
                        Err(RunError::Limit(limits.exceeded(Limit::Memory)))
                    } else {
                        Err(RunError::Script(lua_error_message(&e)))
                    }
                }
            })
        });
        scoped.map_err(|e| RunError::Input(lua_error_message(&e)))?
    }

    /// Scripts compiled and cached in this state.
    pub fn cached_scripts(&self) -> usize {
        self.factories.len()
    }

    /// Bytes currently held by the state.
    pub fn used_memory(&self) -> usize {
        self.lua.used_memory()
    }
}

/// An argument of an evaluation.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// A JSON value, passed lazily: converted level by level as the script reads it.
    Object(&'a Value),
    Integer(i64),
}

/// Objects and lists with at most this many scalar fields are converted eagerly.
const EAGER_MAX_FIELDS: usize = 8;

fn is_flat(value: &Value) -> bool {
    let scalar = |v: &Value| !v.is_object() && !v.is_array();
    match value {
        Value::Object(map) => map.values().all(scalar),
        Value::Array(items) => items.iter().all(scalar),
        _ => true,
    }
}

/// Sources of the lazy tables of one evaluation, by table address. A table's address is only
/// trusted while the table still carries the lazy metatable: a collected proxy's address may be
/// reused by a plain table.
struct Lazy<'a> {
    nodes: RefCell<HashMap<usize, &'a Value>>,
    metatable: Table,
    /// Given to every table once it holds its fields.
    ordered: Table,
}

impl<'a> Lazy<'a> {
    /// A Lua value for `value`: non-empty objects and lists become lazy tables.
    fn value(&self, lua: &Lua, value: &'a Value) -> mlua::Result<LuaValue> {
        let (narr, nrec) = match value {
            Value::Object(map) if !map.is_empty() => (0, map.len()),
            Value::Array(items) if !items.is_empty() => (items.len(), 0),
            other => return json_to_lua_with(lua, other, Some(&self.ordered)),
        };
        // Small all-scalar objects and lists (conditions, labels, selectors) are cheaper to
        // convert at once than to proxy and materialize later.
        if narr + nrec <= EAGER_MAX_FIELDS && is_flat(value) {
            let table = lua.create_table_with_capacity(narr, nrec)?;
            match value {
                Value::Object(map) => {
                    for (key, child) in map {
                        self.set(lua, &table, key.as_str(), child)?;
                    }
                }
                Value::Array(items) => {
                    for (index, child) in (1..).zip(items.iter().filter(|c| !c.is_null())) {
                        self.set(lua, &table, index, child)?;
                    }
                }
                _ => {}
            }
            table.set_metatable(Some(self.ordered.clone()))?;
            return Ok(LuaValue::Table(table));
        }
        let table = lua.create_table_with_capacity(narr, nrec)?;
        table.set_metatable(Some(self.metatable.clone()))?;
        self.nodes
            .borrow_mut()
            .insert(table.to_pointer() as usize, value);
        Ok(LuaValue::Table(table))
    }

    /// Fills a lazy table with its source's first level and makes it an ordinary (ordered)
    /// table. Only called from the lazy metatable's metamethods, so `table` is a proxy.
    fn materialize(&self, lua: &Lua, table: &Table) -> mlua::Result<()> {
        table.set_metatable(Some(self.ordered.clone()))?;
        let Some(node) = self
            .nodes
            .borrow_mut()
            .remove(&(table.to_pointer() as usize))
        else {
            return Ok(());
        };
        // The input is bounded and trusted: convert it outside the script's memory ceiling
        // (which also spares every call below mlua's protected mode).
        let ceiling = lua.set_memory_limit(0).unwrap_or(0);
        let filled = (|| {
            match node {
                Value::Object(map) => {
                    for (key, child) in map {
                        self.set(lua, table, key.as_str(), child)?;
                    }
                }
                Value::Array(items) => {
                    for (index, child) in (1..).zip(items.iter().filter(|c| !c.is_null())) {
                        self.set(lua, table, index, child)?;
                    }
                }
                _ => {}
            }
            Ok(())
        })();
        let _ = lua.set_memory_limit(ceiling);
        filled
    }

    /// Sets one field; scalars are pushed directly (no intermediate Lua handles).
    fn set(
        &self,
        lua: &Lua,
        table: &Table,
        key: impl IntoLua,
        child: &'a Value,
    ) -> mlua::Result<()> {
        match child {
            Value::Null => Ok(()),
            Value::Bool(b) => table.raw_set(key, *b),
            Value::String(text) => table.raw_set(key, text.as_str()),
            Value::Number(n) => table.raw_set(key, number_to_lua(n)),
            _ => table.raw_set(key, self.value(lua, child)?),
        }
    }

    /// The source of a table not materialized yet.
    fn source(&self, table: &Table) -> Option<&'a Value> {
        if table.metatable().as_ref() != Some(&self.metatable) {
            return None;
        }
        self.nodes
            .borrow()
            .get(&(table.to_pointer() as usize))
            .copied()
    }
}

/// Converts an evaluation's Lua results to JSON, within the result limits and the
/// evaluation's deadline; untouched lazy tables come straight from their JSON source, shaped
/// as Lua would have returned them.
pub struct Outputs<'l, 'a> {
    lazy: &'l Lazy<'a>,
    bounds: Bounds,
    limits: Limits,
}

impl Outputs<'_, '_> {
    pub fn to_json(&self, value: &LuaValue) -> Result<Value, RunError> {
        lua_to_json_with(value, self.bounds, &|table| self.lazy.source(table)).map_err(
            |e| match e {
                EncodeError::Limit(limit) => RunError::Limit(self.limits.exceeded(limit)),
                EncodeError::Invalid(message) => RunError::Result(message),
            },
        )
    }
}

fn is_memory_error(e: &mlua::Error) -> bool {
    match e {
        mlua::Error::MemoryError(_) => true,
        mlua::Error::CallbackError { cause, .. } => is_memory_error(cause),
        mlua::Error::WithContext { cause, .. } => is_memory_error(cause),
        mlua::Error::RuntimeError(msg) => msg == LUA_MEMORY_ERROR,
        _ => false,
    }
}

/// The Lua error text without mlua's decorations (tracebacks stay out of one-line reports),
/// at most [`MAX_ERROR_MESSAGE_BYTES`] long.
pub(crate) fn lua_error_message(e: &mlua::Error) -> String {
    let mut message = match e {
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        mlua::Error::RuntimeError(message) => message.clone(),
        mlua::Error::MemoryError(message) => message.clone(),
        mlua::Error::CallbackError { cause, .. } => return lua_error_message(cause),
        mlua::Error::WithContext { cause, .. } => return lua_error_message(cause),
        other => other.to_string(),
    };
    if let Some(traceback) = message.find("\nstack traceback:") {
        message.truncate(traceback);
    }
    if message.len() > MAX_ERROR_MESSAGE_BYTES {
        let mut end = MAX_ERROR_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("... (truncated)");
    }
    message
}
