//! Cross-process wake pairs other than the channel's futex word: an
//! eventfd, and a real-time signal read through a signalfd. They exist so
//! that `deploy check --compare` and `deploy bench wake` can measure the
//! classic mechanisms beside the runtime's own; the runtime itself wakes
//! through the futex word (see [`controller::event_loop`]).
//!
//! A pair is a [`Waiter`] (the receiving thread: owns the eventfd, or
//! blocks the signal and owns the signalfd) and any number of
//! [`Notifier`]s (the senders, in any process), which find the waiter
//! through its plain-data [`Address`]:
//!
//! - eventfd: the address is the receiver's pid and fd number; another
//!   process gets its own descriptor of the same eventfd with
//!   [`pidfd_getfd(2)`](https://man7.org/linux/man-pages/man2/pidfd_getfd.2.html)
//!   (Linux 5.6+; needs ptrace permission over the receiver: same uid
//!   without Yama restrictions, a parent over its child, or root), and
//!   writes 1 to it per notification;
//! - RT signal: the address is the receiver's thread group and thread id
//!   and the signal number; a notifier queues the signal at that thread
//!   like `sigqueue(3)` does, with
//!   [`rt_tgsigqueueinfo(2)`](https://man7.org/linux/man-pages/man2/rt_tgsigqueueinfo.2.html)
//!   (`si_code` `SI_QUEUE`), so no other thread of the receiver can take
//!   it; needs permission to signal the receiver (same uid or root).
//!
//! - io_uring `IORING_OP_MSG_RING`: the receiver waits in `io_uring_enter`
//!   on a ring of its own for a completion; the address is its pid and the
//!   ring's fd number, which a notifier fetches with `pidfd_getfd` as for
//!   the eventfd. A notifier submits one `MSG_RING` on a small ring of its
//!   own per notification, which posts a completion into the receiver's
//!   ring (Linux 5.18+); its own completion is skipped on success
//!   (`IOSQE_CQE_SKIP_SUCCESS`), so nothing builds up on the sender's side.
//!
//! Waiters publish their address through an [`AddressCell`] in shared
//! memory; notifiers keep a [`Peers`] cache of connected notifiers, one per
//! cell, refreshed when a cell's generation changes.
//!
//! Notifying and waiting are allocation-free (one syscall each); connecting
//! is not on a timed path.
#![allow(unsafe_code)]

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};

use controller::shm::ShmAtomic;

/// Which mechanism a pair uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyKind {
    Eventfd,
    Signal,
    MsgRing,
}

impl NotifyKind {
    fn code(self) -> u64 {
        match self {
            NotifyKind::Eventfd => 1,
            NotifyKind::Signal => 2,
            NotifyKind::MsgRing => 3,
        }
    }
    fn from_code(c: u64) -> Option<NotifyKind> {
        match c {
            1 => Some(NotifyKind::Eventfd),
            2 => Some(NotifyKind::Signal),
            3 => Some(NotifyKind::MsgRing),
            _ => None,
        }
    }
}

/// The `user_data` of the completions a `MSG_RING` notification posts in
/// the receiver's ring.
const MSG_RING_TAG: u64 = u64::from_le_bytes(*b"RTDWAKE1");
/// Completion queue size of a receiver's ring: notifications that arrive
/// while it runs wait there (the kernel keeps any overflow, IORING_FEAT_NODROP).
const MSG_RING_CQ: u32 = 1024;

/// Where a waiter is, as plain values another process can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    pub kind: NotifyKind,
    /// The receiver's process (thread group) id.
    pub pid: u32,
    /// The receiving thread's id (signals are queued at it).
    pub tid: u32,
    /// The eventfd's or the ring's descriptor number in `pid`, or the
    /// signal number.
    pub value: i32,
}

fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn gettid() -> u32 {
    // SAFETY: no arguments; cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

fn signal_set(signo: i32) -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is valid storage; sigemptyset initialises
    // it and sigaddset only writes into it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signo);
        set
    }
}

