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

mod common;

use common::{die, Chatter, Example};

fn main() {
    let ex = Example::setup("listener");
    let (channel, process, every, count, mut lp) = (
        ex.channel_name,
        ex.process,
        ex.every,
        ex.count,
        ex.event_loop,
    );
    let backend = lp.backend();
    let class = lp.class();
    println!("listener: process {process}, channel {channel}, backend {backend}, class {class}");
    let (mut got, mut worst) = (0u64, std::time::Duration::ZERO);
    let watched = channel.clone();
    let mut lost = 0u64;
    let r = lp.watch::<Chatter>(&channel, move |ctx, m| {
        got += 1;
        lost += ctx.lost_before();
        let seq = m.seq;
        worst = worst.max(ctx.latency());
        if got % every == 0 {
            println!(
                "listener: received {got} messages on {watched} (last seq {seq}, lost {lost}, worst latency {:.1}us, backend {backend})",
                worst.as_secs_f64() * 1e6
            );
            worst = std::time::Duration::ZERO;
        }
        if count > 0 && got >= count {
            ctx.exit();
        }
    });
    if let Err(e) = r {
        die("listener", e, 2);
    }
    if let Err(e) = lp.run() {
        die("listener", e, 1);
    }
}
