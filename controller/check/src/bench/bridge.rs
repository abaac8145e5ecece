//! The bridge's cost to the real-time pair (`deploy bench wake --bridge
//! PATH`): while the pair runs, robot A's bridge (`rtdeploy-bridge`, the
//! program given) reads the pair's channel as a fetcher and forwards every
//! message over Zenoh to robot B's bridge, which publishes it into a
//! channel of its own. Both run SCHED_OTHER on the sender's CPU (the
//! housekeeping side of this two-CPU machine), started through `chrt -o 0`
//! and `taskset` so that no thread of theirs inherits the bench's
//! SCHED_FIFO. What the bridge adds is its fetcher reads of the channel's
//! ring and header (never a subscriber entry, a futex or a bell) and its
//! CPU time beside the pair: the arm measures both, A's CPU time per
//! message forwarded read from /proc.

use std::process::{Child, Command, Stdio};
use std::time::Instant;

use super::*;

/// The plan of a bridge with one link on `/bench/wake`.
fn plan(robot: &str, out: bool, endpoint: &str) -> String {
    serde_json::json!({
        "robot": robot,
        "mode": "peer",
        "connect": if out { Vec::<String>::new() } else { vec![endpoint.to_string()] },
        "listen": if out { vec![endpoint.to_string()] } else { Vec::<String>::new() },
        "multicast_scouting": false,
        "domain_id": 0,
        "node": robot.replace('-', "_"),
        "memory": 64u64 << 20,
        "links": [{
            "channel": "/bench/wake",
            "max_size": 64,
            "direction": if out { "out" } else { "in" },
            "ros2": null,
            "from": if out { None } else { Some("bench-a") },
            "reliable": false,
            "priority": 5,
            "ttl_ns": null,
            "rate": null
        }]
    })
    .to_string()
}

/// Two bridges forwarding the pair's channel, killed on drop.
pub(super) struct Bridges {
    a: Child,
    b: Child,
    _b_dir: TempDir,
    cpu0: u64,
    a_shm: PathBuf,
}

impl Drop for Bridges {
    fn drop(&mut self) {
        for c in [&mut self.a, &mut self.b] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn err(why: String) -> BenchRunError {
    BenchRunError::Receiver {
        path: PathBuf::from("rtdeploy-bridge"),
        why,
    }
}

/// A process's user and system CPU time, ns (/proc/<pid>/stat).
fn cpu_ns(proc_root: &Path, pid: u32) -> u64 {
    let text = std::fs::read_to_string(proc_root.join(format!("{pid}/stat"))).unwrap_or_default();
    // After the command's closing parenthesis: state is field 3, utime 14.
    let rest = text.rsplit_once(')').map_or("", |r| r.1);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    // USER_HZ: 100 on Linux's ABI (times(2), /proc), whatever CONFIG_HZ.
    ticks.saturating_mul(10_000_000)
}

/// The latest status JSON of a bridge whose channel directory is `shm`.
fn status(shm: &Path) -> Option<serde_json::Value> {
    let ch = Channel::open(shm, "/rtdeploy/bridge/status").ok()?;
    let next = ch.next_index();
    if next == 0 {
        return None;
    }
    let mut r = ch.reader_at(next - 1);
    let m = r.next_message().ok()??;
    serde_json::from_slice(m.data).ok()
}

fn spawn(bin: &Path, cpu: Option<usize>, shm: &Path, plan: String) -> Result<Child, BenchRunError> {
    let mut c = Command::new("chrt");
    c.args(["-o", "0"]);
    if let Some(cpu) = cpu {
        c.args(["taskset", "-c", &cpu.to_string()]);
    }
    c.arg(bin)
        .env("RTDEPLOY_BRIDGE_PLAN", plan)
        .env(units::env::SHM_DIR, shm)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c.spawn()
        .map_err(|e| err(format!("chrt {}: {e}", bin.display())))
}

/// Starts A on `a_shm` (where the pair's channel is) and B beside it,
/// and waits (at most 10 s) until they have met.
pub(super) fn start(
    bin: &Path,
    a_shm: &Path,
    opts: &WakeOptions,
    cpu: Option<usize>,
) -> Result<Bridges, BenchRunError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| err(format!("a free port: {e}")))?
        .port();
    let endpoint = format!("tcp/127.0.0.1:{port}");
    let b_dir = bench_dir(&opts.shm_dir)?;
    channel_for(
        b_dir.path(),
        "/bench/wake",
        &ChannelGeometry::new(64, 1024, 2),
        &opts.proc_root,
    )?;
    let a = spawn(bin, cpu, a_shm, plan("bench-a", true, &endpoint))?;
    let b = spawn(bin, cpu, b_dir.path(), plan("bench-b", false, &endpoint))?;
    let mut br = Bridges {
        a,
        b,
        _b_dir: b_dir,
        cpu0: 0,
        a_shm: a_shm.to_path_buf(),
    };
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let met = status(br._b_dir.path())
            .is_some_and(|s| s["peers"].as_array().is_some_and(|p| !p.is_empty()));
        if met {
            break;
        }
        for (name, c) in [("A", &mut br.a), ("B", &mut br.b)] {
            if let Ok(Some(st)) = c.try_wait() {
                return Err(err(format!("bridge {name} ended: {st}")));
            }
        }
        if Instant::now() > until {
            return Err(err("the two bridges did not meet within 10 s".into()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Declarations travel with the connection: a margin.
    std::thread::sleep(Duration::from_millis(300));
    br.cpu0 = cpu_ns(&opts.proc_root, br.a.id());
    Ok(br)
}

impl Bridges {
    /// A's CPU time since [`start`] and the messages it sent (after its
    /// next status).
    pub(super) fn finish(self, proc_root: &Path) -> (u64, u64) {
        std::thread::sleep(Duration::from_millis(600));
        let cpu = cpu_ns(proc_root, self.a.id()).saturating_sub(self.cpu0);
        let sent = status(&self.a_shm)
            .and_then(|s| s["links"][0]["sent"].as_u64())
            .unwrap_or(0);
        (cpu, sent)
    }
}
