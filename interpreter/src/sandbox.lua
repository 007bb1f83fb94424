-- Run once per Lua state with the real globals (sandbox.rs): builds the base environment
-- scripts see and returns the per-evaluation entry point.
--
-- Receives: fatal (is this error a tripped limit?), error_text (the message of an error
-- raised in Rust), the kube module, the longest error message kept, and the deepest nesting a
-- helper argument may have.
local fatal, error_text, kube, error_bytes, max_depth = ...
local G = _G
local pcall, xpcall, error, setmetatable, getmetatable, tostring, type, pairs =
  pcall, xpcall, error, setmetatable, getmetatable, tostring, type, pairs
local rawget, rawset, rawlen, next, select = rawget, rawset, rawlen, next, select
local string, table, math, os = string, table, math, os
local string_sub = string.sub

-- Lazy arguments: an object argument is an empty table with this metatable until first use;
-- then `materialize` (set per evaluation, from Rust) fills in one level and drops the metatable,
-- leaving a plain table. Scripts cannot tell: raw access functions are not offered.
local materialize
local LAZY = {}
LAZY.__index = function(t, k) materialize(t) return rawget(t, k) end
LAZY.__newindex = function(t, k, v) materialize(t) rawset(t, k, v) end
LAZY.__len = function(t) materialize(t) return rawlen(t) end
LAZY.__pairs = function(t) materialize(t) return next, t, nil end
local function lazy_next(t, k)
  if getmetatable(t) == LAZY then materialize(t) end
  return next(t, k)
end
-- Helpers that read whole pod templates get fully materialized tables (each table walked
-- once: shared references are expanded, and bounded, by the conversion in Rust).
local function deep(v, depth, seen)
  if type(v) == "table" and depth <= max_depth and not seen[v] then
    seen[v] = true
    for _, child in pairs(v) do deep(child, depth + 1, seen) end
  end
end
local kube_lazy = {}
for name, f in pairs(kube) do
  kube_lazy[name] = function(...)
    local seen = {}
    for i = 1, select("#", ...) do deep((select(i, ...)), 0, seen) end
    return f(...)
  end
end

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

-- pcall/xpcall: a tripped limit is raised again; other errors raised in Rust reach the
-- script as their message.
local function pass(ok, ...)
  if ok then return ok, ... end
  local e = ...
  if fatal(e) then error(e, 0) end
  return false, error_text(e)
end

local kube_module = readonly("kube", kube_lazy)

local base = {
  _VERSION = G._VERSION,
  assert = G.assert,
  error = error,
  ipairs = G.ipairs,
  next = lazy_next,
  pairs = G.pairs,
  select = G.select,
  tonumber = G.tonumber,
  tostring = tostring,
  type = type,
  unpack = table.unpack,
  print = function() end,
  pcall = function(f, ...) return pass(pcall(f, ...)) end,
  xpcall = function(f, handler, ...)
    return pass(xpcall(f, function(e)
      if fatal(e) then return e end
      return handler(error_text(e))
    end, ...))
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
local new_env = make(base)

-- Errors leave Lua as short strings: a script's error() with a huge message, or a table,
-- must not reach Rust logs and status whole. Errors raised from Rust (userdata) pass through.
local function bounded_error(e)
  local kind = type(e)
  if kind == "string" then
    if #e > error_bytes then return string_sub(e, 1, error_bytes) .. "... (truncated)" end
    return e
  end
  if kind == "userdata" then return e end
  return "(error object is a " .. kind .. " value)"
end

local function body(factory, name, ...)
  local env = new_env()
  factory(env)
  local f = rawget(env, name)
  if f == nil then error("not found function " .. name, 0) end
  if type(f) ~= "function" then error(name .. " is not a function: " .. type(f), 0) end
  return f(...)
end

local function finish(ok, ...)
  if ok then return ... end
  error((...), 0)
end

-- One call per evaluation: install the materializer, run the script body in fresh globals,
-- call the operation's function.
local function run(factory, name, materializer, ...)
  materialize = materializer
  return finish(xpcall(body, bounded_error, factory, name, ...))
end
return run, LAZY
