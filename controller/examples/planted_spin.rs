//! A planted interferer, to see what `deploy check --trace` says about one:
//! a SCHED_FIFO process pinned to one CPU that spins for a while, sleeps,
//! and spins again, until killed. Run it above the check's real-time
//! priority on the receiver's CPU and the check's verdicts name it
//! (`planted-spin (FIFO 90, pid N) ran ...`).
//!
//! ```text
//! planted-spin --cpu N [--priority 90] [--busy-us 2000] [--every-us 100000] [--seconds S]
//! ```
//!
//! When the CPU plan made an isolated partition, the process joins the
//! cgroup that holds the CPU first (a process outside it cannot be pinned
//! there). Exits after `--seconds` (default: runs until killed).

use std::path::Path;
use std::time::{Duration, Instant};

use controller::rt::join_cgroup_holding;
use units::cpu::CpuSet;
use units::error::Chain;
use units::sched::{self, Policy, SchedAttr};

fn arg(args: &[String], name: &str) -> Option<u64> {
    let i = args.iter().position(|a| a == name)?;
    match args.get(i + 1).map(|v| v.parse()) {
        Some(Ok(v)) => Some(v),
        _ => {
            eprintln!("planted-spin: {name} needs a whole number");
            std::process::exit(2);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(cpu) = arg(&args, "--cpu") else {
        eprintln!("usage: planted-spin --cpu N [--priority 90] [--busy-us 2000] [--every-us 100000] [--seconds S]");
        std::process::exit(2);
    };
    let priority = arg(&args, "--priority").unwrap_or(90);
    let busy = Duration::from_micros(arg(&args, "--busy-us").unwrap_or(2000));
    let every = Duration::from_micros(arg(&args, "--every-us").unwrap_or(100_000));
    let until = arg(&args, "--seconds").map(|s| Instant::now() + Duration::from_secs(s));
    if busy >= every {
        eprintln!("planted-spin: --busy-us must be below --every-us");
        std::process::exit(2);
    }
    let cpus: CpuSet = std::iter::once(u32::try_from(cpu).unwrap_or(u32::MAX)).collect();
    if let Err(e) = join_cgroup_holding(Path::new("/sys"), &cpus) {
        eprintln!("planted-spin: cannot join the cgroup of CPU {cpu}: {e}");
    }
    if let Err(e) = sched::set_affinity(0, &cpus) {
        eprintln!("planted-spin: cannot pin to CPU {cpu}: {}", Chain(&e));
        std::process::exit(1);
    }
    let fifo = SchedAttr::new(Policy::Fifo, priority as u32);
    if let Err(e) = sched::set_attr(0, &fifo) {
        eprintln!("planted-spin: {}", Chain(&e));
        std::process::exit(1);
    }
    println!(
        "planted-spin: pid {}, FIFO {priority} on CPU {cpu}, {}us busy every {}us",
        std::process::id(),
        busy.as_micros(),
        every.as_micros()
    );
    loop {
        let start = Instant::now();
        if until.is_some_and(|u| start >= u) {
            break;
        }
        while start.elapsed() < busy {
            std::hint::spin_loop();
        }
        std::thread::sleep(every - busy);
    }
}
