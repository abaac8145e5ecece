//! Watchers: a channel a loop handles every message of, in order, woken
//! by its backend's wait (see [`super::wait`]), and the API that makes
//! them ([`EventLoop::watch`], [`EventLoop::watch_in_place`],
//! [`EventLoop::watch_raw`]).

use crate::channel::{
    BellListing, Channel, ChannelFault, Held, InPlace, Message, MessageMeta, SlotView, Subscriber,
};
use crate::shm::ShmSafe;
use crate::timing_report::EntryStats;

use super::{Ctx, EventLoop, LoopChannelError};

type WatchFn = Box<dyn FnMut(&mut Ctx, &Message)>;
/// Reads the staged message in place and, when it was still there, hands
/// what was read to the handler.
type InPlaceFn = Box<dyn FnMut(&mut Ctx, &mut Subscriber, &MessageMeta) -> InPlace<()>>;

/// How a watcher's messages reach its handler.
pub(super) enum Handler {
    /// Copied into the subscriber's buffer when staged.
    Copy(WatchFn),
    /// Staged without the payload, read in its slot when handled.
    InPlace(InPlaceFn),
}

pub(super) struct Watcher {
    pub(super) name: String,
    pub(super) sub: Subscriber,
    pub(super) handler: Handler,
    /// A wait is armed (in the ring, or counted for futex_waitv).
    pub(super) armed: bool,
    /// A completion arrived or data is known to be there.
    pub(super) ready: bool,
    /// The loop's last sleep ended with a wake for this watcher, or the
    /// loop found its data without sleeping: what it reads now is not
    /// counted as found without a wake (`healed`).
    pub(super) woken: bool,
    pub(super) staged: Option<MessageMeta>,
    /// Messages lost that no handler was told of yet: one read in place
    /// and found overwritten, and those lost before it.
    pub(super) untold_lost: u64,
    /// The channel was truncated: no longer watched.
    pub(super) failed: Option<ChannelFault>,
    /// A typed watcher's message size: other sizes are counted as errors
    /// and not handled.
    pub(super) expect_size: Option<usize>,
    pub(super) stats: EntryStats,
    pub(super) total: u64,
    /// Doorbell backend: this loop's bell listed in the channel.
    pub(super) listing: Option<BellListing>,
    /// Half the channel's cross-class bound: how often the loop looks at
    /// it while the other class publishes there (see [`crate::wake`]).
    pub(super) cross_look_ns: u64,
}

impl Watcher {
    /// Its channel was truncated: counted, and no longer watched.
    pub(super) fn truncated(&mut self) {
        self.stats.faults += 1;
        self.failed = Some(ChannelFault::Truncated);
        self.ready = false;
    }

    /// Marks the watcher failed when its channel was truncated (the kernel
    /// answers EFAULT for a futex word past the end of the file); `false`
    /// when the mapping is intact (the error is something else).
    pub(super) fn fail_if_truncated(&mut self) -> bool {
        if self.sub.channel().probe_mapping() {
            return false;
        }
        self.failed = Some(ChannelFault::Truncated);
        self.stats.faults += 1;
        self.ready = false;
        self.staged = None;
        if self.armed {
            self.armed = false;
            self.sub.end_wait();
        }
        true
    }

    /// Counts a wait as armed on the watcher's futex word (call before
    /// handing it to the kernel), or, when its data is already there,
    /// marks it ready: found before sleeping, no wake was due. `true` when
    /// armed.
    pub(super) fn begin_wait(&mut self) -> bool {
        if !self.sub.begin_wait() {
            self.ready = true;
            self.woken = true;
            return false;
        }
        self.armed = true;
        self.woken = false;
        true
    }
}

impl EventLoop {
    /// Calls `handler` with every `T` published on channel `name` from now
    /// on, in order, woken by a futex wait kept armed on the channel. The
    /// channel records `T` ([`Channel::bind_type`]): a channel carrying
    /// another type is refused here, naming both. The `&T` is the loop's
    /// own copy of the message.
    pub fn watch<T: ShmSafe>(
        &mut self,
        name: &str,
        mut handler: impl FnMut(&mut Ctx, &T) + 'static,
    ) -> Result<(), LoopChannelError> {
        const {
            assert!(
                std::mem::align_of::<T>() <= 8,
                "channel types are at most 8-aligned"
            )
        };
        let ch = self.open_channel(name)?;
        ch.bind_type::<T>()?;
        self.watch_raw(&ch, move |ctx, m| {
            if let Some(v) = m.get::<T>() {
                handler(ctx, v)
            }
        })?;
        if let Some(w) = self.watchers.last_mut() {
            w.expect_size = Some(std::mem::size_of::<T>());
        }
        Ok(())
    }

