//! `deploy demo [--for D] [--keep DIR]`: the first run. The example robot
//! (`examples/first-run.yaml`: the example controllers talker and
//! listener on one channel) runs under the supervisor for a bounded time,
//! in a directory of its own, as whoever runs it: no root, no CPU plan,
//! no real-time scheduling. Then its status, each process's wakeup
//! timing and the listener's log are shown, the supervisor stops, and the
//! directory goes (unless `--keep DIR` or `--prefix DIR` names one).
//!
//! The controllers are the ones cargo built beside this `deploy`
//! (`target/<profile>/examples/`).
//!
//! Exit codes: 0 the robot ran, both processes reported; 1 a process
//! failed or never reported; 2 it could not run (no example controllers,
//! a supervisor that did not start).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use services::control::{self, Request};
use services::status::{render_table, SupervisorStatus};
use units::duration::Dur;

use crate::ctx::{Ctx, Exit};

/// The robot of the first run, as the repository has it.
const ROBOT_YAML: &str = include_str!("../../../examples/first-run.yaml");

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How long the robot runs before its status is shown.
    #[arg(long = "for", value_name = "D", default_value = "10s", value_parser = Dur::parse)]
    pub run_for: Dur,
    /// Keep the robot's directory (robot.yaml, logs, channel files) at DIR
    /// [default: a temporary directory, removed at the end; `--prefix DIR`
    /// also keeps it].
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
}

/// The example controllers beside `exe` (`target/<profile>/deploy` has
/// them in `target/<profile>/examples/`).
fn examples(exe: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = exe
        .parent()
        .map(|d| d.join("examples"))
        .unwrap_or_else(|| PathBuf::from("examples"));
    let (t, l) = (dir.join("talker"), dir.join("listener"));
    anyhow::ensure!(
        t.is_file() && l.is_file(),
        "the example controllers are not built in {} (build them with `cargo build -p controller --examples`; the README's first command builds them with deploy)",
        dir.display()
    );
    Ok((t, l))
}

/// Stops the supervisor if the demo ends early.
struct Supervisor(Child);

impl Drop for Supervisor {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The most of the supervisor's own output read back for a message.
const MAX_LOG_TAIL: u64 = 256 << 10;

/// The newest [`MAX_LOG_TAIL`] bytes of the supervisor's own output (a
/// line cut by the limit left out), empty when it cannot be read. Through
/// a link as it was written (`File::create` follows one).
fn log_tail(log: &Path) -> String {
    let Ok(t) = units::bounded::Bound::regular(MAX_LOG_TAIL)
        .following_links()
        .read_tail(log)
    else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&t.bytes);
    match text.split_once('\n') {
        Some((_, rest)) if t.skipped > 0 => rest.to_string(),
        _ => text.into_owned(),
    }
}

fn status(prefix: &Path) -> Option<SupervisorStatus> {
    control::request(&control::socket_path(prefix), &Request::Status)
        .ok()
        .and_then(|r| r.status)
}

