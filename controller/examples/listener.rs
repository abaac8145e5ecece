//! Example controller: watches a channel and reports what it receives.
//!
//! ```text
//! listener [--channel /demo/chatter] [--every 1000] [--count N] [--create]
//! ```
//!
//! Environment (set by the supervisor):
//! - `RTDEPLOY_SHM_DIR`: the channel directory, `<prefix>/dev/shm/rtdeploy`
//!   (default `/dev/shm/rtdeploy`);
//! - `RTDEPLOY_PROCESS`: this process's name (default `listener`); the loop
//!   publishes its timing report on `/rtdeploy/timing/<name>`.
//!
//! The channel must exist (the supervisor creates the channels of
//! robot.yaml) unless `--create` is given. Each message wakes the loop
//! through the futex wait it keeps armed on the channel. Prints one line per
//! `--every` messages with the messages lost, the worst send-to-handler
//! latency since the last line and the backend in use; exits after
//! `--count` messages (default: runs until killed).

use std::path::{Path, PathBuf};
use std::time::Duration;

use controller::event_loop::{EventLoop, LoopOptions, TimingOptions};
use controller::{Channel, ChannelGeometry};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let channel = arg(&args, "--channel").unwrap_or_else(|| "/demo/chatter".into());
    let every: u64 = arg(&args, "--every")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
        .max(1);
    let count: u64 = arg(&args, "--count")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let shm = PathBuf::from(
        std::env::var("RTDEPLOY_SHM_DIR").unwrap_or_else(|_| "/dev/shm/rtdeploy".into()),
    );
    let process = std::env::var("RTDEPLOY_PROCESS").unwrap_or_else(|_| "listener".into());
    let proc_root = Path::new("/proc");

    if let Err(e) = controller::rt::lock_and_prefault(256 << 10, 4 << 20) {
        eprintln!("listener: warning: {e}");
    }
    let ch = if args.iter().any(|a| a == "--create") {
        Channel::create(
            &shm,
            &channel,
            &ChannelGeometry::new(64, 1024, 4),
            None,
            proc_root,
        )
        .map(|(c, _)| c)
        .map_err(|e| e.to_string())
    } else {
        Channel::open(&shm, &channel).map_err(|e| e.to_string())
    };
    let ch = ch.unwrap_or_else(|e| {
        eprintln!("listener: {e}");
        std::process::exit(2);
    });
    let mut opts = LoopOptions::from_env();
    opts.timing = Some(TimingOptions {
        shm_dir: shm.clone(),
        process: process.clone(),
        period: Duration::from_secs(1),
    });
    let mut lp = EventLoop::new(opts).unwrap_or_else(|e| {
        eprintln!("listener: {e}");
        std::process::exit(2);
    });
    let backend = lp.backend();
    println!("listener: process {process}, channel {channel}, backend {backend}");
    let (mut got, mut lost, mut worst) = (0u64, 0u64, 0u64);
    let watched = channel.clone();
    let r = lp.watch(&ch, move |ctx, m| {
        got += 1;
        lost += m.lost_before;
        worst = worst.max(ctx.latency_ns());
        if got % every == 0 {
            let seq = m.value::<[u64; 2]>().map_or(0, |v| v[0]);
            println!(
                "listener: received {got} messages on {watched} (last seq {seq}, lost {lost}, worst latency {:.1}us, backend {backend})",
                worst as f64 / 1000.0
            );
            worst = 0;
        }
        if count > 0 && got >= count {
            ctx.exit();
        }
    });
    if let Err(e) = r {
        eprintln!("listener: {e}");
        std::process::exit(2);
    }
    if let Err(e) = lp.run() {
        eprintln!("listener: {e}");
        std::process::exit(1);
    }
}
