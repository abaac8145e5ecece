//! Example controller: watches a channel and reports what it receives.
//!
//! ```text
//! listener [--channel /demo/chatter] [--every 1000] [--count N] [--create]
//!          [--summary CHANNEL [--summary-every 100] [--planted-bug N]]
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
//! `--count` messages (default: runs until killed), or when its
//! simulation ends (`deploy sim`), saying what it received in all. With `--summary`, it
//! publishes what it derived from its input (a count, the sum of the
//! sequence numbers, the last one, the XOR of the deadlines) on that
//! channel every `--summary-every` messages: an output that depends on its
//! input alone, to compare a replay with the original run. `--planted-bug
//! N` makes that output wrong from the Nth message on (its sum one too
//! many), for the tests of `deploy log diff`.

mod common;
#[path = "controllers/listen.rs"]
mod listen;

use common::{arg, die, Example};
use listen::{listen, Listen};

fn main() {
    let ex = Example::setup("listener");
    let args: Vec<String> = std::env::args().collect();
    let summary = arg(&args, "--summary").map(|name| {
        let every = arg(&args, "--summary-every")
            .and_then(|v| v.parse().ok())
            .unwrap_or(100u64);
        (name, every)
    });
    let mut lp = ex.event_loop;
    println!(
        "listener: process {}, channel {}, backend {}, class {}",
        ex.process,
        ex.channel_name,
        lp.backend(),
        lp.class()
    );
    let channel = ex.channel_name.clone();
    let l = Listen {
        channel: ex.channel_name,
        every: ex.every,
        count: ex.count,
        summary,
        planted_bug: arg(&args, "--planted-bug").and_then(|v| v.parse().ok()),
    };
    let received = listen(&mut lp, l).unwrap_or_else(|e| die("listener", e, 2));
    if let Err(e) = lp.run() {
        die("listener", e, 1);
    }
    let r = received.get();
    let last = r.last_seq.map_or("none".to_string(), |s| s.to_string());
    println!(
        "listener: the loop ended after {} messages on {channel} (last seq {last}, lost {})",
        r.got, r.lost
    );
}
