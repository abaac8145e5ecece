//! What the example controllers share: their command line, the channel
//! directory and process name the supervisor passes in the environment
//! (`RTDEPLOY_SHM_DIR`, `RTDEPLOY_PROCESS`), memory locking, the channel
//! (opened, or created with `--create`) and an event loop that publishes its
//! timing report once a second. The controllers themselves are in
//! `controllers/`, set up on any loop, so that the binaries and the
//! simulation tests run the same code.

use std::path::{Path, PathBuf};
use std::time::Duration;

use controller::event_loop::{EventLoop, LoopOptions, TimingOptions};
use controller::{Channel, ChannelGeometry};

controller::shm_struct! {
    /// What the talker publishes and the listener receives.
    #[derive(Debug)]
    pub struct Chatter {
        /// Counts from 0.
        pub seq: u64,
        /// The phased-loop deadline this message belongs to.
        pub deadline_ns: u64,
    }
}

/// A controller ready to run.
pub struct Example {
    pub channel_name: String,
    pub process: String,
    /// Print a line every this many messages.
    pub every: u64,
    /// Stop after this many messages (0: run until killed).
    pub count: u64,
    pub event_loop: EventLoop,
}

/// The value after `name` on the command line.
pub fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Prints `role: error: its causes` and exits with `code`.
pub fn die(role: &str, e: impl std::error::Error + 'static, code: i32) -> ! {
    eprintln!("{role}: {}", units::error::Chain(&e));
    std::process::exit(code);
}

impl Example {
    /// Sets up the example named `role` (also the default process name).
    pub fn setup(role: &str) -> Example {
        let args: Vec<String> = std::env::args().collect();
        let channel_name = arg(&args, "--channel").unwrap_or_else(|| "/demo/chatter".into());
        let every: u64 = arg(&args, "--every")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000)
            .max(1);
        let count: u64 = arg(&args, "--count")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let shm = PathBuf::from(
            std::env::var(units::env::SHM_DIR).unwrap_or_else(|_| units::path::SHM_DIR.into()),
        );
        let process = std::env::var(units::env::PROCESS).unwrap_or_else(|_| role.into());

        // 4 MiB of heap, or a quarter of a smaller locked-memory limit
        // (8 MiB is the kernel's default): the channels, the loop's ring
        // and the program itself are locked too, and a mapping past the
        // limit is refused.
        let mut heap: usize = 4 << 20;
        if let Some(limit) = controller::rt::memlock_limit() {
            let quarter = usize::try_from(limit / 4).unwrap_or(usize::MAX);
            if quarter < heap {
                heap = quarter;
                eprintln!(
                    "{role}: prefaulting {} KiB of heap, a quarter of the locked-memory limit",
                    heap >> 10
                );
            }
        }
        if let Err(e) = controller::rt::lock_and_prefault(256 << 10, heap) {
            eprintln!("{role}: warning: {e}");
        }
        // The loop opens the channel by name; here it only has to exist.
        if args.iter().any(|a| a == "--create") {
            Channel::create(
                &shm,
                &channel_name,
                &ChannelGeometry::new(64, 1024, 4),
                None,
                Path::new("/proc"),
            )
            .unwrap_or_else(|e| die(role, e, 2));
        }
        let mut opts = LoopOptions::from_env();
        opts.shm_dir = shm.clone();
        opts.timing = Some(TimingOptions {
            shm_dir: shm,
            process: process.clone(),
            period: Duration::from_secs(1),
        });
        let event_loop = EventLoop::new(opts).unwrap_or_else(|e| die(role, e, 2));
        Example {
            channel_name,
            process,
            every,
            count,
            event_loop,
        }
    }
}