/// The receiving side of a pair. Bound to the thread that created it (a
/// signal waiter changed that thread's signal mask), hence not `Send`.
pub struct Waiter {
    kind: NotifyKind,
    /// The eventfd, the signalfd, or (MSG_RING) a duplicate of the ring's
    /// descriptor for [`Waiter::as_raw_fd`].
    fd: OwnedFd,
    /// The receiving ring of a MSG_RING waiter.
    ring: Option<io_uring::IoUring>,
    signo: i32,
    /// The signal mask before a signal waiter blocked its signal.
    old_mask: Option<libc::sigset_t>,
    tid: u32,
    _not_send: PhantomData<*const ()>,
}

/// Signals read from a signalfd in one `read`.
const SIGINFO_BATCH: usize = 32;
const SIGINFO_BYTES: usize = 128;

impl Waiter {
    /// A new eventfd (counter 0, blocking reads, close-on-exec).
    /// See [`eventfd(2)`](https://man7.org/linux/man-pages/man2/eventfd.2.html).
    pub fn eventfd() -> io::Result<Waiter> {
        // SAFETY: creates a new descriptor; checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(last_err("eventfd"));
        }
        Ok(Waiter {
            kind: NotifyKind::Eventfd,
            // SAFETY: `fd` is a fresh descriptor nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            ring: None,
            signo: 0,
            old_mask: None,
            tid: gettid(),
            _not_send: PhantomData,
        })
    }

    /// Blocks `signo` in the calling thread and reads it through a new
    /// signalfd. Dropping the waiter discards the signals still queued
    /// and restores the thread's mask. Threads the caller starts later
    /// inherit the blocked mask; threads already running do not need it
    /// (notifiers direct the signal at this thread).
    ///
    /// A signal still in flight when the waiter is dropped would then meet
    /// the default action and end the process, so the process's
    /// disposition for `signo` is set to ignore when it is the default:
    /// a blocked signal is queued (and read by the signalfd) even when
    /// ignored, and an unblocked one is discarded.
    /// See [`signalfd(2)`](https://man7.org/linux/man-pages/man2/signalfd.2.html).
    pub fn signal(signo: i32) -> io::Result<Waiter> {
        let set = signal_set(signo);
        // SAFETY: zeroed storage for the current action, written by the call.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reads the action of a valid signal number into `cur`.
        if unsafe { libc::sigaction(signo, std::ptr::null(), &mut cur) } != 0 {
            return Err(last_err("sigaction"));
        }
        if cur.sa_sigaction == libc::SIG_DFL {
            // SAFETY: zeroed is a valid empty action (no flags, empty mask).
            let mut ign: libc::sigaction = unsafe { std::mem::zeroed() };
            ign.sa_sigaction = libc::SIG_IGN;
            // SAFETY: installs SIG_IGN, which runs no code, for `signo`.
            if unsafe { libc::sigaction(signo, &ign, std::ptr::null_mut()) } != 0 {
                return Err(last_err("sigaction"));
            }
        }
        // SAFETY: zeroed storage for the old mask, written by the call.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid sets; changes only this thread's mask.
        let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        // SAFETY: creates a new descriptor for a valid set; checked.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
        if fd < 0 {
            let e = last_err("signalfd");
            // SAFETY: restores the mask saved above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
            return Err(e);
        }
        Ok(Waiter {
            kind: NotifyKind::Signal,
            // SAFETY: `fd` is a fresh descriptor nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            ring: None,
            signo,
            old_mask: Some(old),
            tid: gettid(),
            _not_send: PhantomData,
        })
    }

    /// A new io_uring whose completions are the notifications: each
    /// notifier's `MSG_RING` posts one. See
    /// [`io_uring_prep_msg_ring(3)`](https://man7.org/linux/man-pages/man3/io_uring_prep_msg_ring.3.html).
    pub fn msg_ring() -> io::Result<Waiter> {
        let ring = io_uring::IoUring::builder()
            .setup_cqsize(MSG_RING_CQ)
            .build(8)
            .map_err(|e| io::Error::new(e.kind(), format!("io_uring_setup: {e}")))?;
        let ring_fd = ring.as_raw_fd();
        // SAFETY: duplicates a descriptor we own; checked.
        let fd = unsafe { libc::fcntl(ring_fd, libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(last_err("dup of the ring"));
        }
        Ok(Waiter {
            kind: NotifyKind::MsgRing,
            // SAFETY: `fd` is a fresh descriptor nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            ring: Some(ring),
            signo: 0,
            old_mask: None,
            tid: gettid(),
            _not_send: PhantomData,
        })
    }

    pub fn kind(&self) -> NotifyKind {
        self.kind
    }

    /// Where notifiers find this waiter.
    pub fn address(&self) -> Address {
        Address {
            kind: self.kind,
            pid: std::process::id(),
            tid: self.tid,
            value: match self.kind {
                NotifyKind::Eventfd => self.fd.as_raw_fd(),
                NotifyKind::Signal => self.signo,
                NotifyKind::MsgRing => self.ring.as_ref().map_or(-1, |r| r.as_raw_fd()),
            },
        }
    }

    /// Blocks until at least one notification arrived and consumes what
    /// is there: returns how many notifications that was (the eventfd's
    /// counter, or the number of signals read, at most 32 per call).
    /// An interrupted wait returns `Ok(0)`.
    pub fn wait(&self) -> io::Result<u64> {
        match self.kind {
            NotifyKind::Eventfd => {
                let mut v = 0u64;
                // SAFETY: reads 8 bytes into a valid, writable u64.
                let r = unsafe {
                    libc::read(
                        self.fd.as_raw_fd(),
                        &mut v as *mut u64 as *mut libc::c_void,
                        8,
                    )
                };
                match r {
                    8 => Ok(v),
                    _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => Ok(0),
                    _ => Err(last_err("eventfd read")),
                }
            }
            NotifyKind::Signal => {
                let mut buf = [0u8; SIGINFO_BATCH * SIGINFO_BYTES];
                // SAFETY: reads at most buf.len() bytes into `buf`.
                let r = unsafe {
                    libc::read(
                        self.fd.as_raw_fd(),
                        buf.as_mut_ptr() as *mut libc::c_void,
                        buf.len(),
                    )
                };
                if r < 0 {
                    if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        return Ok(0);
                    }
                    return Err(last_err("signalfd read"));
                }
                // RT signals queue one per notification.
                Ok(r as u64 / SIGINFO_BYTES as u64)
            }
            NotifyKind::MsgRing => {
                let ring = self.ring.as_ref().expect("a MSG_RING waiter has its ring");
                // io_uring_enter(0 to submit, 1 to wait for): returns at
                // once when completions are already there.
                match ring.submitter().submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(0),
                    Err(e) => return Err(io::Error::new(e.kind(), format!("io_uring_enter: {e}"))),
                }
                // SAFETY: only this thread reads this ring's completion
                // queue (a waiter is not Send and wait takes no lock
                // another reader could hold).
                let mut cq = unsafe { ring.completion_shared() };
                cq.sync();
                let n = (&mut cq).filter(|c| c.user_data() == MSG_RING_TAG).count();
                Ok(n as u64)
            }
        }
    }

    /// The descriptor a poll loop would watch.
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(old) = &self.old_mask {
            let set = signal_set(self.signo);
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: zero-timeout waits on a valid set discard what is
            // still queued (it would be acted on once unblocked).
            while unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) } >= 0 {}
            // SAFETY: restores the mask this waiter saved.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
        }
    }
}

