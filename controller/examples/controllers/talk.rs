//! The talker's controller, on any loop: the `talker` binary's, and the
//! simulation tests'.

use std::time::Duration;

use controller::event_loop::{EventLoop, LoopChannelError};

use crate::common::Chatter;

/// What the talker does.
pub struct Talk {
    pub channel: String,
    pub period: Duration,
    /// Print a line every this many messages (0: never).
    pub every: u64,
    /// Exit after this many messages (0: never).
    pub count: u64,
}

/// The talker's controller on `lp`: a phased loop of `t.period` that
/// publishes a [`Chatter`] per cycle, written in place by a loan.
pub fn talk(lp: &mut EventLoop, t: Talk) -> Result<(), LoopChannelError> {
    let backend = lp.backend();
    let mut sender = lp.make_sender::<Chatter>(&t.channel)?;
    let (channel, every, count) = (t.channel, t.every, t.count);
    let mut seq = 0u64;
    let mut errors = 0u64;
    lp.add_phased_loop("talk", t.period, Duration::ZERO, move |ctx| {
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
        if every > 0 && seq > 0 && seq % every == 0 {
            println!(
                "talker: sent {seq} messages on {channel} (backend {backend}, errors {errors})"
            );
        }
        if count > 0 && seq >= count {
            ctx.exit();
        }
    });
    Ok(())
}