pub fn run(ctx: &Ctx, args: DemoArgs) -> anyhow::Result<Exit> {
    let exe = std::env::current_exe().context("cannot find the path of this program")?;
    let (talker, listener) = examples(&exe)?;
    // The directory: --prefix, --keep, or a temporary one.
    let temp;
    let prefix = if ctx.prefix != Path::new("/") {
        ctx.prefix.clone()
    } else if let Some(k) = &args.keep {
        k.clone()
    } else {
        temp = tempfile::Builder::new()
            .prefix("rtdeploy-demo-")
            .tempdir()
            .context("cannot create a temporary directory")?;
        temp.path().to_path_buf()
    };
    let etc = prefix.join("etc/rtdeploy");
    std::fs::create_dir_all(&etc).with_context(|| format!("cannot create {}", etc.display()))?;
    // The controllers as cargo built them (robot.yaml's bin/ paths name a
    // release's programs; this run has no release).
    let yaml = ROBOT_YAML
        .replace("exec: bin/talker", &format!("exec: {}", talker.display()))
        .replace(
            "exec: bin/listener",
            &format!("exec: {}", listener.display()),
        );
    let config = etc.join("robot.yaml");
    std::fs::write(&config, yaml).with_context(|| format!("cannot write {}", config.display()))?;
    let demo_ctx = Ctx {
        prefix: prefix.clone(),
        config_path: config.clone(),
        ..ctx.clone()
    };
    super::load_robot(&demo_ctx)?;

    let log = prefix.join("supervise.log");
    ctx.note(format!(
        "deploy demo: examples/first-run.yaml (talker publishes on /demo/ping every 1 ms, listener is woken by each message) under {} for {}; no privilege needed: no CPU plan, the policy and nice value it inherits; the supervisor's own output goes to {}",
        prefix.display(),
        args.run_for,
        log.display()
    ));
    let out =
        std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let sup = Supervisor(
        Command::new(&exe)
            .arg("--prefix")
            .arg(&prefix)
            .arg("-c")
            .arg(&config)
            .args(["supervise", "--skip-cpu-plan"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot run {} supervise", exe.display()))?,
    );
    let mut sup = sup;

    // Both reporting (a watchdog of 30 s), then the rest of the run.
    let started = Instant::now();
    let reporting = |s: &SupervisorStatus| {
        s.processes
            .iter()
            .all(|p| p.timing.as_ref().is_some_and(|t| t.reports >= 1))
    };
    let mut last = None;
    while started.elapsed() < args.run_for.0.max(Duration::from_secs(30)) {
        if let Some(st) = sup.0.try_wait()? {
            let text = log_tail(&log);
            anyhow::bail!("the supervisor stopped ({st}): {}", text.trim());
        }
        last = status(&prefix);
        let ok = last.as_ref().is_some_and(reporting);
        let failed = last.as_ref().is_some_and(|s| {
            s.processes
                .iter()
                .any(|p| matches!(p.state.as_str(), "failed" | "refused"))
        });
        if failed || (ok && started.elapsed() >= args.run_for.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let Some(s) = last else {
        anyhow::bail!(
            "the supervisor never answered on {}: {}",
            control::socket_path(&prefix).display(),
            log_tail(&log).trim()
        );
    };

    println!(
        "== deploy status (after {:.1}s)",
        started.elapsed().as_secs_f64()
    );
    print!("{}", render_table(&s));
    println!();
    println!("== wakeup timing since each event loop started (not real-time figures: no SCHED_FIFO, no isolated CPU)");
    for p in &s.processes {
        match &p.timing {
            Some(t) => {
                let us = |v: Option<f64>| match v {
                    None => "-".to_string(),
                    Some(v) if v >= 1000.0 => format!("{:.2}ms", v / 1000.0),
                    Some(v) => format!("{v:.1}us"),
                };
                println!(
                    "{:<10} {} reports, backend {}: median {}, p99 {}, longest {} (budget {})",
                    p.name,
                    t.reports,
                    p.backend.as_deref().unwrap_or("-"),
                    us(t.since_start_wakeup_p50_us),
                    us(t.since_start_wakeup_p99_us),
                    us(t.since_start_wakeup_max_us),
                    us(t.wakeup_budget_us),
                );
            }
            None => println!("{:<10} no timing report", p.name),
        }
    }
    println!();
    println!("== deploy logs listener (its last lines)");
    if let Ok(r) = control::request(
        &control::socket_path(&prefix),
        &Request::Logs {
            name: "listener".into(),
            lines: 4,
            follow: false,
        },
    ) {
        for l in r.lines.unwrap_or_default() {
            println!("{l}");
        }
    }

    // An orderly stop.
    let _ = control::request(&control::socket_path(&prefix), &Request::StopAll);
    let until = Instant::now() + Duration::from_secs(15);
    while sup.0.try_wait()?.is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(sup);
    println!();
    if ctx.prefix != Path::new("/") || args.keep.is_some() {
        println!(
            "the robot's directory stays: {} (robot.yaml, var/log/rtdeploy, dev/shm/rtdeploy)",
            prefix.display()
        );
    }
    let failed: Vec<String> = s
        .processes
        .iter()
        .filter(|p| p.timing.is_none() || matches!(p.state.as_str(), "failed" | "refused"))
        .map(|p| match &p.reason {
            Some(r) => format!("{} ({}: {r})", p.name, p.state),
            None => format!("{} ({})", p.name, p.state),
        })
        .collect();
    if failed.is_empty() {
        println!("next: `deploy plan -c examples/orin-nano.yaml`, the CPU plan of a real robot");
        Ok(Exit::Ok)
    } else {
        let said = log_tail(&log);
        let tail: Vec<&str> = said.lines().rev().take(8).collect();
        eprintln!(
            "deploy: the demo did not run as it should: {}; the supervisor said:\n{}",
            failed.join(", "),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        Ok(Exit::Failed)
    }
}
