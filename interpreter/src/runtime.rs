//! A pool of sandboxes shared by callers on any thread.

use std::sync::Mutex;

use crate::error::RunError;
use crate::sandbox::{Limits, Sandbox, Script};

/// Pool and limit settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Limits applied to every evaluation.
    pub limits: Limits,
    /// Idle Lua states kept for reuse. A caller that finds none idle gets a new state, which is
    /// kept afterwards only if fewer than `pool_size` are idle (Karmada's FixedPool behaviour).
    pub pool_size: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            limits: Limits::default(),
            pool_size: 8,
        }
    }
}

/// Runs scripts on pooled sandboxes.
pub struct Runtime {
    config: RuntimeConfig,
    idle: Mutex<Vec<Sandbox>>,
}

impl Runtime {
    pub fn new(config: RuntimeConfig) -> Runtime {
        Runtime {
            config,
            idle: Mutex::new(Vec::new()),
        }
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Runs `work` on a pooled sandbox.
    pub fn with_sandbox<R>(
        &self,
        work: impl FnOnce(&mut Sandbox) -> Result<R, RunError>,
    ) -> Result<R, RunError> {
        let taken = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut sandbox = match taken {
            Some(sandbox) => sandbox,
            None => Sandbox::new(self.config.limits)?,
        };
        let result = work(&mut sandbox);
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.config.pool_size {
            idle.push(sandbox);
        }
        result
    }

    /// Compiles a script (and caches it in the sandbox used), reporting syntax errors.
    pub fn check_compiles(&self, script: &Script) -> Result<(), RunError> {
        self.with_sandbox(|sandbox| sandbox.compile(script).map(|_| ()))
    }

    /// Idle sandboxes and the bytes their Lua states hold.
    pub fn idle_memory(&self) -> (usize, usize) {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        (idle.len(), idle.iter().map(Sandbox::used_memory).sum())
    }
}
