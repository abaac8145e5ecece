//! The file the engine and its workers share: the control words (stop,
//! generation, per-worker state and counters) and the fixed-size
//! histograms workers record into without allocating.

use super::*;

/// Most lower-priority process slots.
pub const MAX_LOW: usize = 32;
/// Receiver address cells: the real-time receiver and two per low slot.
pub(crate) const CELLS: usize = 1 + 2 * MAX_LOW;
/// The cell of the real-time receiver.
pub(crate) const RT_CELL: usize = 0;
/// Histograms per mechanism: send, delivery, low-priority delivery.
pub(crate) const PER_MECH: usize = 3;
pub(crate) const H_SEND: usize = 0;
pub(crate) const H_DELIVERY: usize = 1;
pub(crate) const H_LOW_DELIVERY: usize = 2;
pub(crate) const CONTROL_BYTES: usize = 4096;
/// `RTDCHECK` read as a little-endian u64.
pub(crate) const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"RTDCHECK");
/// Message tags: which side sent it.
pub(crate) const TAG_RT: u64 = 0x5254;
pub(crate) const TAG_LOW: u64 = 0x4c4f;
/// A message the engine publishes after raising a stop word, so that a
/// receiver asleep in its loop looks at the words.
pub(crate) const TAG_STOP: u64 = 0x5354;

/// The control words at the start of the shared file. Every field is an
/// independent word; see each access for its ordering.
#[repr(C)]
pub(crate) struct Control {
    pub magic: AtomicU64,
    /// Non-zero: every worker stops.
    pub stop_all: AtomicU64,
    /// Non-zero: the real-time pair stops.
    pub rt_stop: AtomicU64,
    /// The receiver is subscribed and about to wait.
    pub receiver_ready: AtomicU64,
    /// Workers that asked for SCHED_FIFO and were refused.
    pub fifo_refused: AtomicU64,
    /// Workers that could not lock their memory.
    pub mlock_failed: AtomicU64,
    /// Low-priority processes started (all generations).
    pub low_started: AtomicU64,
    /// eventfd / signal notifications (and connections) that failed.
    pub notify_failed: AtomicU64,
    /// The errno of the last such failure.
    pub notify_errno: AtomicU64,
    /// Non-zero: the timer workers stop.
    pub timer_stop: AtomicU64,
    /// Bit `slot`: that timer worker pinned itself to its CPU.
    pub timer_pinned: AtomicU64,
    /// Bit `slot`: that timer worker got SCHED_FIFO.
    pub timer_fifo: AtomicU64,
    /// Non-zero: the real-time receiver stops at the next stop message.
    /// Raised only after the sender has exited, so the receiver that
    /// handles the stop message has passed every real-time message.
    pub rt_recv_stop: AtomicU64,
    /// The real-time receiver reached the end of the run (it handled the
    /// stop message after `rt_recv_stop`).
    pub rt_recv_done: AtomicU64,
    /// The generation the hammer runs for (it stops when it changes).
    pub hammer_gen: AtomicU64,
    /// The positive control's priority-inheritance futex word (low 32
    /// bits: the holder's tid, `FUTEX_WAITERS` when one waits).
    pub pi_word: AtomicU64,
    /// The positive control's waiter: locks it found held, each through
    /// the kernel (the phase lasts until enough were, however slowly the
    /// workers start: a waiter that runs before its holder does finds the
    /// lock free, and the kernel boosts nobody).
    pub pi_cycles: AtomicU64,
    /// Per low-priority slot: the generation that may run; a process whose
    /// generation differs stops.
    pub low_gen: [AtomicU64; MAX_LOW],
    /// Where the eventfd / signalfd receivers wait: cell 0 the real-time
    /// receiver, cells `1 + 2 * slot + (0|1)` the low-priority processes
    /// (two per slot: a slot's new process starts before its old one
    /// stops). Every publisher notifies every filled cell.
    pub cells: [AddressCell; CELLS],
    /// Tracing (`crate::trace`): 1 while the instance records and a miss
    /// may stop it; the engine raises it, the receiver that stops the
    /// instance lowers it (one miss, one snapshot).
    pub trace_armed: AtomicU64,
    /// 1: the receiver stopped the instance on a miss described by the
    /// three words below; the engine takes the snapshot, lowers this and
    /// raises `trace_armed` again.
    pub trace_miss: AtomicU64,
    pub trace_miss_seq: AtomicU64,
    pub trace_miss_send_ns: AtomicU64,
    pub trace_miss_handler_ns: AtomicU64,
    /// Real-time messages over the miss threshold (traced or not).
    pub trace_over: AtomicU64,
    /// Who stopped the instance: 0 the real-time receiver, `slot + 1` the
    /// timer worker of that slot (then `trace_miss_seq` numbers its wake,
    /// `send_ns` is the deadline and `handler_ns` the wake).
    pub trace_miss_timer: AtomicU64,
    /// The pid of that timer worker.
    pub trace_miss_pid: AtomicU64,
    /// Timer wakes over the timer miss threshold (traced or not).
    pub trace_timer_over: AtomicU64,
    /// The real-time receiver's messages that its loop's wake check found
    /// (no wake came for them), stored when its loop ends.
    pub rt_healed: AtomicU64,
    /// When the real-time receiver's loop stopped (`CLOCK_MONOTONIC` ns),
    /// stored before the loop and what it holds (its bell, its ring, its
    /// subscription) are released: the census's phase ends there, so that
    /// a best-effort process taking a released word afterwards is not
    /// counted as sharing it with the pair. 0: not yet.
    pub rt_recv_ended_ns: AtomicU64,
}
// SAFETY: repr(C), only AtomicU64 fields and arrays: no padding, no
// pointers, no Drop, valid for every bit pattern.
unsafe impl ShmAtomic for Control {}
const _: () = assert!(std::mem::size_of::<Control>() <= CONTROL_BYTES);

