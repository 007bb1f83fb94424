-- Run once per Lua state with the real globals (sandbox.rs): builds the base environment
-- scripts see and returns the per-evaluation entry point.
--
-- Receives: fatal (is this error a tripped limit?), error_text (the message of an error
-- raised in Rust), the kube module, the insertion-order metatable to fill (ORDERED, shared
-- with Rust), the longest error message kept, and the deepest nesting a helper argument may
-- have.
local fatal, error_text, kube, ORDERED, error_bytes, max_depth = ...
local G = _G
local pcall, xpcall, error, setmetatable, getmetatable, tostring, type, select =
  pcall, xpcall, error, setmetatable, getmetatable, tostring, type, select
local rawget, rawset, rawlen, next, raw_pairs = rawget, rawset, rawlen, next, pairs
local string, table, math, os = string, table, math, os
local math_type, sort, concat, string_sub, string_format, string_find, string_match =
  math.type, table.sort, table.concat, string.sub, string.format, string.find, string.match

---------------------------------------------------------------------------------------------
-- Deterministic, Karmada-faithful iteration order.
--
-- gopher-lua (Karmada) walks a table's positive integer keys in ascending order, then its
-- other keys in the order they were first inserted. Lua 5.4 walks its hash part in an order
-- that depends on a string-hash seed chosen per state, so `pairs` and `next` are replaced:
--
-- * Tables created by a script's table constructors (rewritten at compile time, see order.rs:
--   `{a = 1, b = 2}` becomes `__lifeboat_table({a = 1, b = 2}, "a", "b")`), by the JSON
--   conversion of arguments and helper results, and any plain table a script iterates, carry
--   the ORDERED metatable. Its `__newindex` (called by Lua only for keys not yet present)
--   appends the key to the table's record.
-- * A record lists the table's non-integer keys in order (rec[1..n]) and maps each of them to
--   its position (rec[key]); positive integers never go in a record, so the two parts cannot
--   collide. A constructor's record gets its positions only when first needed (`positions`):
--   most constructed tables are never iterated nor extended. A table without a record orders its present keys by value (numbers, then
--   strings), which for a converted JSON object is its field order (serde_json keeps fields
--   sorted); keys added later come after them, in insertion order.
-- * `next` and `pairs` walk a snapshot of that order, cached until a key is inserted.
---------------------------------------------------------------------------------------------
local RECORD = setmetatable({}, { __mode = "k" })
local SNAPSHOT = setmetatable({}, { __mode = "k" })
local POSITION = setmetatable({}, { __mode = "k" })

