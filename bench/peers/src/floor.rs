//! The floor arm of a ping-pong round (`--floor`): the `floor` binary
//! beside this one (see `src/bin/floor.rs`), run for one size, the ring
//! depth of that size's runs and the round's share of round trips, on the
//! same CPUs and priority as the sides. Its round trips go into the
//! report as a ping side's would.
//!
//! As for the roles, nothing here waits without a deadline: the floor
//! gets the budget of a ping-pong run and is killed past it, and it dies
//! with this process (`floor --parent`).

use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde::Deserialize;

use crate::host::Host;
use crate::plan::Run;
use crate::role::RoleResult;
use crate::runner::{budget, describe, Outcome};
use crate::settings::Settings;

/// One size and depth of the floor's `--json` output.
#[derive(Debug, Deserialize)]
struct Measured {
    size: usize,
    depth: u64,
    samples_ns: Vec<u64>,
}

/// The floor's `--json` output.
#[derive(Debug, Deserialize)]
struct Output {
    sched: String,
    runs: Vec<Measured>,
}

/// Reads all of `r` on a thread of its own.
fn drain(mut r: impl std::io::Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = r.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Makes the floor run `run`.
pub fn execute(run: &Run, s: &Settings, host: &Host) -> Result<Outcome> {
    let what = describe(run);
    let exe = std::env::current_exe()
        .context("finding this program")?
        .with_file_name("floor");
    if !exe.exists() {
        bail!(
            "{what}: {} is not there (--floor runs it; build all of bench/peers: cargo build --release --manifest-path bench/peers/Cargo.toml)",
            exe.display()
        );
    }
    let mut cmd = Command::new(&exe);
    cmd.arg("--sizes")
        .arg(run.size.to_string())
        .arg("--depths")
        .arg(run.depth.to_string())
        .arg("--round-trips")
        .arg(run.count.to_string())
        .arg("--rounds")
        .arg("1")
        .arg("--sender-cpu")
        .arg(s.sender_cpu.to_string())
        .arg("--receiver-cpu")
        .arg(s.receiver_cpu.to_string())
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--json");
    match host.priority {
        Some(p) => cmd.arg("--priority").arg(p.to_string()),
        None => cmd.arg("--no-fifo"),
    };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("{what}: starting {}", exe.display()))?;
    let out = drain(child.stdout.take().expect("piped"));
    let err = drain(child.stderr.take().expect("piped"));
    let deadline = Instant::now() + budget(run, s);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                // Our own child, by its handle.
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "{what}: the floor (pid {}) did not finish in time; killed",
                    child.id()
                );
            }
            Err(e) => bail!("{what}: the floor cannot be waited for: {e}"),
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if !status.success() {
        bail!(
            "{what}: the floor exited with {status}; its stderr ends:\n{}",
            err.trim()
        );
    }
    let got: Output = serde_json::from_str(out.trim())
        .with_context(|| format!("{what}: reading the floor's output"))?;
    let Some(m) = got
        .runs
        .into_iter()
        .find(|m| m.size == run.size && m.depth == run.depth)
    else {
        bail!("{what}: the floor reported no run of this size and depth");
    };
    Ok(Outcome {
        run: run.clone(),
        sender: RoleResult {
            received: m.samples_ns.len() as u64,
            samples_ns: m.samples_ns,
            ..RoleResult::default()
        },
        receivers: Vec::new(),
        sched: vec![("floor", got.sched)],
    })
}
