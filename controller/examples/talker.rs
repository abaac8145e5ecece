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

use common::{arg, die, Chatter, Example};

fn main() {
    let ex = Example::setup("talker");
    let args: Vec<String> = std::env::args().collect();
    let period_us: u64 = arg(&args, "--period-us")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let (channel, process, every, count, mut lp) = (
        ex.channel_name,
        ex.process,
        ex.every,
        ex.count,
        ex.event_loop,
    );
    let backend = lp.backend();
    let class = lp.class();
    println!(
        "talker: process {process}, channel {channel}, backend {backend}, class {class}, period {period_us}us"
    );
    let mut sender = lp
        .make_sender::<Chatter>(&channel)
        .unwrap_or_else(|e| die("talker", e, 2));
    let mut seq = 0u64;
    let mut errors = 0u64;
    lp.add_phased_loop(
        "talk",
        Duration::from_micros(period_us),
        Duration::ZERO,
        move |ctx| {
            // Written in place in the channel's slot: no copy on send.
            let sent = sender.loan().and_then(|mut m| {
                m.seq = seq;
                m.deadline_ns = ctx.event_time().as_nanos();
                m.send()
            });
            match sent {
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
        die("talker", e, 1);
    }
}
