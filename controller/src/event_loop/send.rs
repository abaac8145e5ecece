//! What a loop publishes and fetches with: typed senders (a thin typed
//! wrapper over the channel's [`Publisher`]: a `T` per message, and loans
//! of a `T`), byte publishers, and fetchers (readers that never wake the
//! loop). The loop's report of its senders reads each publisher's own
//! counts through a tap ([`crate::channel::PublisherTap`]): a send does
//! nothing for the report.

use std::cell::Cell;
use std::marker::PhantomData;

use crate::channel::{
    Channel, ChannelFault, FrameLoan, Loan, PublishError, Published, Publisher, PublisherCounts,
    PublisherTap, Subscriber, Tapped,
};
use crate::shm::ShmSafe;

use super::{EventLoop, LoopChannelError};

/// A sender of `T` messages made by a loop ([`EventLoop::make_sender`]);
/// its counts (the publisher's) appear in the loop's reports.
pub struct TypedSender<T: ShmSafe> {
    publisher: Publisher,
    _type: PhantomData<fn(&T)>,
}

impl<T: ShmSafe> TypedSender<T> {
    /// Publishes a copy of `v`.
    pub fn send(&mut self, v: &T) -> Result<Published, PublishError> {
        self.publisher.publish_value(v)
    }

    /// Lends the channel's next slot to write a `T` in place, with no copy
    /// on send (see [`Publisher::loan`]).
    pub fn loan(&mut self) -> Result<Loan<'_, T>, PublishError> {
        self.publisher.loan::<T>()
    }

    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }
}

/// A sender of frames of header `H` made by a loop
/// ([`EventLoop::make_frame_sender`]): each frame is loaned, written in
/// place and sent.
pub struct FrameSender<H: ShmSafe> {
    publisher: Publisher,
    _header: PhantomData<fn(&H)>,
}

impl<H: ShmSafe> FrameSender<H> {
    /// Lends the channel's next slot for a frame of `len` payload bytes
    /// (see [`Publisher::loan_frame`]).
    pub fn loan(&mut self, len: usize) -> Result<FrameLoan<'_, H>, PublishError> {
        self.publisher.loan_frame::<H>(len)
    }

    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }
}

/// A fetched message was not a message of the fetcher's type, or the
/// channel faulted. Small and `Copy`, as [`ChannelFault`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Channel(#[from] ChannelFault),
    /// Another size than the type's (a byte-API publisher's message):
    /// counted in [`TypedFetcher::wrong_size`], and the fetcher moves on.
    #[error("message {index} is {got} bytes, not a {expected}-byte message of the fetcher's type")]
    WrongSize {
        index: u64,
        expected: usize,
        got: usize,
    },
}

/// A reader of `T` messages that never wakes the loop
/// ([`EventLoop::make_fetcher`]).
pub struct TypedFetcher<T: ShmSafe> {
    reader: Subscriber,
    wrong_size: u64,
    _type: PhantomData<fn() -> T>,
}

impl<T: ShmSafe> TypedFetcher<T> {
    /// The newest message not fetched yet; `Ok(None)` when there is none.
    /// A message that is not a `T` is [`FetchError::WrongSize`].
    pub fn fetch_latest(&mut self) -> Result<Option<&T>, FetchError> {
        let m = self.reader.latest()?;
        typed(m, &mut self.wrong_size)
    }

    /// The next message in order (see [`Subscriber::next_message`]); a
    /// message that is not a `T` is [`FetchError::WrongSize`], and the
    /// next call goes on after it.
    pub fn fetch_next(&mut self) -> Result<Option<&T>, FetchError> {
        let m = self.reader.next_message()?;
        typed(m, &mut self.wrong_size)
    }

    pub fn lost(&self) -> u64 {
        self.reader.lost()
    }

    /// Messages fetched that were not a `T` ([`FetchError::WrongSize`]).
    pub fn wrong_size(&self) -> u64 {
        self.wrong_size
    }
}

/// The message as a `T`, or the error that it is not one (counted).
fn typed<'a, T: ShmSafe>(
    m: Option<crate::channel::Message<'a>>,
    wrong_size: &mut u64,
) -> Result<Option<&'a T>, FetchError> {
    let Some(m) = m else {
        return Ok(None);
    };
    match m.get::<T>() {
        Some(v) => Ok(Some(v)),
        None => {
            *wrong_size += 1;
            Err(FetchError::WrongSize {
                index: m.index,
                expected: std::mem::size_of::<T>(),
                got: m.data.len(),
            })
        }
    }
}

/// A sender of the loop, for its reports: its publisher's counts, read
/// through a tap, and what the report of the window started from.
pub(super) struct SenderStats {
    pub(super) name: String,
    tap: PublisherTap,
    /// The message size of a typed sender (what to warm of its next slot).
    bytes: Option<usize>,
    /// The last counts read; final once the publisher is gone.
    last: Cell<PublisherCounts>,
    done: Cell<bool>,
    /// The counts when the current report window began.
    window_start: Cell<PublisherCounts>,
    /// Messages published when the next slot was last warmed.
    warmed_at: Cell<u64>,
}

