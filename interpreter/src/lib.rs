//! Sandboxed, Karmada-compatible Lua resource interpreter.
