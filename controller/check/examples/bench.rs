//! The runtime's microbenchmarks from the command line (the same library
//! functions `deploy bench` calls).
//!
//! ```text
//! cargo run --release -p check --example bench -- wake [samples] [--json]
//! cargo run --release -p check --example bench -- publish [count] [--json]
//! cargo run --release -p check --example bench -- throughput [seconds] [publishers] [fifo priority] [--json]
//! ```
//!
//! The channel files go to `$RTDEPLOY_SHM_DIR` (default `/dev/shm/rtdeploy`).

use std::path::PathBuf;
use std::time::Duration;

use check::bench;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let nums: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let shm = PathBuf::from(
        std::env::var(units::env::SHM_DIR).unwrap_or_else(|_| units::path::SHM_DIR.into()),
    );
    std::fs::create_dir_all(&shm).expect("creating the shm directory");
    let proc_root = PathBuf::from("/proc");
    let out = match args.first().map(String::as_str) {
        Some("wake") => {
            let mut o = bench::WakeOptions::new(&shm);
            if let Some(&n) = nums.first() {
                o.samples = n as u32;
            }
            let r = bench::wake(&o).expect("wake benchmark");
            if json {
                serde_json::to_string_pretty(&r).unwrap()
            } else {
                r.table()
            }
        }
        Some("publish") => {
            let r = bench::publish(
                &shm,
                &proc_root,
                64,
                nums.first().copied().unwrap_or(5_000_000),
                5_000,
            )
            .expect("publish benchmark");
            if json {
                serde_json::to_string_pretty(&r).unwrap()
            } else {
                r.table()
            }
        }
        Some("throughput") => {
            let secs = nums.first().copied().unwrap_or(2);
            let pubs = nums.get(1).copied().unwrap_or(1) as u32;
            let prio = nums.get(2).map(|&p| p as u32);
            let r = bench::throughput(&shm, &proc_root, 64, pubs, Duration::from_secs(secs), prio)
                .expect("throughput benchmark");
            if json {
                serde_json::to_string_pretty(&r).unwrap()
            } else {
                r.table()
            }
        }
        _ => {
            eprintln!("usage: bench wake|publish|throughput [n] [--json]");
            std::process::exit(2);
        }
    };
    println!("{out}");
}
