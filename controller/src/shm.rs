//! Shared memory: the two traits that say what may be placed in it, and
//! the mappings of channel files.
//!
//! Memory other processes write is touched in exactly two ways:
//!
//! - **in place**, only through types made of atomics ([`ShmAtomic`]):
//!   headers, ring entries, counters. Every access is an atomic operation,
//!   so a concurrent write by another thread or process is never a data
//!   race, whatever it writes;
//! - **by copy**, for plain data ([`ShmSafe`]): a message is copied into a
//!   slot and out of it (word by word with atomic operations, checked by a
//!   seqlock), never read in place while others may write it.
//!
//! [`ShmSafe`] types declare their layout with [`shm_struct!`], which checks
//! at compile time that the struct has no padding and that every field is
//! itself [`ShmSafe`], and records the type's name and a layout hash that
//! a channel stores, so that a process opening a channel with another type
//! is refused:
//!
//! ```
//! controller::shm_struct! {
//!     /// One IMU sample.
//!     pub struct Imu {
//!         pub time_ns: u64,
//!         pub accel: [f32; 3],
//!         pub gyro: [f32; 3],
//!     }
//! }
//! # use controller::ShmSafe;
//! assert_eq!(Imu::TYPE_NAME.as_str(), "Imu");
//! ```
//!
//! A struct with padding does not compile:
//!
//! ```compile_fail
//! controller::shm_struct! {
//!     pub struct Padded {
//!         pub flag: u8,
//!         pub time_ns: u64,
//!     }
//! }
//! ```
//!
//! while its twin without the padding does:
//!
//! ```
//! controller::shm_struct! {
//!     pub struct Padded {
//!         pub flag: u64,
//!         pub time_ns: u64,
//!     }
//! }
//! ```
//!
//! Nor does a struct holding a pointer (here a `String`):
//!
//! ```compile_fail
//! controller::shm_struct! {
//!     pub struct Named {
//!         pub name: String,
//!     }
//! }
//! ```
//!
//! ```
//! controller::shm_struct! {
//!     pub struct Named {
//!         pub name: [u8; 24],
//!     }
//! }
//! ```
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

/// A type's name as a channel records it: at most [`TypeName::MAX`]
/// bytes, built at compile time (also for arrays: `[f32; 3]`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TypeName {
    bytes: [u8; TypeName::MAX],
    len: usize,
}

impl TypeName {
    /// Longest name kept (longer ones are cut).
    pub const MAX: usize = 64;

    pub const fn new(s: &str) -> TypeName {
        let mut t = TypeName {
            bytes: [0; TypeName::MAX],
            len: 0,
        };
        t = t.push(s.as_bytes());
        t
    }

    const fn push(mut self, s: &[u8]) -> TypeName {
        let mut i = 0;
        while i < s.len() && self.len < TypeName::MAX {
            self.bytes[self.len] = s[i];
            self.len += 1;
            i += 1;
        }
        self
    }

