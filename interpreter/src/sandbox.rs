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
//! tripped they re-raise instead of letting the script carry on.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mlua::{
    Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value as LuaValue, VmState,
};

use crate::error::{Limit, RunError};
use crate::kube;

/// Instructions between two budget checks. Small enough that a tripped limit stops a script
/// within microseconds, large enough that the hook costs little.
const HOOK_INTERVAL: u32 = 1000;

/// Scripts cached per state before the cache is dropped and rebuilt (bounds memory when
/// customizations are replaced many times).
const MAX_CACHED_SCRIPTS: usize = 512;

/// The message Lua uses for allocation failures.
const LUA_MEMORY_ERROR: &str = "not enough memory";

/// Per-evaluation limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Lua VM instructions one evaluation may execute.
    pub instructions: u64,
    /// Bytes one evaluation may allocate on top of what the state already holds.
    pub memory_bytes: usize,
    /// Wall-clock time one evaluation may take.
    pub wall_clock: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            instructions: 10_000_000,
            memory_bytes: 32 * 1024 * 1024,
            wall_clock: Duration::from_secs(1),
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

/// Shared between the hook, the pcall guard and the evaluation.
struct Budget {
    instructions_left: AtomicI64,
    deadline_nanos: AtomicU64,
    tripped: AtomicU8,
    epoch: Instant,
}

