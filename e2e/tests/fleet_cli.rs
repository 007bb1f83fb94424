//! The `fleet` command as a user runs it: `up --lifeboat` starts the clusters, the hub and an
//! agent per member; `status --json` shows them (pid, alive, ports, log, each Cluster's Ready);
//! `kill-lifeboat` / `restart-lifeboat` break and mend an agent; `down` stops everything.
//!
//! Needs the binaries: `cargo build -p lifeboat-hub -p lifeboat-agent` (`make e2e` does it).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lifeboat_e2e::fleet::workspace_root;
use serde_json::Value;

fn fleet(state_dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .arg("--state-dir")
        .arg(state_dir)
        .args(args)
        .output()
        .expect("running the fleet command");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn status(state_dir: &Path) -> Value {
    let (_, stdout, stderr) = fleet(state_dir, &["status", "--json"]);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("status --json: {e}: {stderr}"))
}

/// Stops the fleet even when an assertion fails.
struct Down<'a>(&'a Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = fleet(self.0, &["down"]);
    }
}

#[test]
fn fleet_up_lifeboat_runs_the_hub_and_an_agent_per_member() {
    let state_dir = workspace_root().join("target/e2e-fleets/fleet-cli");
    let _down = Down(&state_dir);
    let (ok, stdout, stderr) = fleet(
        &state_dir,
        &[
            "up",
            "--members",
            "2",
            "--nodes-per-member",
            "1",
            "--lifeboat",
            "--cluster-lease-seconds",
            "10",
            "--heartbeat-seconds",
            "2",
        ],
    );
    assert!(ok, "fleet up --lifeboat failed:\n{stdout}\n{stderr}");

    let s = status(&state_dir);
    let lifeboat = &s["lifeboat"];
    let processes = lifeboat["processes"].as_array().expect("processes");
    let names: Vec<(&str, &str)> = processes
        .iter()
        .map(|p| {
            (
                p["cluster"].as_str().unwrap_or(""),
                p["component"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("hub", "lifeboat-hub-1"),
            ("member-1", "lifeboat-agent"),
            ("member-2", "lifeboat-agent")
        ]
    );
    for p in processes {
        assert_eq!(p["alive"], true, "{p}");
        let log = Path::new(p["log"].as_str().unwrap_or(""));
        assert!(log.starts_with(&state_dir) && log.is_file(), "{p}");
        let pid = std::fs::read_to_string(log.with_extension("pid")).expect("pid file");
        assert_eq!(pid.trim(), p["pid"].to_string(), "{p}");
    }
    assert_eq!(lifeboat["leader"], "lifeboat-hub-1");
    let ready: Vec<(&str, &str)> = lifeboat["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or(""),
                m["ready"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(ready, [("member-1", "True"), ("member-2", "True")]);

    // A killed agent: `status` says so and exits 1; the hub marks its Cluster Unknown.
    let (ok, _, stderr) = fleet(&state_dir, &["kill-lifeboat", "member-2"]);
    assert!(ok, "{stderr}");
    let (ok, _, _) = fleet(&state_dir, &["status"]);
    assert!(!ok, "status exits 1 while an agent is down");
    let started = Instant::now();
    loop {
        let s = status(&state_dir);
        let m2 = &s["lifeboat"]["members"][1];
        if m2["ready"] == "Unknown" {
            assert_eq!(
                m2["taints"][0], "cluster.lifeboat.dev/unreachable:NoSchedule",
                "{m2}"
            );
            assert_eq!(s["lifeboat"]["processes"][2]["alive"], false);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "member-2 still {m2}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (ok, _, stderr) = fleet(&state_dir, &["restart-lifeboat", "member-2"]);
    assert!(ok, "{stderr}");
    let started = Instant::now();
    while !fleet(&state_dir, &["status"]).0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not ready again: {}",
            status(&state_dir)["lifeboat"]
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    let pids: Vec<i64> = status(&state_dir)["lifeboat"]["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|p| p["pid"].as_i64())
        .collect();
    let (ok, _, stderr) = fleet(&state_dir, &["down"]);
    assert!(ok, "{stderr}");
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z")),
            "process {pid} still runs after down"
        );
    }
    assert!(!state_dir.exists());
}