/// Timer-latency histograms: one per isolated CPU, at most this many.
pub(crate) const MAX_TIMERS: usize = 64;

/// Real-time messages whose delivery is accounted one by one (by their
/// sequence number): 2^21, 35 minutes at 1 kHz.
pub(crate) const ACCOUNTED_SEQS: u64 = 1 << 21;
pub(super) const MARK_WORDS: usize = (ACCOUNTED_SEQS / 64) as usize;
/// The two bitmaps of the accounting.
pub(crate) const MARK_SENT: usize = 0;
pub(crate) const MARK_SEEN: usize = 1;

pub(super) fn histograms_bytes() -> usize {
    (Mechanism::ALL.len() * PER_MECH + MAX_TIMERS) * std::mem::size_of::<Histogram>()
}

/// Bytes of the shared file: control words, histograms, then the sent and
/// seen bitmaps of the real-time messages.
pub(crate) fn shared_bytes() -> usize {
    CONTROL_BYTES + histograms_bytes() + 2 * MARK_WORDS * 8
}

/// The shared file, mapped.
pub(crate) struct Shared {
    pub(super) map: Mapping,
}

impl Shared {
    pub fn create(path: &Path) -> std::io::Result<Shared> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        f.set_len(shared_bytes() as u64)?;
        // SAFETY: the file is the engine's own; it and its workers touch
        // it only through `at` (atomics: Control, Histogram, the marks).
        let map = unsafe { Mapping::map(&f, shared_bytes())? };
        let s = Shared { map };
        // Release: a worker that reads the magic (Acquire) sees a fully
        // sized, zeroed file.
        s.control().magic.store(CONTROL_MAGIC, Ordering::Release);
        Ok(s)
    }

    pub fn open(path: &Path) -> std::io::Result<Shared> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let len = f.metadata()?.len() as usize;
        if len != shared_bytes() {
            return Err(std::io::Error::other(format!(
                "{len} bytes, expected {} (a worker of another version?)",
                shared_bytes()
            )));
        }
        // SAFETY: as in `create`.
        let map = unsafe { Mapping::map(&f, len)? };
        let s = Shared { map };
        // Acquire: pairs with the Release store in `create`.
        if s.control().magic.load(Ordering::Acquire) != CONTROL_MAGIC {
            return Err(std::io::Error::other("not a check control file"));
        }
        Ok(s)
    }

    pub fn control(&self) -> &Control {
        self.map.at(0)
    }

    pub fn hist(&self, mech: Mechanism, which: usize) -> &Histogram {
        let i = mech.index() * PER_MECH + which;
        self.map
            .at(CONTROL_BYTES + i * std::mem::size_of::<Histogram>())
    }

    pub(super) fn mark_word(&self, which: usize, word: usize) -> &AtomicU64 {
        self.map
            .at(CONTROL_BYTES + histograms_bytes() + (which * MARK_WORDS + word) * 8)
    }

    /// Marks real-time message `seq` in bitmap `which` (sent by the
    /// sender, seen by the receiver); beyond [`ACCOUNTED_SEQS`] nothing.
    pub fn mark(&self, which: usize, seq: u64) {
        if seq < ACCOUNTED_SEQS {
            // Relaxed: read by the engine after it reaped the workers.
            self.mark_word(which, (seq / 64) as usize)
                .fetch_or(1 << (seq % 64), Ordering::Relaxed);
        }
    }

    /// The sequence numbers marked in `sent` but not in `seen`, in order,
    /// and how many were marked sent.
    pub fn unseen(&self) -> (Vec<u64>, u64) {
        let mut out = vec![];
        let mut sent_n = 0;
        for w in 0..MARK_WORDS {
            let sent = self.mark_word(MARK_SENT, w).load(Ordering::Relaxed);
            if sent == 0 {
                continue;
            }
            sent_n += sent.count_ones() as u64;
            let mut missing = sent & !self.mark_word(MARK_SEEN, w).load(Ordering::Relaxed);
            while missing != 0 {
                let b = missing.trailing_zeros() as u64;
                out.push(w as u64 * 64 + b);
                missing &= missing - 1;
            }
        }
        (out, sent_n)
    }

    /// Clears both bitmaps (between mechanisms, with no worker running).
    pub fn clear_marks(&self) {
        for which in [MARK_SENT, MARK_SEEN] {
            for w in 0..MARK_WORDS {
                self.mark_word(which, w).store(0, Ordering::Relaxed);
            }
        }
    }

    /// The timer-latency histogram of timer worker `slot` (< MAX_TIMERS).
    pub fn timer_hist(&self, slot: usize) -> &Histogram {
        assert!(slot < MAX_TIMERS, "timer slot {slot} out of range");
        let i = Mechanism::ALL.len() * PER_MECH + slot;
        self.map
            .at(CONTROL_BYTES + i * std::mem::size_of::<Histogram>())
    }
}