    /// `[elem; n]`.
    pub const fn array(elem: TypeName, n: usize) -> TypeName {
        let mut t = TypeName::new("[");
        let mut i = 0;
        while i < elem.len {
            t = t.push(&[elem.bytes[i]]);
            i += 1;
        }
        t = t.push(b"; ");
        let mut digits = [0u8; 20];
        let mut d = 0;
        let mut v = n;
        loop {
            digits[d] = b'0' + (v % 10) as u8;
            d += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        while d > 0 {
            d -= 1;
            t = t.push(&[digits[d]]);
        }
        t.push(b"]")
    }

    /// `frame<header>` (see [`crate::channel::frame_offset`]).
    pub const fn frame(header: TypeName) -> TypeName {
        let mut t = TypeName::new("frame<");
        let mut i = 0;
        while i < header.len {
            t = t.push(&[header.bytes[i]]);
            i += 1;
        }
        t.push(b">")
    }

    /// The bytes of a name read from a channel header (NUL padded).
    pub fn from_bytes(b: &[u8]) -> TypeName {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        TypeName::new("").push(&b[..end.min(TypeName::MAX)])
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The name, or its valid UTF-8 prefix.
    pub fn as_str(&self) -> &str {
        match std::str::from_utf8(self.as_bytes()) {
            Ok(s) => s,
            Err(e) => std::str::from_utf8(&self.bytes[..e.valid_up_to()]).unwrap_or_default(),
        }
    }
}

impl std::fmt::Debug for TypeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl std::fmt::Display for TypeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a channel records of its type, as a value: for code that knows
/// its message type at run time (the C interface, tools that replay
/// recorded messages) rather than as a Rust type. [`TypeRecord::of`]
/// gives a Rust type's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeRecord {
    pub name: TypeName,
    pub size: u64,
    pub align: u64,
    pub layout_hash: u64,
}

impl TypeRecord {
    /// `T`'s record.
    pub const fn of<T: ShmSafe>() -> TypeRecord {
        TypeRecord {
            name: T::TYPE_NAME,
            size: std::mem::size_of::<T>() as u64,
            align: std::mem::align_of::<T>() as u64,
            layout_hash: T::LAYOUT_HASH,
        }
    }
}

// The layout hash, defined over a message's description so that any
// language computes the same one (`messages::Description::layout_hash`
// computes it from a `.msg` file; C, C++ and Python programs carry the
// value `deploy gen` writes):
//
//   hash(primitive)   = fnv(START, its description name: int8 .. int64,
//                           uint8 .. uint64, float32, float64)
//   hash(T[N])        = mix(mix(fnv(START, "[]"), hash(T)), N)
//   hash(struct S)    = fnv(START, S's name), then for each field in
//                       order: fnv(h, the field's name), mix(h, hash(its type))
//
// with fnv = FNV-1a 64 over the bytes, START its offset basis, and
// mix(h, v) = fnv over v's eight little-endian bytes. Channel layout 7
// brought the description's primitive names (6 hashed Rust's `u64`,
// `f32`): a process of layout 6 opens `<name>.v6` and never meets a
// channel of this one (see `channel::LAYOUT_VERSION`).

/// FNV-1a over `bytes`, from `h` (the layout hash's building block).
pub const fn layout_hash_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// Mixes a field's or element's layout hash into `h`.
pub const fn layout_hash_mix(h: u64, v: u64) -> u64 {
    layout_hash_bytes(h, &v.to_le_bytes())
}

/// The FNV-1a offset basis: where every layout hash starts.
pub const LAYOUT_HASH_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Plain data that may be copied byte for byte through a channel (or into
/// and out of shared memory), and the identity a channel records for it.
///
/// Values are only ever *copied* in and out of shared memory, never read
/// in place while another process may write them (see the module docs);
/// types read in place are [`ShmAtomic`].
///
/// Declare structs with [`shm_struct!`], which checks the conditions below
/// that the compiler can check and implements this trait.
///
/// # Safety
///
/// Implement it only for types that are:
/// - `#[repr(C)]` or `#[repr(transparent)]` (a layout other processes,
///   possibly built by another compiler run, agree on);
/// - free of pointers, references, file descriptors and anything whose
///   meaning is local to one process;
/// - `Copy`, so without `Drop` (a copy out of shared memory is a value);
/// - valid for every bit pattern, including all zeroes (another process,
///   or a crashed one, may have written anything);
/// - free of padding bytes (they are copied as bytes and must be
///   initialised);
///
/// and whose `LAYOUT_HASH` changes whenever the layout does (field names,
/// order and types), so that two processes with different definitions of
/// a type under the same name do not exchange it.
pub unsafe trait ShmSafe: Copy + 'static {
    /// The type's name, as recorded in a channel header.
    const TYPE_NAME: TypeName;
    /// A hash of the type's name and layout.
    const LAYOUT_HASH: u64;
}

macro_rules! shm_safe_primitive {
    ($($t:ty => $described:literal),*) => { $(
        // SAFETY: primitive integers and floats are plain bits of fixed
        // size with no padding, no pointers and no Drop, valid for every
        // bit pattern; the hash covers the name, which fixes the layout.
        unsafe impl ShmSafe for $t {
            const TYPE_NAME: TypeName = TypeName::new(stringify!($t));
            const LAYOUT_HASH: u64 = layout_hash_bytes(LAYOUT_HASH_START, $described.as_bytes());
        }
    )* };
}
shm_safe_primitive!(
    u8 => "uint8", u16 => "uint16", u32 => "uint32", u64 => "uint64",
    i8 => "int8", i16 => "int16", i32 => "int32", i64 => "int64",
    f32 => "float32", f64 => "float64"
);

// SAFETY: an array of ShmSafe elements has no padding between them (each
// element's size is a multiple of its alignment) and inherits the rest; the
// hash covers the element's hash and the length.
unsafe impl<T: ShmSafe, const N: usize> ShmSafe for [T; N] {
    const TYPE_NAME: TypeName = TypeName::array(T::TYPE_NAME, N);
    const LAYOUT_HASH: u64 = layout_hash_mix(
        layout_hash_mix(layout_hash_bytes(LAYOUT_HASH_START, b"[]"), T::LAYOUT_HASH),
        N as u64,
    );
}

/// Declares a `#[repr(C)]` struct of [`ShmSafe`] fields and implements
/// [`ShmSafe`] for it, after checking at compile time that every field is
/// `ShmSafe` and that the struct has no padding (its size is the sum of
/// its fields'). The layout hash covers the struct's name and each field's
/// name and type.
///
/// ```
/// controller::shm_struct! {
///     #[derive(Debug, Default, PartialEq)]
///     pub struct Command {
///         pub seq: u64,
///         pub torque: [f32; 6],
///         pub mode: u32,
///         pub _reserved: u32,
///     }
/// }
/// ```
#[macro_export]
macro_rules! shm_struct {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $fty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field : $fty ),*
        }

        const _: () = {
            const fn field_is_shm_safe<T: $crate::shm::ShmSafe>() {}
            $( field_is_shm_safe::<$fty>(); )*
            assert!(
                ::core::mem::size_of::<$name>() == 0 $( + ::core::mem::size_of::<$fty>() )*,
                concat!("`", stringify!($name), "` has padding: order its fields by alignment or add explicit reserved fields"),
            );
        };

        // SAFETY: repr(C); every field is ShmSafe (checked above), so the
        // struct has no pointers, no Drop and is valid for every bit
        // pattern; its size is the sum of its fields' (checked above), so
        // it has no padding; the hash covers its name, field names and
        // field types. (The macro's checks are what make this impl sound,
        // so it is allowed where `unsafe_code` is otherwise denied.)
        #[allow(unsafe_code)]
        unsafe impl $crate::shm::ShmSafe for $name {
            const TYPE_NAME: $crate::shm::TypeName = $crate::shm::TypeName::new(stringify!($name));
            const LAYOUT_HASH: u64 = {
                let h = $crate::shm::layout_hash_bytes(
                    $crate::shm::LAYOUT_HASH_START,
                    stringify!($name).as_bytes(),
                );
                $(
                    let h = $crate::shm::layout_hash_bytes(h, stringify!($field).as_bytes());
                    let h = $crate::shm::layout_hash_mix(
                        h,
                        <$fty as $crate::shm::ShmSafe>::LAYOUT_HASH,
                    );
                )*
                h
            };
        }
    };
}