/// Our own descriptor of descriptor `fd` of process `pid`
/// (`pidfd_open` + `pidfd_getfd`), or -1 with errno set.
fn getfd_from(pid: u32, fd: RawFd) -> io::Result<RawFd> {
    // SAFETY: pidfd_open takes a pid and flags; checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as i32, 0) };
    if pidfd < 0 {
        return Err(last_err(&format!("pidfd_open({pid})")));
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    // SAFETY: pidfd_getfd takes a pidfd, a descriptor number in that
    // process and flags; checked by the caller. The new descriptor is
    // close-on-exec.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    Ok(r as RawFd)
}

/// Whether this kernel lets a notifier fetch a waiter's eventfd
/// (`pidfd_open` and `pidfd_getfd`, tried on this process).
pub fn probe_pidfd_getfd() -> io::Result<()> {
    let w = Waiter::eventfd()?;
    let fd = getfd_from(std::process::id(), w.as_raw_fd())?;
    if fd < 0 {
        return Err(last_err("pidfd_getfd (needs Linux 5.6+)"));
    }
    // SAFETY: a fresh descriptor nothing else owns; closed on drop.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// Whether this kernel lets a notifier wake a waiter through io_uring
/// MSG_RING: a ring is made, its descriptor fetched with `pidfd_getfd` from
/// this process, and one notification sent and received.
pub fn probe_msg_ring() -> io::Result<()> {
    probe_pidfd_getfd()?;
    let w = Waiter::msg_ring()?;
    let fd = getfd_from(std::process::id(), w.address().value)?;
    if fd < 0 {
        return Err(last_err("pidfd_getfd of the ring"));
    }
    // SAFETY: a fresh descriptor nothing else owns; closed on drop.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let n = Notifier {
        kind: NotifyKind::MsgRing,
        fd: Some(fd),
        ring: Some(
            io_uring::IoUring::new(8)
                .map_err(|e| io::Error::new(e.kind(), format!("io_uring_setup: {e}")))?,
        ),
        tgid: 0,
        tid: 0,
        signo: 0,
        _not_sync: PhantomData,
    };
    n.notify()?;
    match w.wait()? {
        1 => Ok(()),
        k => Err(io::Error::other(format!(
            "one MSG_RING posted {k} completions"
        ))),
    }
}

/// The sending side of a pair. May move to another thread, but is used by
/// one at a time (a MSG_RING notifier's submission queue is not shared).
pub struct Notifier {
    kind: NotifyKind,
    /// Our own descriptor of the waiter's eventfd or ring.
    fd: Option<OwnedFd>,
    /// The ring a MSG_RING notifier submits on.
    ring: Option<io_uring::IoUring>,
    tgid: i32,
    tid: i32,
    signo: i32,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("kind", &self.kind)
            .field("fd", &self.fd)
            .field("tgid", &self.tgid)
            .field("tid", &self.tid)
            .field("signo", &self.signo)
            .finish()
    }
}