impl Budget {
    fn trip(&self, what: u8) {
        let _ =
            self.tripped
                .compare_exchange(TRIP_NONE, what, Ordering::Relaxed, Ordering::Relaxed);
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
    new_env: Function,
    factories: HashMap<u64, Function>,
    budget: Arc<Budget>,
    limits: Limits,
}

/// Lua code run once per state with the real globals: builds the base environment scripts see.
const SETUP: &str = r#"
local fatal, kube = ...
local G = _G
local pcall, xpcall, error, setmetatable, tostring, type, pairs = pcall, xpcall, error, setmetatable, tostring, type, pairs
local string, table, math, os = string, table, math, os

local function readonly(name, lib)
  return setmetatable({}, {
    __index = lib,
    __newindex = function() error("attempt to modify the read-only library '" .. name .. "'", 2) end,
  })
end

-- The string library without dump; 5.1 names kept for old scripts.
local str = {}
for k, v in G.pairs(string) do str[k] = v end
str.dump = nil
str.gfind = string.gmatch
-- Method calls on strings ("x"):upper() use the same restricted table.
G.getmetatable("").__index = str

local tab = {}
for k, v in G.pairs(table) do tab[k] = v end
tab.getn = function(t) return #t end
tab.maxn = function(t)
  local n = 0
  for k in pairs(t) do if type(k) == "number" and k > n then n = k end end
  return n
end

local m = {}
for k, v in G.pairs(math) do m[k] = v end
m.pow = function(x, y) return x ^ y end
m.log10 = function(x) return math.log(x, 10) end
m.mod = math.fmod

local function pass(ok, ...)
  if not ok and fatal((...)) then error((...), 0) end
  return ok, ...
end

local kube_module = readonly("kube", kube)

local base = {
  _VERSION = G._VERSION,
  assert = G.assert,
  error = error,
  ipairs = G.ipairs,
  next = G.next,
  pairs = G.pairs,
  select = G.select,
  tonumber = G.tonumber,
  tostring = tostring,
  type = type,
  unpack = table.unpack,
  print = function() end,
  pcall = function(f, ...) return pass(pcall(f, ...)) end,
  xpcall = function(f, handler, ...)
    return pass(xpcall(f, function(e) if fatal(e) then return e end return handler(e) end, ...))
  end,
  require = function(name)
    if name == "kube" then return kube_module end
    error("module '" .. tostring(name) .. "' not found: only 'kube' is available", 2)
  end,
  string = readonly("string", str),
  table = readonly("table", tab),
  math = readonly("math", m),
  os = readonly("os", { time = os.time, date = os.date }),
}
for _, name in G.ipairs({
  "collectgarbage", "dofile", "getfenv", "getmetatable", "load", "loadfile", "loadstring",
  "rawequal", "rawget", "rawlen", "rawset", "setfenv", "setmetatable", "module", "newproxy",
}) do
  base[name] = function()
    error("call function " .. name .. " is not supported in the Lifeboat resource interpreter", 2)
  end
end
-- Each evaluation gets a plain table holding the base names (assigning nil to a global hides
-- the built-in, as in Karmada's plain globals table); built by one table constructor.
local fields = {}
for name in pairs(base) do fields[#fields + 1] = name .. " = b." .. name end
local make = G.load("local b = ...\nreturn function()\n local e = {" .. table.concat(fields, ", ")
  .. "}\n e._G = e\n return e\nend", "=lifeboat-env", "t", {})
return make(base)
"#;

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
        let kube = kube::module(&lua).map_err(|e| RunError::Setup(e.to_string()))?;
        let new_env: Function = lua
            .load(SETUP)
            .set_name("=lifeboat-sandbox")
            .call((fatal, kube))
            .map_err(|e| RunError::Setup(e.to_string()))?;

        // Only the sandbox's environment tables reach scripts: drop the real globals that the
        // setup captured, so nothing else can find them.
        let globals = lua.globals();
        for pair in globals.clone().pairs::<LuaValue, LuaValue>() {
            let (key, _) = pair.map_err(|e| RunError::Setup(e.to_string()))?;
            globals
                .raw_set(key, LuaValue::Nil)
                .map_err(|e| RunError::Setup(e.to_string()))?;
        }

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
            new_env,
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
        // `_ENV` as the first parameter gives each call its own globals; the script stays on
        // the first line so error lines match the customization.
        let wrapped = format!("return function(_ENV, ...) {}\nend", script.source);
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

    /// Runs `function_name` from `script` with arguments built by `make_args`, and hands the
    /// results to `take_results` while the state is still at hand.
    pub fn evaluate<R>(
        &mut self,
        script: &Script,
        function_name: &str,
        make_args: impl FnOnce(&Lua) -> mlua::Result<MultiValue>,
        take_results: impl FnOnce(&Lua, MultiValue) -> Result<R, RunError>,
    ) -> Result<R, RunError> {
        let factory = self.compile(script)?;
        let lua = &self.lua;
        let env: Table = self
            .new_env
            .call(())
            .map_err(|e| RunError::Setup(e.to_string()))?;
        let args = make_args(lua).map_err(|e| RunError::Input(e.to_string()))?;

        // Arm the limits.
        self.budget.instructions_left.store(
            i64::try_from(self.limits.instructions).unwrap_or(i64::MAX),
            Ordering::Relaxed,
        );
        let deadline = self.budget.epoch.elapsed() + self.limits.wall_clock;
        self.budget.deadline_nanos.store(
            u64::try_from(deadline.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.budget.tripped.store(TRIP_NONE, Ordering::Relaxed);
        let ceiling = lua.used_memory().saturating_add(self.limits.memory_bytes);
        let _ = lua.set_memory_limit(ceiling);

        let outcome = (|| {
            factory.call::<()>(env.clone())?;
            let function: LuaValue = env.raw_get(function_name)?;
            match function {
                LuaValue::Function(f) => f.call::<MultiValue>(args).map(Ok),
                LuaValue::Nil => Ok(Err(RunError::Script(format!(
                    "not found function {function_name}"
                )))),
                other => Ok(Err(RunError::Script(format!(
                    "{function_name} is not a function: {}",
                    other.type_name()
                )))),
            }
        })();

        let _ = lua.set_memory_limit(0);
        let tripped = self.budget.tripped();
        // Disarm: conversions after the call are not charged.
        self.budget
            .instructions_left
            .store(i64::MAX, Ordering::Relaxed);
        self.budget
            .deadline_nanos
            .store(u64::MAX, Ordering::Relaxed);
        self.budget.tripped.store(TRIP_NONE, Ordering::Relaxed);

        if let Some(limit) = tripped {
            if limit == Limit::Memory {
                let _ = lua.gc_collect();
            }
            return Err(RunError::Limit(limit));
        }
        match outcome {
            Ok(Ok(results)) => take_results(lua, results),
            Ok(Err(e)) => Err(e),
            Err(e) => {
                if is_memory_error(&e) {
                    let _ = lua.gc_collect();
                    return Err(RunError::Limit(Limit::Memory));
                }
                Err(RunError::Script(lua_error_message(&e)))
            }
        }
    }

    /// Bytes currently held by the state.
    pub fn used_memory(&self) -> usize {
        self.lua.used_memory()
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

/// The Lua error text without mlua's decorations (tracebacks stay out of one-line reports).
pub(crate) fn lua_error_message(e: &mlua::Error) -> String {
    match e {
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        mlua::Error::RuntimeError(message) => message.clone(),
        mlua::Error::MemoryError(message) => message.clone(),
        mlua::Error::CallbackError { cause, .. } => lua_error_message(cause),
        mlua::Error::WithContext { cause, .. } => lua_error_message(cause),
        other => other.to_string(),
    }
}
