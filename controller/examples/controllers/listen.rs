//! The listener's controller, on any loop: the `listener` binary's, and
//! the simulation tests'.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use controller::event_loop::{EventLoop, LoopChannelError};

use crate::common::Chatter;

controller::shm_struct! {
    /// What the listener derives from what it received, every
    /// `--summary-every` messages: a function of its input alone, so that
    /// a replay of the input through it can be compared with the original.
    #[derive(Debug, PartialEq, Eq)]
    pub struct Summary {
        /// Messages received so far.
        pub count: u64,
        /// The sum of their sequence numbers (wrapping).
        pub seq_sum: u64,
        /// The last one's sequence number.
        pub last_seq: u64,
        /// The XOR of their deadlines.
        pub deadline_xor: u64,
    }
}

/// What the listener does.
pub struct Listen {
    pub channel: String,
    /// Print a line every this many messages (0: never).
    pub every: u64,
    /// Exit after this many messages (0: never).
    pub count: u64,
    /// Publish a [`Summary`] on this channel every this many messages.
    pub summary: Option<(String, u64)>,
    /// A bug planted on purpose, for the tests of `deploy log diff`: from
    /// this message on (counting from 1), the summary's `seq_sum` is one
    /// too many.
    pub planted_bug: Option<u64>,
}

/// What the listener has received so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Received {
    pub got: u64,
    pub lost: u64,
    pub last_seq: Option<u64>,
}

/// The listener's controller on `lp`: watches `l.channel` and reports what
/// it receives (and, when asked, publishes its [`Summary`]). What it has
/// received is readable through the cell returned, once the loop is done.
pub fn listen(lp: &mut EventLoop, l: Listen) -> Result<Rc<Cell<Received>>, LoopChannelError> {
    let backend = lp.backend();
    let mut summary_out = match &l.summary {
        Some((name, every)) => Some((lp.make_sender::<Summary>(name)?, (*every).max(1))),
        None => None,
    };
    let (watched, every, count) = (l.channel.clone(), l.every, l.count);
    let planted_bug = l.planted_bug;
    let (mut got, mut worst, mut lost) = (0u64, Duration::ZERO, 0u64);
    let mut sum = Summary {
        count: 0,
        seq_sum: 0,
        last_seq: 0,
        deadline_xor: 0,
    };
    let received = Rc::new(Cell::new(Received::default()));
    let tally = received.clone();
    lp.watch::<Chatter>(&l.channel, move |ctx, m| {
        got += 1;
        lost += ctx.lost_before();
        let seq = m.seq;
        worst = worst.max(ctx.latency());
        sum.count += 1;
        sum.seq_sum = sum.seq_sum.wrapping_add(seq);
        if planted_bug.is_some_and(|from| sum.count >= from) {
            sum.seq_sum = sum.seq_sum.wrapping_add(1);
        }
        sum.last_seq = seq;
        sum.deadline_xor ^= m.deadline_ns;
        tally.set(Received {
            got,
            lost,
            last_seq: Some(seq),
        });
        if let Some((out, n)) = &mut summary_out {
            if sum.count % *n == 0 {
                // A full channel is counted in the sender's errors (the
                // timing report shows them); the next summary carries on.
                let _ = out.send(&sum);
            }
        }
        if every > 0 && got % every == 0 {
            println!(
                "listener: received {got} messages on {watched} (last seq {seq}, lost {lost}, worst latency {:.1}us, backend {backend})",
                worst.as_secs_f64() * 1e6
            );
            worst = Duration::ZERO;
        }
        if count > 0 && got >= count {
            ctx.exit();
        }
    })?;
    Ok(received)
}