impl Notifier {
    /// Connects to the waiter at `addr`. For an eventfd in another process
    /// this is `pidfd_open` + `pidfd_getfd`; in this process a `dup`.
    pub fn connect(addr: &Address) -> io::Result<Notifier> {
        let mut n = Notifier {
            kind: addr.kind,
            fd: None,
            ring: None,
            tgid: addr.pid as i32,
            tid: addr.tid as i32,
            signo: addr.value,
            _not_sync: PhantomData,
        };
        if addr.kind == NotifyKind::MsgRing {
            n.ring = Some(
                io_uring::IoUring::new(8)
                    .map_err(|e| io::Error::new(e.kind(), format!("io_uring_setup: {e}")))?,
            );
        }
        if matches!(addr.kind, NotifyKind::Eventfd | NotifyKind::MsgRing) {
            let fd = if addr.pid == std::process::id() {
                // SAFETY: duplicates a descriptor number; checked.
                unsafe { libc::fcntl(addr.value, libc::F_DUPFD_CLOEXEC, 0) }
            } else {
                getfd_from(addr.pid, addr.value)?
            };
            if fd < 0 {
                return Err(last_err(&format!(
                    "getting fd {} of process {} (pidfd_getfd needs Linux 5.6+ and ptrace permission over it)",
                    addr.value, addr.pid
                )));
            }
            // SAFETY: a fresh descriptor nothing else owns.
            n.fd = Some(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        Ok(n)
    }

    /// One notification: writes 1 to the eventfd, queues the signal at
    /// the waiting thread, or submits a MSG_RING to the waiter's ring.
    /// Allocation-free, one syscall.
    #[inline]
    pub fn notify(&self) -> io::Result<()> {
        match (&self.fd, self.kind) {
            (Some(fd), NotifyKind::MsgRing) => {
                let ring = self
                    .ring
                    .as_ref()
                    .expect("a MSG_RING notifier has its ring");
                let sqe = io_uring::opcode::MsgRingData::new(
                    io_uring::types::Fd(fd.as_raw_fd()),
                    0,
                    MSG_RING_TAG,
                    None,
                )
                .build()
                .flags(io_uring::squeue::Flags::SKIP_SUCCESS);
                // SAFETY: a notifier is used by one thread at a time (not
                // Sync), so nothing else touches this submission or
                // completion queue; the entry refers to no memory.
                unsafe {
                    let mut sq = ring.submission_shared();
                    if sq.push(&sqe).is_err() {
                        return Err(io::Error::from_raw_os_error(libc::EBUSY));
                    }
                    sq.sync();
                }
                ring.submit()?;
                // A failed MSG_RING still posts its completion here.
                // SAFETY: as above, this thread alone reads this queue.
                let mut cq = unsafe { ring.completion_shared() };
                cq.sync();
                match (&mut cq).map(|c| c.result()).find(|&r| r < 0) {
                    Some(r) => Err(io::Error::from_raw_os_error(-r)),
                    None => Ok(()),
                }
            }
            (Some(fd), _) => {
                let one = 1u64;
                // SAFETY: writes 8 bytes from a valid u64.
                let r = unsafe {
                    libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8)
                };
                if r == 8 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            }
            (None, _) => {
                // SAFETY: zeroed siginfo_t is valid; only the public
                // header fields are set. SI_QUEUE (negative) is what the
                // kernel requires for queueing at another process.
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                info.si_signo = self.signo;
                info.si_code = libc::SI_QUEUE;
                // SAFETY: `info` is valid for the call; the kernel checks
                // that `tid` is in `tgid` and our permission to signal it.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_rt_tgsigqueueinfo,
                        self.tgid,
                        self.tid,
                        self.signo,
                        &info as *const libc::siginfo_t,
                    )
                };
                if r == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            }
        }
    }
}