local TYPE_RANK = { number = 1, string = 2, boolean = 3 }
-- Total order for keys of different types (tables and functions as keys of a table without
-- a record have no stable order; scripts can only create such tables through a constructor,
-- which records them).
local function key_less(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return (TYPE_RANK[ta] or 4) < (TYPE_RANK[tb] or 4) end
  if ta == "number" or ta == "string" then return a < b end
  if ta == "boolean" then return b and not a end
  return false
end

local function is_array_key(k)
  return math_type(k) == "integer" and k > 0
end

-- Appends keys[1..n] to the record, sorted (strings compare as bytes in the C locale).
local function append_sorted(rec, keys, n, strings)
  if n > 1 then
    if strings then sort(keys) else sort(keys, key_less) end
  end
  local count = #rec
  for i = 1, n do
    local k = keys[i]
    count = count + 1
    rec[count] = k
    rec[k] = count
  end
end

-- A record for a table that has none yet: its present keys, sorted.
local function new_record(t)
  local keys, n, strings = {}, 0, true
  for k in next, t do
    if not is_array_key(k) then
      n = n + 1
      keys[n] = k
      if strings and type(k) ~= "string" then strings = false end
    end
  end
  local rec = {}
  append_sorted(rec, keys, n, strings)
  RECORD[t] = rec
  return rec
end

-- Gives the keys rec[1..n] their positions, a repeated key dropped; returns how many keys
-- remain (the slots after them are left as they were).
local function place(rec, n)
  local j = 0
  for i = 1, n do
    local k = rec[i]
    if rec[k] == nil then
      j = j + 1
      rec[j] = k
      rec[k] = j
    end
  end
  return j
end

-- Completes a constructor's record. A record has all its positions once its first key has one.
local function positions(rec)
  local first = rec[1]
  if first == nil or rec[first] ~= nil then return rec end
  local n = #rec
  for i = place(rec, n) + 1, n do rec[i] = nil end
  return rec
end

ORDERED.__newindex = function(t, k, v)
  if v ~= nil then
    if k ~= nil and k == k and not is_array_key(k) then
      local rec = RECORD[t]
      if rec == nil then rec = new_record(t) else positions(rec) end
      if rec[k] == nil then
        local n = #rec + 1
        rec[n] = k
        rec[k] = n
      end
    end
    SNAPSHOT[t] = nil
  end
  rawset(t, k, v)
end

-- Computed keys of the constructors being evaluated (`[expr] = value` fields), in
-- evaluation order: `__lifeboat_key(expr)` pushes, the constructor's hook pops its own.
local pending, pending_n = {}, 0
local function computed_key(k)
  pending_n = pending_n + 1
  pending[pending_n] = k
  return k
end

-- The rest of a constructor's keys from the first computed one (position i) on; j keys are
-- recorded so far.
local function construct_computed(t, rec, n, i, j)
  -- The names before i get their positions (the fast path records none).
  j = place(rec, j)
  local computed = 0
  for m = i, n do
    if rec[m] == true then computed = computed + 1 end
  end
  local base = pending_n - computed
  if base < 0 then base = 0 end
  local c = base
  for m = i, n do
    local k = rec[m]
    if k == true then
      c = c + 1
      k = pending[c]
      pending[c] = nil
    end
    if k ~= nil and t[k] ~= nil and rec[k] == nil and not is_array_key(k) then
      j = j + 1
      rec[j] = k
      rec[k] = j
    end
  end
  for m = j + 1, n do rec[m] = nil end
  pending_n = base
  RECORD[t] = rec
  return t
end

-- The constructor hook: `__lifeboat_table(t, key, ...)`, one argument per keyed field in
-- source order (a name, or `true` for a computed key). It runs for every constructor a script
-- evaluates, so it is kept short: scripts cannot reach it (its name is reserved, order.rs), so
-- `t` is always a table just built; the keys are never nil, so `#rec` counts them; names are
-- strings, never array keys. Positions (and the removal of a repeated name) wait for
-- `positions`.
local function construct(t, ...)
  setmetatable(t, ORDERED)
  if ... == nil then return t end
  local rec = { ... }
  local n = #rec
  local j = 0
  for i = 1, n do
    local k = rec[i]
    if k == true then return construct_computed(t, rec, n, i, j) end
    if t[k] ~= nil then
      j = j + 1
      rec[j] = k
    end
  end
  for i = j + 1, n do rec[i] = nil end
  RECORD[t] = rec
  return t
end

local function snapshot(t)
  local keys, n, last, ascending = {}, 0, 0, true
  local rec = RECORD[t]
  if rec ~= nil then positions(rec) end
  local extra, e, strings = nil, 0, true
  for k in next, t do
    if is_array_key(k) then
      n = n + 1
      keys[n] = k
      if k < last then ascending = false end
      last = k
    elseif rec == nil or rec[k] == nil then
      -- Not recorded (a table without a record, or a key set behind the record's back,
      -- which only Rust can do): sorted, after the recorded ones.
      e = e + 1
      extra = extra or {}
      extra[e] = k
      if strings and type(k) ~= "string" then strings = false end
    end
  end
  if not ascending then sort(keys) end
  if e > 0 then
    rec = rec or {}
    append_sorted(rec, extra, e, strings)
    RECORD[t] = rec
  end
  local position = {}
  if rec ~= nil then
    -- Recorded keys whose value is nil now stay in the snapshot: `next` may be given them.
    for i = 1, #rec do
      local k = rec[i]
      n = n + 1
      keys[n] = k
      position[k] = n
    end
  end
  SNAPSHOT[t] = keys
  POSITION[t] = position
  return keys, position
end

-- Position of the first array key greater than k (keys[1..] starts with them, ascending).
local function after_integer(keys, k)
  local lo, hi = 1, #keys
  while lo <= hi do
    local mid = (lo + hi) // 2
    local key = keys[mid]
    if is_array_key(key) and key <= k then lo = mid + 1 else hi = mid - 1 end
  end
  return lo
end

local materialize
local LAZY = {}

-- next() for a table whose iteration has been prepared.
local function step(t, k)
  local keys, position = SNAPSHOT[t], nil
  if keys == nil then keys, position = snapshot(t) else position = POSITION[t] end
  local i
  if k == nil then
    i = 1
  else
    i = position[k]
    if i ~= nil then
      i = i + 1
    elseif keys[k] == k then
      i = k + 1
    elseif is_array_key(k) then
      i = after_integer(keys, k)
    else
      error("invalid key to 'next'", 2)
    end
  end
  local key = keys[i]
  while key ~= nil do
    local v = t[key]
    if v ~= nil then return key, v end
    i = i + 1
    key = keys[i]
  end
  return nil
end

local function prepare(t, name)
  if type(t) ~= "table" then
    error("bad argument #1 to '" .. name .. "' (table expected, got " .. type(t) .. ")", 3)
  end
  local mt = getmetatable(t)
  if mt == nil then
    -- A plain table (the globals, os.date's): its keys are ordered from now on.
    setmetatable(t, ORDERED)
  elseif mt == LAZY then
    materialize(t)
  end
end

local function ordered_pairs(t)
  prepare(t, "pairs")
  return step, t, nil
end

local function ordered_next(t, k)
  prepare(t, "next")
  if k == nil and next(t) == nil then return nil end
  return step(t, k)
end

---------------------------------------------------------------------------------------------
-- Other sources of nondeterminism: addresses (tostring, %p) and random numbers.
---------------------------------------------------------------------------------------------
local ids, next_id
local REFERENCE = { table = true, ["function"] = true, thread = true, userdata = true }
local function stable_tostring(v)
  local kind = type(v)
  if not REFERENCE[kind] then return tostring(v) end
  -- A per-evaluation sequence number instead of the address.
  ids = ids or setmetatable({}, { __mode = "k" })
  local id = ids[v]
  if id == nil then
    next_id = next_id + 1
    id = next_id
    ids[v] = id
  end
  return string_format("%s: 0x%08x", kind, id)
end

local function check_format(fmt)
  -- %p prints an address: refuse it (Karmada's Go formatting has no %p either).
  local pos = string_find(fmt, "%", 1, true)
  while pos do
    local conversion = string_match(fmt, "^[-+ #0]*%d*%.?%d*(.)", pos + 1)
    if conversion == "p" then
      error("bad argument #1 to 'format' (%p is not supported: addresses are not deterministic)", 3)
    end
    pos = string_find(fmt, "%", pos + (conversion == "%" and 2 or 1), true)
  end
end

local function stable_format(fmt, ...)
  local n = select("#", ...)
  local args = nil
  for i = 1, n do
    local v = select(i, ...)
    if REFERENCE[type(v)] then
      args = args or { ... }
      args[i] = stable_tostring(v)
    end
  end
  if type(fmt) == "string" and string_find(fmt, "p", 1, true) then check_format(fmt) end
  if args then return string_format(fmt, table.unpack(args, 1, n)) end
  return string_format(fmt, ...)
end

local SEED = 0
local seeded = false
local function random(...)
  if not seeded then
    math.randomseed(SEED)
    seeded = true
  end
  return math.random(...)
end
local function randomseed(...)
  seeded = true
  if select("#", ...) == 0 then return math.randomseed(SEED) end
  return math.randomseed(...)
end

-- table.sort: the C quicksort picks random pivots for large unbalanced partitions (128
-- elements and more), which makes the order of equal elements vary; sort those in Lua with a
-- stable merge sort.
local RANDOMIZED_SORT_SIZE = 128
local function less(a, b) return a < b end
local function stable_sort(t, lt)
  local n = #t
  if n < RANDOMIZED_SORT_SIZE then return sort(t, lt) end
  if lt ~= nil and type(lt) ~= "function" then
    error("bad argument #2 to 'sort' (function expected, got " .. type(lt) .. ")", 2)
  end
  lt = lt or less
  local src, dst = {}, {}
  for i = 1, n do src[i] = t[i] end
  local width = 1
  while width < n do
    local lo = 1
    while lo <= n do
      local mid, hi = lo + width, lo + 2 * width
      if mid > n + 1 then mid = n + 1 end
      if hi > n + 1 then hi = n + 1 end
      local a, b, k = lo, mid, lo
      while a < mid and b < hi do
        if lt(src[b], src[a]) then
          dst[k] = src[b]; b = b + 1
        else
          dst[k] = src[a]; a = a + 1
        end
        k = k + 1
      end
      while a < mid do dst[k] = src[a]; a = a + 1; k = k + 1 end
      while b < hi do dst[k] = src[b]; b = b + 1; k = k + 1 end
      lo = hi
    end
    src, dst = dst, src
    width = width * 2
  end
  for i = 1, n do t[i] = src[i] end
end

---------------------------------------------------------------------------------------------
-- Lazy arguments: an object argument is an empty table with the LAZY metatable until first
-- use; then `materialize` (set per evaluation, from Rust) fills in one level and gives it the
-- ORDERED metatable, leaving a plain-looking table. Scripts cannot tell: raw access functions
-- are not offered.
---------------------------------------------------------------------------------------------
LAZY.__index = function(t, k) materialize(t) return t[k] end
LAZY.__newindex = function(t, k, v) materialize(t) t[k] = v end
LAZY.__len = function(t) materialize(t) return rawlen(t) end
LAZY.__pairs = function(t) materialize(t) return next, t, nil end

-- Helpers that read whole pod templates get fully materialized tables (each table walked
-- once: shared references are expanded, and bounded, by the conversion in Rust).
local function deep(v, depth, seen)
  if type(v) == "table" and depth <= max_depth and not seen[v] then
    seen[v] = true
    for _, child in raw_pairs(v) do deep(child, depth + 1, seen) end
  end
end
local kube_lazy = {}
for name, f in G.pairs(kube) do
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
str.format = stable_format
-- Method calls on strings ("x"):upper() use the same restricted table.
G.getmetatable("").__index = str

local tab = {}
for k, v in G.pairs(table) do tab[k] = v end
tab.sort = stable_sort
tab.getn = function(t) return #t end
tab.maxn = function(t)
  local n = 0
  for k in ordered_pairs(t) do if type(k) == "number" and k > n then n = k end end
  return n
end

local m = {}
for k, v in G.pairs(math) do m[k] = v end
m.pow = function(x, y) return x ^ y end
m.log10 = function(x) return math.log(x, 10) end
m.mod = math.fmod
m.random = random
m.randomseed = randomseed

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
  next = ordered_next,
  pairs = ordered_pairs,
  select = G.select,
  tonumber = G.tonumber,
  tostring = stable_tostring,
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
for name in G.pairs(base) do fields[#fields + 1] = name .. " = b." .. name end
sort(fields)
local make = G.load("local b = ...\nreturn function()\n local e = {" .. concat(fields, ", ")
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
  factory(env, construct, computed_key)
  local f = rawget(env, name)
  if f == nil then error("not found function " .. name, 0) end
  if type(f) ~= "function" then error(name .. " is not a function: " .. type(f), 0) end
  return f(...)
end

local function finish(ok, ...)
  if ok then return ... end
  error((...), 0)
end

-- One call per evaluation: reset the per-evaluation state, install the materializer, run the
-- script body in fresh globals, call the operation's function.
local function run(factory, name, materializer, ...)
  materialize = materializer
  pending_n, ids, next_id, seeded = 0, nil, 0, false
  return finish(xpcall(body, bounded_error, factory, name, ...))
end
return run, LAZY
