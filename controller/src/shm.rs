//! Shared-memory mappings and the one trait every type placed in shared
//! memory implements.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

/// A type that may live in memory shared between processes, or be copied
/// byte for byte through a channel.
///
/// # Safety
///
/// Implement it only for types that are:
/// - `#[repr(C)]` or `#[repr(transparent)]` (a layout other processes,
///   possibly built by another compiler run, agree on);
/// - free of pointers, references, file descriptors and anything whose
///   meaning is local to one process;
/// - without `Drop` (shared memory is never dropped in place);
/// - valid for every bit pattern, including all zeroes (another process,
///   or a crashed one, may have written anything);
/// - free of padding bytes (they are copied as bytes and must be
///   initialised).
pub unsafe trait ShmSafe: Sized + 'static {}

macro_rules! shm_safe {
    ($($t:ty),*) => { $(
        // SAFETY: primitive integers and atomics are plain bits of fixed
        // size with no padding, no pointers and no Drop, valid for every
        // bit pattern.
        unsafe impl ShmSafe for $t {}
    )* };
}
shm_safe!(u8, u16, u32, u64, i8, i16, i32, i64, AtomicU32, AtomicU64);

// SAFETY: an array of ShmSafe elements has no padding between them (each
// element's size is a multiple of its alignment) and inherits the rest.
unsafe impl<T: ShmSafe, const N: usize> ShmSafe for [T; N] {}

/// The bytes of a value.
pub fn as_bytes<T: ShmSafe>(v: &T) -> &[u8] {
    // SAFETY: T has no padding (ShmSafe), so every byte is initialised; the
    // slice borrows `v` for its lifetime.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}

/// A value read from bytes, or `None` when the length differs.
pub fn from_bytes<T: ShmSafe + Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() != std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: the length matches and T is valid for any bit pattern
    // (ShmSafe); read_unaligned copes with any alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) })
}

/// A `MAP_SHARED` read-write mapping of a whole file that other processes
/// may write, and may truncate.
///
/// # Truncation
///
/// Any process of the robot group can `ftruncate` a channel file under
/// `/dev/shm/rtdeploy`; an access past the new end of the file then raises
/// `SIGBUS`, which would kill every process that maps it (the supervisor
/// and the real-time controllers included). Checking the size before each
/// access is racy (the truncation can land between check and access), and
/// the files must stay files that tools open by path (no sealed memfds).
/// So every mapping is registered in a fixed, lock-free table, and a
/// process-wide `SIGBUS` handler that finds the faulting address inside a
/// registered mapping replaces that whole mapping, in place, with private
/// anonymous zero pages (`mmap(MAP_FIXED)`, a plain system call that is
/// safe in a signal handler; display servers treat client shared memory
/// the same way) and marks it broken. The faulting instruction then
/// re-executes against zeroes; the channel code reads the broken flag
/// after each access that matters and reports the channel as truncated,
/// so the process keeps running and only that channel fails. A `SIGBUS`
/// outside every registered mapping goes to the handler that was installed
/// before ours (or to the default action, which kills the process as
/// before).
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    guard: usize,
}

// SAFETY: the mapping is plain memory; all concurrent access to it goes
// through atomics, so sharing the pointer between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

/// Mappings one process may hold at once.
pub const MAX_MAPPINGS: usize = 1024;

/// One registered mapping. `start == 0` means the entry is free.
struct Guard {
    start: AtomicUsize,
    len: AtomicUsize,
    broken: AtomicBool,
}

static GUARDS: [Guard; MAX_MAPPINGS] = [const {
    Guard {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        broken: AtomicBool::new(false),
    }
}; MAX_MAPPINGS];
/// Claims of the table entries (separate from `start`, so that an entry
/// is never visible to the handler half-written).
static CLAIMED: [AtomicBool; MAX_MAPPINGS] = [const { AtomicBool::new(false) }; MAX_MAPPINGS];
/// The `SIGBUS` action found when ours was installed.
static PREVIOUS_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREVIOUS_SIGINFO: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();
static INSTALL_FAILED: AtomicBool = AtomicBool::new(false);

fn install_sigbus_handler() -> io::Result<()> {
    INSTALL.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid value to fill in; the
        // handler is an `extern "C"` function with the SA_SIGINFO
        // signature; `old` receives the previous action.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &sa, &mut old) != 0 {
                INSTALL_FAILED.store(true, Ordering::SeqCst);
                return;
            }
            // SeqCst: written once before any mapping is registered; read
            // by the handler only after a registered mapping faulted.
            PREVIOUS_HANDLER.store(old.sa_sigaction, Ordering::SeqCst);
            PREVIOUS_SIGINFO.store(old.sa_flags & libc::SA_SIGINFO != 0, Ordering::SeqCst);
        }
    });
    if INSTALL_FAILED.load(Ordering::SeqCst) {
        return Err(io::Error::other(
            "cannot install the SIGBUS handler that protects shared-memory mappings",
        ));
    }
    Ok(())
}