/// A waiter's address in shared memory, seqlock style: the generation is
/// 0 while empty or being written, a unique non-zero value while valid.
#[repr(C)]
pub struct AddressCell {
    gen: AtomicU64,
    /// pid | tid << 32
    ids: AtomicU64,
    /// kind | value << 32
    what: AtomicU64,
    _pad: AtomicU64,
}
// SAFETY: repr(C), only AtomicU64 fields: no padding, no pointers, no
// Drop, valid for every bit pattern (an unknown kind reads as empty).
unsafe impl ShmAtomic for AddressCell {}

impl AddressCell {
    /// Publishes `addr` (one writer per cell at a time); returns the
    /// generation to pass to [`AddressCell::clear`].
    pub fn publish(&self, addr: &Address) -> u64 {
        let gen = (controller::Monotonic::now().as_nanos() << 1) | 1;
        self.gen.store(0, Ordering::SeqCst);
        // Relaxed: ordered before the readers' view by the SeqCst store of
        // the generation below (a reader checks the generation around its
        // loads).
        self.ids
            .store(addr.pid as u64 | (addr.tid as u64) << 32, Ordering::Relaxed);
        self.what.store(
            addr.kind.code() | (addr.value as u32 as u64) << 32,
            Ordering::Relaxed,
        );
        self.gen.store(gen, Ordering::SeqCst);
        gen
    }

