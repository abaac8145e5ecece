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

use std::time::Duration;

mod common;
#[path = "controllers/talk.rs"]
mod talk;

use common::{arg, die, Example};
use talk::{talk, Talk};

fn main() {
    let ex = Example::setup("talker");
    let args: Vec<String> = std::env::args().collect();
    let period_us: u64 = arg(&args, "--period-us")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut lp = ex.event_loop;
    println!(
        "talker: process {}, channel {}, backend {}, class {}, period {period_us}us",
        ex.process,
        ex.channel_name,
        lp.backend(),
        lp.class()
    );
    let t = Talk {
        channel: ex.channel_name,
        period: Duration::from_micros(period_us),
        every: ex.every,
        count: ex.count,
    };
    if let Err(e) = talk(&mut lp, t) {
        die("talker", e, 2);
    }
    if let Err(e) = lp.run() {
        die("talker", e, 1);
    }
}
