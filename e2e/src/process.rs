//! Component processes: each runs in its own process group with its output in a log file, so the
//! whole group (and anything it forked) can be stopped at once, also from another `fleet` run.

use std::io::{BufRead, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What is needed to (re)start one component, and where it is now. Stored in the fleet state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProcessRecord {
    pub component: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub log: PathBuf,
    /// Process id, also the process group id (0 while stopped).
    pub pid: i32,
    /// The loopback ports it listens on (on the command line too).
    #[serde(default)]
    pub ports: Vec<u16>,
}

impl ProcessRecord {
    /// Starts the component in a new process group, appending its output to its log.
    pub fn spawn(&mut self) -> Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| Error::io(&self.log, e))?;
        let log_err = log.try_clone().map_err(|e| Error::io(&self.log, e))?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0)
            .spawn()
            .map_err(|e| Error::io(&self.program, e))?;
        self.pid = i32::try_from(child.id()).map_err(|_| Error::Invalid("pid overflow".into()))?;
        Ok(child)
    }

    /// True when the recorded process still runs and is ours: its command line names our log's
    /// directory, so a recycled pid of an unrelated process is never signalled.
    pub fn is_running(&self) -> bool {
        if self.pid <= 0 {
            return false;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", self.pid)) else {
            return false;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
            // Field 3 is the state; a zombie has finished.
            if stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            {
                return false;
            }
        }
        let marker = self
            .log
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        !marker.is_empty() && cmdline.contains(&marker)
    }

    /// Stops the whole process group: SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, child: Option<&mut Child>, grace: Duration) -> Result<()> {
        if self.pid <= 0 {
            return Ok(());
        }
        let pgid = Pid::from_raw(self.pid);
        let owned_or_ours = child.is_some() || self.is_running();
        if owned_or_ours {
            match killpg(pgid, Signal::SIGTERM) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(source) => {
                    return Err(Error::Signal {
                        pid: self.pid,
                        source,
                    });
                }
            }
            let deadline = Instant::now() + grace;
            let mut child = child;
            loop {
                let exited = match child.as_deref_mut() {
                    Some(c) => matches!(c.try_wait(), Ok(Some(_))),
                    None => !self.is_running(),
                };
                if exited {
                    break;
                }
                if Instant::now() >= deadline {
                    let _ = killpg(pgid, Signal::SIGKILL);
                    if let Some(c) = child.as_deref_mut() {
                        let _ = c.wait();
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // Anything the component forked into its group goes too.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        self.pid = 0;
        Ok(())
    }

    /// Kills the whole process group with SIGKILL at once (a crash: nothing runs its shutdown)
    /// and reaps it.
    pub fn kill(&mut self, child: Option<&mut Child>) -> Result<()> {
        if self.pid <= 0 {
            return Ok(());
        }
        if child.is_some() || self.is_running() {
            match killpg(Pid::from_raw(self.pid), Signal::SIGKILL) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(source) => {
                    return Err(Error::Signal {
                        pid: self.pid,
                        source,
                    });
                }
            }
            match child {
                Some(c) => {
                    let _ = c.wait();
                }
                None => {
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while self.is_running() && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        }
        self.pid = 0;
        Ok(())
    }

    /// The last `lines` lines of the component's log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// Current length of the log (where the output of the next start begins).
    pub fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0)
    }

    /// The log from byte `offset` on (at most its last 64 KiB).
    pub fn log_since(&self, offset: u64) -> String {
        let Ok(mut file) = std::fs::File::open(&self.log) else {
            return String::new();
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = file.seek(SeekFrom::Start(offset.max(len.saturating_sub(64 * 1024))));
        let mut bytes = Vec::new();
        let _ = std::io::Read::read_to_end(&mut file, &mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The last `lines` lines of a file (reads at most the last 64 KiB).
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let all: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .map_while(|l| l.ok())
        .collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Peak resident memory (VmHWM) of a process in bytes, if it is running.
pub fn peak_rss_bytes(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// Current resident memory (VmRSS) of a process in bytes, if it is running.
pub fn rss_bytes(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// CPU seconds (user and system) a process has used so far, from `/proc/<pid>/stat`; `None`
/// once the process is gone. USER_HZ is 100 on Linux.
pub fn cpu_seconds(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: count fields after it. There
    // the state is the first field, utime the 12th and stime the 13th (14 and 15 in proc(5)).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_returns_last_lines() {
        let dir = std::env::temp_dir().join(format!("lifeboat-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("x.log");
        std::fs::write(&file, "a\nb\nc\nd\n").unwrap();
        assert_eq!(tail(&file, 2), "c\nd");
        assert_eq!(tail(&file, 10), "a\nb\nc\nd");
        assert!(tail(&dir.join("missing"), 2).contains("no log"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn spawn_and_stop_a_process_group() {
        let dir = std::env::temp_dir().join(format!("lifeboat-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sleeper.log");
        let mut record = ProcessRecord {
            component: "sleeper".into(),
            program: "/bin/sh".into(),
            // The log path on the command line is what `is_running` checks.
            args: vec![
                "-c".into(),
                format!("echo started >> {}; sleep 30 & wait", log.display()),
            ],
            log: log.clone(),
            pid: 0,
            ports: vec![],
        };
        let mut child = record.spawn().unwrap();
        let pid = record.pid;
        assert!(pid > 0);
        std::thread::sleep(Duration::from_millis(200));
        assert!(record.is_running());
        record
            .stop(Some(&mut child), Duration::from_secs(2))
            .unwrap();
        assert_eq!(record.pid, 0);
        // The group is gone: the recorded pid no longer names a running process of ours.
        let stopped = ProcessRecord {
            pid,
            ..record.clone()
        };
        assert!(!stopped.is_running());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cpu_seconds_counts_this_process_and_not_a_missing_one() {
        let own = i32::try_from(std::process::id()).unwrap();
        let before = cpu_seconds(own).unwrap();
        // Burn a little more than one tick of CPU.
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = cpu_seconds(own).unwrap();
        assert!(after > before, "{before} then {after}");
        assert_eq!(cpu_seconds(i32::MAX), None);
    }
}