impl SenderStats {
    /// The publisher's counts (the last known ones once it is dropped).
    pub(super) fn counts(&self) -> PublisherCounts {
        if !self.done.get() {
            match self.tap.read() {
                Tapped::Live(c) => self.last.set(c),
                Tapped::Final(c) => {
                    self.last.set(c);
                    self.done.set(true);
                }
                Tapped::Gone => self.done.set(true),
            }
        }
        self.last.get()
    }

    /// This window's counts (messages, errors), and the total messages.
    pub(super) fn window(&self) -> (u64, u64, u64) {
        let (now, start) = (self.counts(), self.window_start.get());
        (
            now.published.saturating_sub(start.published),
            now.errors.saturating_sub(start.errors),
            now.published,
        )
    }

    pub(super) fn new_window(&self) {
        self.window_start.set(self.counts());
    }

    /// Warms the publisher's next slot once per message published (see
    /// [`Publisher::warm_next`]) until `stop` says so.
    pub(super) fn warm(&self, stop: &dyn Fn() -> bool) {
        let published = self.counts().published;
        if self.done.get() || published == self.warmed_at.get() {
            return;
        }
        self.warmed_at.set(published);
        self.tap.warm(self.bytes, stop);
    }
}

impl EventLoop {
    /// A sender of `T` on channel `name` (typed like [`EventLoop::watch`]);
    /// its counts appear in this loop's reports.
    pub fn make_sender<T: ShmSafe>(
        &mut self,
        name: &str,
    ) -> Result<TypedSender<T>, LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_type::<T>()?;
        let mut publisher = self.attach_publisher(&ch, Some(std::mem::size_of::<T>()))?;
        publisher.reserve_loans::<T>();
        Ok(TypedSender {
            publisher,
            _type: PhantomData,
        })
    }

    /// A sender of frames of header `H` on channel `name` (bound like
    /// [`EventLoop::watch_frames`]); its counts appear in this loop's
    /// reports.
    pub fn make_frame_sender<H: ShmSafe>(
        &mut self,
        name: &str,
    ) -> Result<FrameSender<H>, LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_frames::<H>()?;
        let publisher = self.attach_publisher(&ch, None)?;
        Ok(FrameSender {
            publisher,
            _header: PhantomData,
        })
    }

    /// [`EventLoop::make_sender`] for a type known at run time by its
    /// record (the C interface): a byte publisher on channel `name`, bound
    /// to `t`, its staging buffer sized for loans of `t.size` bytes.
    pub fn make_record_sender(
        &mut self,
        name: &str,
        t: &crate::shm::TypeRecord,
    ) -> Result<Publisher, LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_record(t)?;
        let size = usize::try_from(t.size).unwrap_or(usize::MAX);
        let mut publisher = self.attach_publisher(&ch, Some(size))?;
        publisher.reserve_byte_loans(size);
        Ok(publisher)
    }

    /// [`EventLoop::make_fetcher`] for a type known at run time by its
    /// record: a reader of channel `name`, bound to `t`, that never wakes
    /// the loop.
    pub fn make_record_fetcher(
        &mut self,
        name: &str,
        t: &crate::shm::TypeRecord,
    ) -> Result<Subscriber, LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_record(t)?;
        Ok(ch.reader())
    }

    /// A byte publisher whose counts appear in this loop's reports (see
    /// [`EventLoop::watch_raw`]).
    pub fn make_raw_sender(&mut self, channel: &Channel) -> Result<Publisher, LoopChannelError> {
        self.attach_publisher(channel, None)
    }

    fn attach_publisher(
        &mut self,
        channel: &Channel,
        bytes: Option<usize>,
    ) -> Result<Publisher, LoopChannelError> {
        self.check_attach()?;
        let mut publisher = channel.publisher_as(self.class, &self.proc_root)?;
        publisher.set_clock(self.clock.clone());
        self.senders.push(SenderStats {
            name: channel.name().to_string(),
            tap: publisher.tap(),
            bytes,
            last: Cell::default(),
            done: Cell::new(false),
            window_start: Cell::default(),
            warmed_at: Cell::new(0),
        });
        Ok(publisher)
    }

    /// A reader of `T` on channel `name` that never wakes the loop.
    pub fn make_fetcher<T: ShmSafe>(
        &mut self,
        name: &str,
    ) -> Result<TypedFetcher<T>, LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_type::<T>()?;
        Ok(TypedFetcher {
            reader: ch.reader(),
            wrong_size: 0,
            _type: PhantomData,
        })
    }

    /// A byte reader that never wakes the loop (see [`Channel::reader`]).
    pub fn make_raw_fetcher(&mut self, channel: &Channel) -> Subscriber {
        channel.reader()
    }
}