    /// [`EventLoop::watch`] for a type known at run time by its record
    /// (the C interface): the channel is bound to `t` (a channel that
    /// records another type is refused here, naming both), and `handler`
    /// gets each message as bytes, `t.size` of them, 8-byte aligned (the
    /// loop's own copy). A message of another size is counted in the
    /// watcher's report and not handled, as for `watch`.
    pub fn watch_record(
        &mut self,
        name: &str,
        t: &crate::shm::TypeRecord,
        mut handler: impl FnMut(&mut Ctx, &[u8]) + 'static,
    ) -> Result<(), LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_record(t)?;
        self.watch_raw(&ch, move |ctx, m| handler(ctx, m.data))?;
        if let Some(w) = self.watchers.last_mut() {
            w.expect_size = usize::try_from(t.size).ok();
        }
        Ok(())
    }

    /// Calls `handler` for every message published on `channel` from now
    /// on, in order, as bytes: the API for tools that handle any channel
    /// (loggers, bridges). Controllers use [`EventLoop::watch`].
    pub fn watch_raw(
        &mut self,
        channel: &Channel,
        handler: impl FnMut(&mut Ctx, &Message) + 'static,
    ) -> Result<(), LoopChannelError> {
        self.push_watcher(channel, Handler::Copy(Box::new(handler)))
    }

    /// Like [`EventLoop::watch`], without the copy: for each message `read`
    /// gets a view of it in its slot of the shared memory and reads what it
    /// needs (a header, a few fields of a large message); when the slot
    /// still held the message after `read` ran, `handler` gets what `read`
    /// returned. A message a publisher recycled meanwhile is not handled
    /// and counts as lost (in [`Ctx::lost_before`] of the next one and the
    /// watcher's report). So `read` computes and returns; acting on the
    /// message is `handler`'s. Worth it where a handler needs a small part
    /// of a large message: reading all of it costs what the copy does.
    pub fn watch_in_place<T: ShmSafe, R: 'static>(
        &mut self,
        name: &str,
        mut read: impl FnMut(&SlotView) -> R + 'static,
        mut handler: impl FnMut(&mut Ctx, R) + 'static,
    ) -> Result<(), LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_type::<T>()?;
        let handle = move |ctx: &mut Ctx, sub: &mut Subscriber, meta: &MessageMeta| match sub
            .read_in_place_at(meta, &mut read)
        {
            InPlace::Read(r) => {
                handler(ctx, r);
                InPlace::Read(())
            }
            InPlace::Overwritten => InPlace::Overwritten,
            InPlace::Truncated => InPlace::Truncated,
        };
        self.push_watcher(&ch, Handler::InPlace(Box::new(handle)))?;
        if let Some(w) = self.watchers.last_mut() {
            w.expect_size = Some(std::mem::size_of::<T>());
        }
        Ok(())
    }

    /// Like [`EventLoop::watch`] with no copy at all: `handler` gets the
    /// `T` in its slot, held there while it runs (see
    /// [`crate::channel::Held`]): no publisher writes the slot meanwhile,
    /// so the handler reads all of a large message at memory speed and
    /// never a torn one. Takes one of the channel's hold records
    /// (robot.yaml `channels[].holds`); refused when none is free.
    pub fn watch_held<T: ShmSafe>(
        &mut self,
        name: &str,
        mut handler: impl FnMut(&mut Ctx, &T) + 'static,
    ) -> Result<(), LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_type::<T>()?;
        self.push_held_watcher(&ch, move |ctx, held| {
            if let Some(v) = held.get::<T>() {
                handler(ctx, v)
            }
        })?;
        if let Some(w) = self.watchers.last_mut() {
            w.expect_size = Some(std::mem::size_of::<T>());
        }
        Ok(())
    }

    /// [`EventLoop::watch_held`] for frames of header `H` (see
    /// [`crate::channel::frame_offset`]): `handler` gets the header and
    /// the payload, both in the slot. A message shorter than a header (a
    /// byte publisher's) is not handled.
    pub fn watch_frames<H: ShmSafe>(
        &mut self,
        name: &str,
        mut handler: impl FnMut(&mut Ctx, &H, &[u8]) + 'static,
    ) -> Result<(), LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_frames::<H>()?;
        self.push_held_watcher(&ch, move |ctx, held| {
            if let Some((h, payload)) = held.frame::<H>() {
                handler(ctx, h, payload)
            }
        })
    }

    fn push_held_watcher(
        &mut self,
        channel: &Channel,
        mut handler: impl FnMut(&mut Ctx, &Held) + 'static,
    ) -> Result<(), LoopChannelError> {
        let handle = move |ctx: &mut Ctx, sub: &mut Subscriber, meta: &MessageMeta| match sub
            .hold_staged(meta)
        {
            InPlace::Read(held) => {
                handler(ctx, &held);
                InPlace::Read(())
            }
            InPlace::Overwritten => InPlace::Overwritten,
            InPlace::Truncated => InPlace::Truncated,
        };
        self.push_watcher(channel, Handler::InPlace(Box::new(handle)))?;
        let got = match self.watchers.last_mut() {
            Some(w) => w.sub.claim_holds(1, &self.proc_root)?,
            None => 0,
        };
        if got == 0 {
            self.watchers.pop();
            return Err(LoopChannelError::NoHold {
                channel: channel.name().to_string(),
                records: channel.hold_records(),
            });
        }
        Ok(())
    }

    fn push_watcher(
        &mut self,
        channel: &Channel,
        handler: Handler,
    ) -> Result<(), LoopChannelError> {
        self.check_attach()?;
        let sub = channel.subscriber_as(self.class, &self.proc_root)?;
        let half =
            (channel.geometry().cross_class.as_nanos() / 2).clamp(1, u64::MAX as u128) as u64;
        self.watchers.push(Watcher {
            name: channel.name().to_string(),
            sub,
            handler,
            armed: false,
            ready: false,
            woken: false,
            staged: None,
            untold_lost: 0,
            failed: None,
            expect_size: None,
            stats: EntryStats::default(),
            total: 0,
            listing: None,
            cross_look_ns: half,
        });
        Ok(())
    }
}
