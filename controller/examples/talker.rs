//! Example controller: publishes a counter on a channel from a phased loop.
//!
//! ```text
//! talker [--channel /demo/chatter] [--period-us 1000] [--every 1000] [--count N] [--create]
//! ```
//!
//! Environment (set by the supervisor):
//! - `RTDEPLOY_SHM_DIR`: the channel directory, `<prefix>/dev/shm/rtdeploy`
//!   (default `/dev/shm/rtdeploy`);
//! - `RTDEPLOY_PROCESS`: this process's name (default `talker`); the loop
//!   publishes its timing report on `/rtdeploy/timing/<name>`.
//!
//! The channel must exist (the supervisor creates the channels of
//! robot.yaml) unless `--create` is given. Prints one line per `--every`
//! messages, with the event-loop backend in use; exits after `--count`
//! messages (default: runs until killed).

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
    let period_us: u64 = arg(&args, "--period-us")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
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
    let process = std::env::var("RTDEPLOY_PROCESS").unwrap_or_else(|_| "talker".into());
    let proc_root = Path::new("/proc");

    if let Err(e) = controller::rt::lock_and_prefault(256 << 10, 4 << 20) {
        eprintln!("talker: warning: {e}");
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
        eprintln!("talker: {e}");
        std::process::exit(2);
    });
    let mut opts = LoopOptions::from_env();
    opts.timing = Some(TimingOptions {
        shm_dir: shm.clone(),
        process: process.clone(),
        period: Duration::from_secs(1),
    });
    let mut lp = EventLoop::new(opts).unwrap_or_else(|e| {
        eprintln!("talker: {e}");
        std::process::exit(2);
    });
    let backend = lp.backend();
    println!(
        "talker: process {process}, channel {channel}, backend {backend}, period {period_us}us"
    );
    let mut sender = lp.make_sender(&ch).unwrap_or_else(|e| {
        eprintln!("talker: {e}");
        std::process::exit(2);
    });
    let mut seq = 0u64;
    let mut errors = 0u64;
    lp.add_phased_loop(
        "talk",
        Duration::from_micros(period_us),
        Duration::ZERO,
        move |ctx| {
            // Payload: sequence number and the deadline this send belongs to.
            match sender.send_value(&[seq, ctx.event_time_ns()]) {
                Ok(_) => seq += 1,
                Err(_) => errors += 1,
            }
            if seq > 0 && seq % every == 0 {
                println!(
                    "talker: sent {seq} messages on {channel} (backend {backend}, errors {errors})"
                );
            }
            if count > 0 && seq >= count {
                ctx.exit();
            }
        },
    );
    if let Err(e) = lp.run() {
        eprintln!("talker: {e}");
        std::process::exit(1);
    }
}