    /// Empties the cell if it still holds generation `gen`.
    pub fn clear(&self, gen: u64) {
        let _ = self
            .gen
            .compare_exchange(gen, 0, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Empties the cell if it holds an address of process `pid` (for the
    /// parent of a waiter that died without clearing it).
    pub fn clear_pid(&self, pid: u32) {
        if let Some((gen, a)) = self.load() {
            if a.pid == pid {
                self.clear(gen);
            }
        }
    }

    /// The generation now (0: empty); cheap, for change detection.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.gen.load(Ordering::SeqCst)
    }

    /// The address and its generation, or `None` when empty or being
    /// rewritten.
    pub fn load(&self) -> Option<(u64, Address)> {
        let g = self.gen.load(Ordering::SeqCst);
        if g == 0 {
            return None;
        }
        // Relaxed: validated by the second generation load after the
        // Acquire fence (seqlock read side).
        let ids = self.ids.load(Ordering::Relaxed);
        let what = self.what.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if self.gen.load(Ordering::SeqCst) != g {
            return None;
        }
        Some((
            g,
            Address {
                kind: NotifyKind::from_code(what & 0xffff_ffff)?,
                pid: ids as u32,
                tid: (ids >> 32) as u32,
                value: (what >> 32) as u32 as i32,
            },
        ))
    }
}

/// A notifier per cell of a registry, reconnected when a cell changes.
#[derive(Debug, Default)]
pub struct Peers {
    peers: Vec<(u64, Option<Notifier>)>,
    failed: u64,
    last_error: Option<i32>,
}

impl Peers {
    /// A cache for `cells` cells (allocates here only).
    pub fn new(cells: usize) -> Peers {
        Peers {
            peers: (0..cells).map(|_| (0, None)).collect(),
            failed: 0,
            last_error: None,
        }
    }

    /// Connects to cells that changed since the last call; drops
    /// notifiers of emptied cells. A cell that cannot be connected counts
    /// as a failure and is retried when it changes again.
    pub fn refresh(&mut self, cells: &[AddressCell]) {
        for ((gen, n), cell) in self.peers.iter_mut().zip(cells) {
            if cell.generation() == *gen {
                continue;
            }
            *n = None;
            *gen = 0;
            if let Some((g, addr)) = cell.load() {
                *gen = g;
                match Notifier::connect(&addr) {
                    Ok(c) => *n = Some(c),
                    Err(e) => {
                        self.failed += 1;
                        self.last_error = e.raw_os_error();
                    }
                }
            }
        }
    }

    /// Notifies every connected waiter; returns how many notifications
    /// failed (also counted in [`Peers::failed`]).
    #[inline]
    pub fn notify_all(&mut self) -> u64 {
        let mut bad = 0;
        for n in self.peers.iter().filter_map(|(_, n)| n.as_ref()) {
            if let Err(e) = n.notify() {
                bad += 1;
                self.last_error = e.raw_os_error();
            }
        }
        self.failed += bad;
        bad
    }

    /// Connections and notifications that failed so far.
    pub fn failed(&self) -> u64 {
        self.failed
    }

    /// The errno of the last failure.
    pub fn last_error(&self) -> Option<i32> {
        self.last_error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventfd_counts_notifications_in_one_process() {
        let w = Waiter::eventfd().unwrap();
        let n = Notifier::connect(&w.address()).unwrap();
        n.notify().unwrap();
        n.notify().unwrap();
        n.notify().unwrap();
        assert_eq!(w.wait().unwrap(), 3);
    }

    #[test]
    fn signal_queues_one_per_notification_at_the_waiting_thread() {
        let w = Waiter::signal(libc::SIGRTMIN() + 3).unwrap();
        let n = Notifier::connect(&w.address()).unwrap();
        for _ in 0..5 {
            n.notify().unwrap();
        }
        let mut got = 0;
        while got < 5 {
            got += w.wait().unwrap();
        }
        assert_eq!(got, 5);
    }

    #[test]
    fn msg_ring_posts_one_completion_per_notification() {
        let w = match Waiter::msg_ring() {
            Ok(w) => w,
            Err(e) => {
                eprintln!("skipped: no io_uring here ({e})");
                return;
            }
        };
        let n = Notifier::connect(&w.address()).unwrap();
        if let Err(e) = n.notify() {
            // EINVAL: a kernel before 5.18 has no MSG_RING.
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
            eprintln!("skipped: no IORING_OP_MSG_RING here ({e})");
            return;
        }
        for _ in 0..4 {
            n.notify().unwrap();
        }
        let mut got = 0;
        while got < 5 {
            got += w.wait().unwrap();
        }
        assert_eq!(got, 5);
    }

    #[test]
    fn cell_round_trips_and_clears_only_its_generation() {
        let cell = AddressCell {
            gen: AtomicU64::new(0),
            ids: AtomicU64::new(0),
            what: AtomicU64::new(0),
            _pad: AtomicU64::new(0),
        };
        assert!(cell.load().is_none());
        let a = Address {
            kind: NotifyKind::Signal,
            pid: 4242,
            tid: 4343,
            value: 36,
        };
        let g = cell.publish(&a);
        assert_eq!(cell.load(), Some((g, a)));
        cell.clear(g + 2);
        assert!(cell.load().is_some());
        cell.clear_pid(1);
        assert!(cell.load().is_some());
        cell.clear_pid(4242);
        assert!(cell.load().is_none());
    }
}