/// The process-wide `SIGBUS` handler (see [`Mapping`]). Async-signal-safe:
/// atomics and `mmap`/`sigaction` system calls only.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for g in &GUARDS {
        // Acquire: pairs with the Release store of `start` in `register`,
        // after which `len` is set.
        let start = g.start.load(Ordering::Acquire);
        if start == 0 {
            continue;
        }
        let len = g.len.load(Ordering::Relaxed);
        if addr < start || addr >= start + len {
            continue;
        }
        // SAFETY: [start, start + len) is a mapping this process made and
        // still holds (it is unregistered before munmap); replacing it
        // with anonymous memory of the same size and protection keeps
        // every reference into it valid (the memory reads as zeroes).
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            // Release: the new pages are in place before anyone acts on
            // the flag.
            g.broken.store(true, Ordering::Release);
            return;
        }
        break;
    }
    // Not one of ours (or the remap failed): the previous action.
    let prev = PREVIOUS_HANDLER.load(Ordering::SeqCst);
    if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
        // SAFETY: restores the default action; returning re-executes the
        // faulting access, which then terminates the process as SIGBUS
        // always did.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
        return;
    }
    if PREVIOUS_SIGINFO.load(Ordering::SeqCst) {
        // SAFETY: the previous action was installed with SA_SIGINFO, so
        // its handler has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(prev) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a handler installed without SA_SIGINFO takes the signal
        // number only.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev) };
        f(sig);
    }
}

fn register(ptr: *mut u8, len: usize) -> Option<usize> {
    for (i, c) in CLAIMED.iter().enumerate() {
        // SeqCst: claim of a table entry among threads of this process.
        if c.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let g = &GUARDS[i];
            g.broken.store(false, Ordering::Relaxed);
            g.len.store(len, Ordering::Relaxed);
            // Release: `len` and `broken` are set before the handler can
            // see the entry.
            g.start.store(ptr as usize, Ordering::Release);
            return Some(i);
        }
    }
    None
}

impl Mapping {
    /// Maps `len` bytes of `file` shared, read-write and prefaulted (no
    /// page fault later on the real-time path), protected against
    /// truncation (see [`Mapping`]).
    pub fn map(file: &File, len: usize) -> io::Result<Mapping> {
        Mapping::map_with(file, len, true)
    }

    /// Maps like [`Mapping::map`] without prefaulting: for readers that
    /// look at a few pages of a file they did not size (the supervisor
    /// reading other processes' channels), so a large sparse file costs
    /// them nothing.
    pub fn map_lazy(file: &File, len: usize) -> io::Result<Mapping> {
        Mapping::map_with(file, len, false)
    }

    fn map_with(file: &File, len: usize, populate: bool) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot map an empty file",
            ));
        }
        install_sigbus_handler()?;
        let flags = libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: a fresh mapping at an address the kernel chooses; the fd
        // is valid for the call; the result is checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = p as *mut u8;
        let Some(guard) = register(ptr, len) else {
            // SAFETY: unmaps the mapping just made; nothing refers to it.
            unsafe { libc::munmap(p, len) };
            return Err(io::Error::other(format!(
                "more than {MAX_MAPPINGS} shared-memory mappings in one process"
            )));
        };
        Ok(Mapping { ptr, len, guard })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn base(&self) -> *mut u8 {
        self.ptr
    }

    /// Whether the file was truncated under this mapping (its pages are
    /// now private zeroes, see [`Mapping`]).
    #[inline]
    pub fn is_broken(&self) -> bool {
        // Acquire: pairs with the handler's Release store.
        GUARDS[self.guard].broken.load(Ordering::Acquire)
    }

    /// Reads one byte of every page, so that a truncated file is noticed
    /// (and the mapping replaced) now rather than by the next access: for
    /// callers that hand the memory to the kernel, which reports `EFAULT`
    /// instead of raising `SIGBUS`.
    pub fn probe(&self) -> bool {
        let mut off = 0;
        while off < self.len {
            // SAFETY: in bounds of the mapping; a volatile read of a byte
            // that other processes may write races only as a byte load
            // (its value is discarded); a SIGBUS here is handled above.
            unsafe { std::ptr::read_volatile(self.ptr.add(off)) };
            off += 4096;
        }
        !self.is_broken()
    }

    /// A shared reference to a `T` at byte `offset`.
    ///
    /// Panics when the range is out of the mapping or misaligned (a layout
    /// bug, checked when the channel is opened, never on the hot path).
    pub fn at<T: ShmSafe>(&self, offset: usize) -> &T {
        assert!(offset + std::mem::size_of::<T>() <= self.len);
        assert!(offset % std::mem::align_of::<T>() == 0);
        // SAFETY: in bounds and aligned (checked above; the base is page
        // aligned); T is valid for every bit pattern (ShmSafe); all
        // mutation of shared memory goes through atomics in T, so a shared
        // reference is sound for as long as the mapping lives (`&self`).
        unsafe { &*(self.ptr.add(offset) as *const T) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let g = &GUARDS[self.guard];
        // Release: the handler stops matching this range before it is
        // unmapped (and possibly reused by another mapping).
        g.start.store(0, Ordering::Release);
        // SAFETY: unmaps exactly the range mapped in `map` (or the
        // anonymous pages that replaced it); no reference into it outlives
        // `self` (they all borrow it).
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        // SeqCst: the entry is free for another registration.
        CLAIMED[self.guard].store(false, Ordering::SeqCst);
    }
}
