//! `peers`: our runtime against iceoryx2 on the same machine, CPUs,
//! priority and message sizes, in one run of interleaved rounds (ours,
//! iceoryx2 and ours again in each, the order rotated round by round).
//! `scripts/bench-peers.sh` builds and runs it.
//!
//! Design rules:
//! - both sides get the same process setup, the same message type and
//!   bytes, and each its recommended fast path (loans written in place;
//!   blocking event waits, never polling);
//! - every side is a process of its own (this binary, `peers role ...`),
//!   and no wait of the parent is without a deadline;
//! - a run's names are unique to it and removed after it (a later run
//!   removes what a killed one left);
//! - each figure is measured per round and quoted as the median over
//!   rounds of the per-round ratio ours / iceoryx2, with its spread and
//!   the A/A ratio (ours again / ours: the noise of this machine) beside
//!   it; pooled figures are kept too; nothing is tuned for either side;
//! - no message is ever a value on a stack (4 MiB would not fit one):
//!   each is written in a loan and read through a reference.
//!
//! Exit status: 0 measured, 2 could not run or a side failed.

mod floor;
mod host;
mod iox;
mod message;
mod ours;
mod plan;
mod report;
mod role;
mod runner;
mod settings;
mod spawn;
mod stats;

use anyhow::{Context as _, Result};
use clap::Parser as _;

use crate::settings::{Flags, RoleCmd, Settings};

fn main() {
    let flags = Flags::parse();
    let code = match &flags.role {
        Some(RoleCmd::Role { spec }) => match run_role(spec) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("peers role: {e:#}");
                2
            }
        },
        None => match run(&flags) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("peers: {e:#}");
                2
            }
        },
    };
    std::process::exit(code);
}

fn run_role(spec: &str) -> Result<()> {
    let spec: role::RoleSpec = serde_json::from_str(spec).context("reading the role")?;
    role::run(&spec)
}

fn run(flags: &Flags) -> Result<()> {
    let allowed = host::allowed_cpus()?;
    let s = Settings::from_flags(flags, &allowed)?;
    let mut host = host::Host::prepare(&s)?;
    for n in &host.notes {
        eprintln!("peers: note: {n}");
    }
    let runs = plan::plan(&s);
    let mut outcomes = Vec::with_capacity(runs.len());
    let mut failure = None;
    for (i, r) in runs.iter().enumerate() {
        if !s.quiet {
            eprintln!("peers: [{}/{}] {}", i + 1, runs.len(), runner::describe(r));
        }
        match runner::execute(r, &s, &host) {
            Ok(o) => outcomes.push(o),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let before = host.notes.len();
    host.conclude();
    for n in &host.notes[before..] {
        eprintln!("peers: note: {n}");
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let rep = report::build(command, &s, &host, &outcomes);
    if s.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rep).context("encoding the report")?
        );
    } else {
        print!("{}", report::table(&rep));
    }
    Ok(())
}