/// A type that may be read and written *in place* in memory other
/// processes write: made only of atomics.
///
/// # Safety
///
/// Implement it only for `#[repr(C)]` types whose every byte belongs to an
/// atomic (`AtomicU64`, `AtomicU32` or arrays or [`ShmAtomic`] structs of
/// them), with no padding, no pointers and no `Drop`, and for which all
/// zeroes is a valid value: every access is then an atomic operation and
/// any bit pattern another process stores is a valid value.
pub unsafe trait ShmAtomic: Sync + 'static {}

// SAFETY: atomics themselves.
unsafe impl ShmAtomic for AtomicU64 {}
// SAFETY: as above.
unsafe impl ShmAtomic for AtomicU32 {}
// SAFETY: an array of ShmAtomic elements is made of atomics with no
// padding between them.
unsafe impl<T: ShmAtomic, const N: usize> ShmAtomic for [T; N] {}

/// The bytes of a value.
pub fn as_bytes<T: ShmSafe>(v: &T) -> &[u8] {
    // SAFETY: T has no padding (ShmSafe), so every byte is initialised; the
    // slice borrows `v` for its lifetime.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}

/// A value read from bytes, or `None` when the length differs.
pub fn from_bytes<T: ShmSafe>(bytes: &[u8]) -> Option<T> {
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

/// The soft RLIMIT_MEMLOCK of this process, for messages.
fn memlock_limit_text() -> String {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return "unknown".into();
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        format!("RLIMIT_MEMLOCK {} bytes", lim.rlim_cur)
    }
}

/// Bytes of a huge page on the boards we run on (x86_64 and aarch64 with
/// 4 KiB pages): mappings of this size or more ask for huge pages.
pub const HUGE_PAGE: usize = 2 << 20;

impl Mapping {
    /// Maps `len` bytes of `file` shared, read-write and prefaulted (no
    /// page fault later on the real-time path), protected against
    /// truncation (see [`Mapping`]).
    ///
    /// # Safety
    ///
    /// The file's memory must be accessed, in this process, only through
    /// this mapping's [`Mapping::at`] (atomics) or through copies that use
    /// atomic or otherwise race-free accesses (the channel module's): no
    /// other mapping of the same file in this process may be read or
    /// written with plain (non-atomic) accesses while this one is in use,
    /// or those accesses race with ours.
    pub unsafe fn map(file: &File, len: usize) -> io::Result<Mapping> {
        Mapping::map_with(file, len, true)
    }

    /// Maps like [`Mapping::map`] without prefaulting: for readers that
    /// look at a few pages of a file they did not size (the supervisor
    /// reading other processes' channels), so a large sparse file costs
    /// them nothing.
    ///
    /// # Safety
    ///
    /// As for [`Mapping::map`].
    pub unsafe fn map_lazy(file: &File, len: usize) -> io::Result<Mapping> {
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
        // A file of huge-page size or more asks for huge pages before any
        // page is faulted in (a tmpfs mounted `huge=advise` allocates them
        // for such mappings; `huge=always`/`within_size` mounts do without
        // asking, `huge=never` ones ignore it), then populates.
        let huge = len >= HUGE_PAGE;
        let flags = libc::MAP_SHARED
            | if populate && !huge {
                libc::MAP_POPULATE
            } else {
                0
            };
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
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                // With mlockall(MCL_FUTURE) in force, a mapping that would
                // take the process past RLIMIT_MEMLOCK is refused so.
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "{e}: {len} bytes more of locked memory would pass this process's \
                         locked-memory limit ({}); give the process `memlock:` in robot.yaml \
                         (or lock less at start)",
                        memlock_limit_text()
                    ),
                ));
            }
            return Err(e);
        }
        let ptr = p as *mut u8;
        let Some(guard) = register(ptr, len) else {
            // SAFETY: unmaps the mapping just made; nothing refers to it.
            unsafe { libc::munmap(p, len) };
            return Err(io::Error::other(format!(
                "more than {MAX_MAPPINGS} shared-memory mappings in one process"
            )));
        };
        let m = Mapping { ptr, len, guard };
        if huge {
            // SAFETY: advice on the mapping just made; it changes no
            // contents. Refused advice (a kernel without THP) leaves small
            // pages, which is what there was.
            unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
            // SAFETY: as above; populating reads no byte into this process.
            if populate && unsafe { libc::madvise(p, len, libc::MADV_POPULATE_READ) } != 0 {
                // Before 5.14: fault each page in by reading it.
                m.probe();
            }
        }
        Ok(m)
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

    /// A shared reference to the atomics of a `T` at byte `offset`.
    ///
    /// Panics when the range is out of the mapping or misaligned (a layout
    /// bug, checked when the channel is opened, never on the hot path).
    pub fn at<T: ShmAtomic>(&self, offset: usize) -> &T {
        assert!(offset + std::mem::size_of::<T>() <= self.len);
        assert!(offset % std::mem::align_of::<T>() == 0);
        // SAFETY: in bounds and aligned (checked above; the base is page
        // aligned); T is made of atomics only and valid for every bit
        // pattern (ShmAtomic), so every access through the reference is
        // an atomic operation and a shared reference is sound for as long
        // as the mapping lives (`&self`).
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
