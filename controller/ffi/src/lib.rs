//! The runtime's C interface: `librtdeploy.a` and `librtdeploy.so`, declared
//! in `include/rtdeploy.h`. The header is written by hand and checked
//! against this file by `tests/header.rs` (every function's prototype and
//! every struct's size and field offsets), so neither can change without
//! the other.
//!
//! What every function here keeps:
//! - **No unwinding across the boundary.** Each body runs under
//!   `catch_unwind`; a panic becomes [`RtdStatus::Panic`] with its message
//!   in [`rtd_last_error`], and a loop that panicked while running is not
//!   run again ([`RtdStatus::State`]). A C callback must not unwind either
//!   (a C++ exception thrown through the runtime aborts the process): the
//!   C++ layer is built to catch at its own edge or with `-fno-exceptions`.
//! - **No allocation on the publish and handle paths.** `rtd_send`,
//!   `rtd_loan`, `rtd_loan_send`, `rtd_fetch_*`, the `rtd_ctx_*` calls and
//!   the loop's dispatch to a callback allocate nothing: a sender's
//!   staging buffer is sized when it is made, errors are written into a
//!   fixed per-thread buffer. Making loops, senders, watchers, fetchers
//!   and timers allocates (set-up, before the loop runs), as does
//!   [`rtd_loop_report`] (a diagnostic).
//! - **Every pointer from C is checked for NULL** and every name for UTF-8;
//!   a type record is checked for a size the runtime can carry and an
//!   alignment of 1, 2, 4 or 8. What cannot be checked (a pointer to freed
//!   memory, a buffer shorter than its length) is the caller's, as in any
//!   C interface.
//! - **Handles are not thread-safe**: a loop and everything made from it
//!   belong to the thread that runs the loop, as in Rust (`EventLoop` is
//!   not `Send`).

#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use controller::channel::{Publisher, RawLoan, Subscriber};
use controller::event_loop::{Ctx, EventLoop, LoopOptions, TimerHandle, TimingOptions};
use controller::shm::{TypeName, TypeRecord};
use controller::{Monotonic, WakeClass};

/// The interface's version, `RTD_ABI_VERSION` in the header: raised when a
/// function or struct changes.
pub const RTD_ABI_VERSION: u32 = 1;

/// What a call did. `RTD_OK` is 0; for the others [`rtd_last_error`] says
/// why.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtdStatus {
    Ok = 0,
    /// A NULL pointer, a name that is not UTF-8, a length that is not the
    /// type's, a type record the runtime cannot carry.
    Argument = 1,
    /// The channel cannot be opened or attached (missing, full, faulted).
    Channel = 2,
    /// The channel records another type: both are named.
    Type = 3,
    /// The loop could not be made, or its run ended with an error.
    Loop = 4,
    /// A publish was refused (too large, a fault of the channel).
    Publish = 5,
    /// A fetch found a fault of the channel or a message of another size.
    Fetch = 6,
    /// A call at the wrong time: a second loan before the first was sent,
    /// a loop that panicked.
    State = 7,
    /// The runtime panicked; the message says where.
    Panic = 8,
    /// The system refused (memory locking).
    System = 9,
}

// ---- errors --------------------------------------------------------------

/// The longest error message kept, its NUL included.
const ERROR_BYTES: usize = 1024;

struct ErrorText {
    bytes: [u8; ERROR_BYTES],
    len: usize,
}

impl std::fmt::Write for ErrorText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        // Cut on a character boundary, one byte kept for the NUL.
        let room = ERROR_BYTES - 1 - self.len;
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

thread_local! {
    // A fixed buffer with no destructor: writing an error allocates
    // nothing, and the pointer rtd_last_error gives stays valid.
    static LAST_ERROR: RefCell<ErrorText> = const {
        RefCell::new(ErrorText { bytes: [0; ERROR_BYTES], len: 0 })
    };
}

/// Keeps `why` as this thread's last error and returns `status`.
fn fail(status: RtdStatus, why: impl std::fmt::Display) -> RtdStatus {
    LAST_ERROR.with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            e.len = 0;
            let _ = write!(e, "{why}");
            let n = e.len;
            e.bytes[n] = 0;
        }
    });
    status
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Runs `f`, a panic caught and said.
fn guard(f: impl FnOnce() -> RtdStatus) -> RtdStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(s) => s,
        Err(p) => fail(
            RtdStatus::Panic,
            format_args!("the runtime panicked: {}", panic_text(&*p)),
        ),
    }
}

/// Runs `f` for a value, `otherwise` after a panic (said).
fn guard_value<T>(otherwise: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            fail(
                RtdStatus::Panic,
                format_args!("the runtime panicked: {}", panic_text(&*p)),
            );
            otherwise
        }
    }
}

/// `units::error::Chain` without the allocation: the error and its causes.
struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

fn channel_status(e: &controller::event_loop::LoopChannelError) -> RtdStatus {
    use controller::channel::ChannelAttachError;
    use controller::event_loop::LoopChannelError;
    match e {
        LoopChannelError::Attach(ChannelAttachError::WrongType { .. })
        | LoopChannelError::Attach(ChannelAttachError::TooSmall { .. }) => RtdStatus::Type,
        _ => RtdStatus::Channel,
    }
}

/// The NUL-terminated string `p` as UTF-8, or the error said.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, RtdStatus> {
    if p.is_null() {
        return Err(fail(RtdStatus::Argument, format_args!("{what} is NULL")));
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|e| {
        fail(
            RtdStatus::Argument,
            format_args!("{what} is not UTF-8 ({e})"),
        )
    })
}

/// `*mut T` as `&mut T`, or the error that it is NULL.
///
/// # Safety
/// `p` is NULL or points at a live `T` no other reference aliases.
unsafe fn handle<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, RtdStatus> {
    // SAFETY: the caller's promise.
    unsafe { p.as_mut() }.ok_or_else(|| fail(RtdStatus::Argument, format_args!("{what} is NULL")))
}

/// Stores `v` through `out`, or says that `out` is NULL.
///
/// # Safety
/// `out` is NULL or writable.
unsafe fn put<T>(out: *mut T, v: T, what: &str) -> RtdStatus {
    if out.is_null() {
        return fail(RtdStatus::Argument, format_args!("{what} is NULL"));
    }
    // SAFETY: the caller's promise.
    unsafe { out.write(v) };
    RtdStatus::Ok
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(s) => return s,
        }
    };
}

// ---- versions, errors ------------------------------------------------------

/// `RTD_ABI_VERSION` of the library linked (compare with the header's).
#[no_mangle]
pub extern "C" fn rtd_abi_version() -> u32 {
    RTD_ABI_VERSION
}

/// The status's name (`RTD_ERR_TYPE` ...), a static string.
#[no_mangle]
pub extern "C" fn rtd_status_name(status: RtdStatus) -> *const c_char {
    let s: &'static CStr = match status as c_int {
        0 => c"RTD_OK",
        1 => c"RTD_ERR_ARGUMENT",
        2 => c"RTD_ERR_CHANNEL",
        3 => c"RTD_ERR_TYPE",
        4 => c"RTD_ERR_LOOP",
        5 => c"RTD_ERR_PUBLISH",
        6 => c"RTD_ERR_FETCH",
        7 => c"RTD_ERR_STATE",
        8 => c"RTD_ERR_PANIC",
        9 => c"RTD_ERR_SYSTEM",
        _ => c"RTD_ERR_UNKNOWN",
    };
    s.as_ptr()
}

/// This thread's last error message (NUL-terminated, at most 1023 bytes),
/// valid until the next failing call on this thread; "" before any.
#[no_mangle]
pub extern "C" fn rtd_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.as_ptr() as *const ErrorText as *const c_char)
}

/// Locks the process's memory (`mlockall`) and touches `stack_bytes` of
/// stack and `heap_bytes` of heap, so that the real-time path takes no
/// page fault (as the Rust controllers do at start).
#[no_mangle]
pub extern "C" fn rtd_lock_memory(stack_bytes: usize, heap_bytes: usize) -> RtdStatus {
    guard(
        || match controller::rt::lock_and_prefault(stack_bytes, heap_bytes) {
            Ok(()) => RtdStatus::Ok,
            Err(e) => fail(RtdStatus::System, Chain(&e)),
        },
    )
}

// ---- the allocation trap ----------------------------------------------------

/// `rtd_alloc_trap`: what this thread's allocations do.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtdAllocTrap {
    /// They pass unseen.
    Off = 0,
    /// They pass and are counted (`rtd_allocations`).
    Count = 1,
    /// One line to stderr, then abort: a real-time section that allocates.
    Abort = 2,
}

/// Sets this thread's allocation trap; returns the previous mode. It sees
/// the runtime's allocations, and a C or C++ program's once the program
/// links `rtdeploy_malloc_trap.c` (its `malloc` family calls
/// [`rtd_trap_on_alloc`]).
#[no_mangle]
pub extern "C" fn rtd_set_alloc_trap(mode: RtdAllocTrap) -> RtdAllocTrap {
    use controller::rt::{set_alloc_trap, AllocTrap};
    let m = match mode as c_int {
        1 => AllocTrap::Count,
        2 => AllocTrap::Abort,
        _ => AllocTrap::Off,
    };
    match set_alloc_trap(m) {
        AllocTrap::Off => RtdAllocTrap::Off,
        AllocTrap::Count => RtdAllocTrap::Count,
        AllocTrap::Abort => RtdAllocTrap::Abort,
    }
}

/// Allocations this thread made while its trap counted.
#[no_mangle]
pub extern "C" fn rtd_allocations() -> u64 {
    controller::rt::allocations()
}

/// The trap's check for one allocation (called by the `malloc` family of
/// `rtdeploy_malloc_trap.c`): counts it or aborts, as this thread's mode
/// says. Allocates nothing and never unwinds.
#[no_mangle]
pub extern "C" fn rtd_trap_on_alloc() {
    controller::rt::note_allocation();
}

// ---- types -----------------------------------------------------------------

/// `rtd_type`: what a channel records of its message type. The name and
/// layout hash come from the message's description (`deploy gen` writes
/// them beside the C struct), the size and alignment from the compiler
/// (`sizeof`, `_Alignof`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RtdType {
    pub name: *const c_char,
    pub size: u64,
    pub align: u64,
    pub layout_hash: u64,
}

/// The record of `t`, checked.
///
/// # Safety
/// `t` is NULL or points at an `rtd_type` whose name is NULL or a string.
unsafe fn record(t: *const RtdType) -> Result<TypeRecord, RtdStatus> {
    // SAFETY: the caller's promise.
    let Some(t) = (unsafe { t.as_ref() }) else {
        return Err(fail(RtdStatus::Argument, "the type is NULL"));
    };
    // SAFETY: the caller's promise.
    let name = unsafe { text(t.name, "the type's name") }?;
    if name.is_empty() || name.len() > TypeName::MAX {
        return Err(fail(
            RtdStatus::Argument,
            format_args!("type name `{name}`: 1 to {} bytes expected", TypeName::MAX),
        ));
    }
    if !matches!(t.align, 1 | 2 | 4 | 8) || t.size % t.align != 0 {
        return Err(fail(
            RtdStatus::Argument,
            format_args!(
                "type `{name}`: size {} and alignment {} (expected an alignment of 1, 2, 4 or 8 that divides the size)",
                t.size, t.align
            ),
        ));
    }
    if t.size > controller::config::MAX_MESSAGE_SIZE {
        return Err(fail(
            RtdStatus::Argument,
            format_args!(
                "type `{name}` is {} bytes; a channel carries at most {}",
                t.size,
                controller::config::MAX_MESSAGE_SIZE
            ),
        ));
    }
    Ok(TypeRecord {
        name: TypeName::new(name),
        size: t.size,
        align: t.align,
        layout_hash: t.layout_hash,
    })
}

/// The loop, the channel's name and the type's record every call that
/// attaches to a channel takes, each checked.
///
/// # Safety
/// As [`handle`], [`text`] and [`record`] for each.
unsafe fn channel_args<'a>(
    lp: *mut RtdLoop,
    channel: *const c_char,
    ty: *const RtdType,
) -> Result<(&'a mut RtdLoop, &'a str, TypeRecord), RtdStatus> {
    // SAFETY: the caller's promises.
    unsafe {
        Ok((
            handle(lp, "the loop")?,
            text(channel, "the channel's name")?,
            record(ty)?,
        ))
    }
}

// ---- the loop --------------------------------------------------------------

/// `rtd_loop`: an event loop.
pub struct RtdLoop {
    lp: EventLoop,
    /// It panicked while running: not run again.
    poisoned: bool,
}

/// `rtd_ctx`: the context of one callback, valid during it only.
pub struct RtdCtx {
    _opaque: [u8; 0],
}

fn ctx<'a>(c: *mut RtdCtx) -> Option<&'a mut Ctx<'a>> {
    // SAFETY: an `rtd_ctx *` is only ever made from the `&mut Ctx` of
    // the callback running (see `rtd_watch`), and is valid during it.
    unsafe { (c as *mut Ctx<'a>).as_mut() }
}

/// Makes an event loop from the supervisor's environment
/// (`RTDEPLOY_SHM_DIR`, `RTDEPLOY_PROCESS`, the wake class, the backend
/// forced, the policy checked): what a controller started from robot.yaml
/// is given. `shm_dir` (the channel directory) and `process` (the name its
/// timing reports are published under, `/rtdeploy/timing/<process>`, once
/// a second) replace the environment's when not NULL.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_loop_new(
    shm_dir: *const c_char,
    process: *const c_char,
    out: *mut *mut RtdLoop,
) -> RtdStatus {
    guard(|| {
        if out.is_null() {
            return fail(RtdStatus::Argument, "out is NULL");
        }
        let mut opts = LoopOptions::from_env();
        if !shm_dir.is_null() {
            // SAFETY: a string, as the header says.
            opts.shm_dir = tri!(unsafe { text(shm_dir, "shm_dir") }).into();
        }
        let process = if process.is_null() {
            opts.timing.as_ref().map(|t| t.process.clone())
        } else {
            // SAFETY: as above.
            Some(tri!(unsafe { text(process, "process") }).to_string())
        };
        opts.timing = process.map(|process| TimingOptions {
            shm_dir: opts.shm_dir.clone(),
            process,
            period: Duration::from_secs(1),
        });
        let lp = match EventLoop::new(opts) {
            Ok(lp) => lp,
            Err(e) => return fail(RtdStatus::Loop, Chain(&e)),
        };
        let b = Box::new(RtdLoop {
            lp,
            poisoned: false,
        });
        // SAFETY: checked not NULL; writable as the header says.
        unsafe { put(out, Box::into_raw(b), "out") }
    })
}

/// Frees a loop (NULL is ignored). Its senders, fetchers and timers are
/// freed apart, before or after.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_loop_free(lp: *mut RtdLoop) {
    if !lp.is_null() {
        let _ = guard(|| {
            // SAFETY: made by rtd_loop_new and not freed yet, as the header
            // says.
            drop(unsafe { Box::from_raw(lp) });
            RtdStatus::Ok
        });
    }
}

/// Runs the loop until a callback calls `rtd_ctx_exit` or the loop fails.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_loop_run(lp: *mut RtdLoop) -> RtdStatus {
    // SAFETY: a loop or NULL, as the header says.
    let l = tri!(unsafe { handle(lp, "the loop") });
    if l.poisoned {
        return fail(
            RtdStatus::State,
            "this loop panicked while running: it is not run again",
        );
    }
    let r = catch_unwind(AssertUnwindSafe(|| l.lp.run()));
    match r {
        Ok(Ok(())) => RtdStatus::Ok,
        Ok(Err(e)) => fail(RtdStatus::Loop, Chain(&e)),
        Err(p) => {
            l.poisoned = true;
            fail(
                RtdStatus::Panic,
                format_args!("the runtime panicked: {}", panic_text(&*p)),
            )
        }
    }
}

/// The wake backend the loop sleeps on (`io_uring-futex`, `futex_waitv`,
/// `doorbell`, `simulated`), a static string; "" for NULL.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_loop_backend(lp: *const RtdLoop) -> *const c_char {
    guard_value(c"".as_ptr(), || {
        // SAFETY: a loop or NULL.
        let Some(l) = (unsafe { lp.as_ref() }) else {
            return c"".as_ptr();
        };
        let s: &'static CStr = match l.lp.backend().name() {
            "io_uring-futex" => c"io_uring-futex",
            "futex_waitv" => c"futex_waitv",
            "doorbell" => c"doorbell",
            "simulated" => c"simulated",
            _ => c"unknown",
        };
        s.as_ptr()
    })
}

/// 1 when the loop is of the real-time wake class (robot.yaml gave the
/// process a real-time policy), 0 when best-effort or NULL.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_loop_real_time(lp: *const RtdLoop) -> c_int {
    // SAFETY: a loop or NULL.
    unsafe { lp.as_ref() }.map_or(0, |l| c_int::from(l.lp.class() == WakeClass::RealTime))
}

/// The loop's clock now (CLOCK_MONOTONIC, or a simulation's virtual
/// time), nanoseconds; 0 for NULL.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_loop_now_ns(lp: *const RtdLoop) -> u64 {
    // SAFETY: a loop or NULL.
    unsafe { lp.as_ref() }.map_or(0, |l| l.lp.now().as_nanos())
}

// ---- callbacks -------------------------------------------------------------

/// `rtd_watch_fn`: called with each message, its bytes the loop's own
/// copy (valid during the call).
pub type RtdWatchFn =
    unsafe extern "C" fn(ctx: *mut RtdCtx, msg: *const c_void, len: usize, user: *mut c_void);

/// `rtd_timer_fn`: called at each firing.
pub type RtdTimerFn = unsafe extern "C" fn(ctx: *mut RtdCtx, user: *mut c_void);

/// Calls `f(ctx, msg, len, user)` with every message published on
/// `channel` from now on, in order, woken as the loop's backend wakes. The
/// channel is bound to `type`: a channel recording another type is
/// refused (`RTD_ERR_TYPE`, both named).
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_watch(
    lp: *mut RtdLoop,
    channel: *const c_char,
    ty: *const RtdType,
    f: Option<RtdWatchFn>,
    user: *mut c_void,
) -> RtdStatus {
    guard(|| {
        // SAFETY: as the header says, for each.
        let (l, name, t) = tri!(unsafe { channel_args(lp, channel, ty) });
        let Some(f) = f else {
            return fail(RtdStatus::Argument, "the callback is NULL");
        };
        let r = l.lp.watch_record(name, &t, move |c, bytes| {
            // SAFETY: the C callback, given the context of this call and
            // the loop's copy of the message, both valid during it.
            unsafe {
                f(
                    c as *mut Ctx<'_> as *mut RtdCtx,
                    bytes.as_ptr() as *const c_void,
                    bytes.len(),
                    user,
                )
            }
        });
        match r {
            Ok(()) => RtdStatus::Ok,
            Err(e) => fail(channel_status(&e), Chain(&e)),
        }
    })
}

/// `rtd_timer`: a timer's handle.
pub struct RtdTimer {
    handle: TimerHandle,
}

fn timer_callback(f: RtdTimerFn, user: *mut c_void) -> impl FnMut(&mut Ctx) + 'static {
    move |c| {
        // SAFETY: the C callback, given the context of this call.
        unsafe { f(c as *mut Ctx<'_> as *mut RtdCtx, user) }
    }
}

/// # Safety
/// `out` is NULL (no handle wanted) or writable.
unsafe fn give_timer(handle: TimerHandle, out: *mut *mut RtdTimer) -> RtdStatus {
    if !out.is_null() {
        // SAFETY: the caller's promise.
        unsafe { out.write(Box::into_raw(Box::new(RtdTimer { handle }))) };
    }
    RtdStatus::Ok
}

/// A timer first due at `first_deadline_ns` on the loop's clock, then
/// every `period_ns` (0: once). `out` (may be NULL) gets a handle that
/// disables or reschedules it.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_timer_add(
    lp: *mut RtdLoop,
    name: *const c_char,
    first_deadline_ns: u64,
    period_ns: u64,
    f: Option<RtdTimerFn>,
    user: *mut c_void,
    out: *mut *mut RtdTimer,
) -> RtdStatus {
    guard(|| {
        // SAFETY: as the header says, for each.
        let l = tri!(unsafe { handle(lp, "the loop") });
        // SAFETY: as the header says (see the function's # Safety).
        let name = tri!(unsafe { text(name, "the timer's name") });
        let Some(f) = f else {
            return fail(RtdStatus::Argument, "the callback is NULL");
        };
        let period = (period_ns > 0).then(|| Duration::from_nanos(period_ns));
        let h = l.lp.add_timer(
            name,
            Monotonic::from_nanos(first_deadline_ns),
            period,
            timer_callback(f, user),
        );
        // SAFETY: as the header says.
        unsafe { give_timer(h, out) }
    })
}

/// A phased loop: due at every `k * period_ns + offset_ns` of the loop's
/// clock, from the next such instant; a late loop skips the cycles whose
/// deadlines passed (`rtd_ctx_missed_cycles`).
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_phased_loop_add(
    lp: *mut RtdLoop,
    name: *const c_char,
    period_ns: u64,
    offset_ns: u64,
    f: Option<RtdTimerFn>,
    user: *mut c_void,
    out: *mut *mut RtdTimer,
) -> RtdStatus {
    guard(|| {
        // SAFETY: as the header says, for each.
        let l = tri!(unsafe { handle(lp, "the loop") });
        // SAFETY: as the header says (see the function's # Safety).
        let name = tri!(unsafe { text(name, "the phased loop's name") });
        let Some(f) = f else {
            return fail(RtdStatus::Argument, "the callback is NULL");
        };
        if period_ns == 0 {
            return fail(RtdStatus::Argument, "a phased loop's period is 0");
        }
        let h = l.lp.add_phased_loop(
            name,
            Duration::from_nanos(period_ns),
            Duration::from_nanos(offset_ns),
            timer_callback(f, user),
        );
        // SAFETY: as the header says.
        unsafe { give_timer(h, out) }
    })
}

/// Stops the timer until it is scheduled again (NULL is ignored).
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_timer_disable(t: *mut RtdTimer) {
    // SAFETY: a timer handle or NULL.
    if let Some(t) = unsafe { t.as_ref() } {
        t.handle.disable();
    }
}

/// Next due at `deadline_ns`, then every `period_ns` (0: once).
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_timer_schedule(t: *mut RtdTimer, deadline_ns: u64, period_ns: u64) {
    // SAFETY: a timer handle or NULL.
    if let Some(t) = unsafe { t.as_ref() } {
        t.handle.schedule(
            Monotonic::from_nanos(deadline_ns),
            (period_ns > 0).then(|| Duration::from_nanos(period_ns)),
        );
    }
}

/// Frees a timer's handle (the timer itself stays with its loop).
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_timer_free(t: *mut RtdTimer) {
    if !t.is_null() {
        // SAFETY: made by rtd_timer_add or rtd_phased_loop_add, not freed.
        drop(unsafe { Box::from_raw(t) });
    }
}

// ---- the context of a callback --------------------------------------------

/// Now, on the loop's clock (nanoseconds).
#[no_mangle]
pub extern "C" fn rtd_ctx_now_ns(c: *mut RtdCtx) -> u64 {
    ctx(c).map_or(0, |c| c.now().as_nanos())
}

/// When the event was due: a message's send time, a timer's deadline.
#[no_mangle]
pub extern "C" fn rtd_ctx_event_time_ns(c: *mut RtdCtx) -> u64 {
    ctx(c).map_or(0, |c| c.event_time().as_nanos())
}

/// From the event's time to this callback's start, nanoseconds.
#[no_mangle]
pub extern "C" fn rtd_ctx_latency_ns(c: *mut RtdCtx) -> u64 {
    ctx(c).map_or(0, |c| {
        u64::try_from(c.latency().as_nanos()).unwrap_or(u64::MAX)
    })
}

/// A phased loop's cycles skipped before this one.
#[no_mangle]
pub extern "C" fn rtd_ctx_missed_cycles(c: *mut RtdCtx) -> u64 {
    ctx(c).map_or(0, |c| c.missed_cycles())
}

/// Messages of the watched channel overwritten before this one was read.
#[no_mangle]
pub extern "C" fn rtd_ctx_lost_before(c: *mut RtdCtx) -> u64 {
    ctx(c).map_or(0, |c| c.lost_before())
}

/// Ends the loop's run once this callback returns.
#[no_mangle]
pub extern "C" fn rtd_ctx_exit(c: *mut RtdCtx) {
    if let Some(c) = ctx(c) {
        c.exit();
    }
}

// ---- senders ---------------------------------------------------------------

/// `rtd_sender`: a publisher of one channel, its type bound.
pub struct RtdSender {
    publisher: Publisher,
    size: usize,
    loan: Option<RawLoan>,
}

/// A sender on `channel`, bound to `type` (refused, both named, when the
/// channel records another); its counts are in the loop's timing report.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_sender_new(
    lp: *mut RtdLoop,
    channel: *const c_char,
    ty: *const RtdType,
    out: *mut *mut RtdSender,
) -> RtdStatus {
    guard(|| {
        // SAFETY: as the header says, for each.
        let (l, name, t) = tri!(unsafe { channel_args(lp, channel, ty) });
        if out.is_null() {
            return fail(RtdStatus::Argument, "out is NULL");
        }
        let publisher = match l.lp.make_record_sender(name, &t) {
            Ok(p) => p,
            Err(e) => return fail(channel_status(&e), Chain(&e)),
        };
        let s = Box::new(RtdSender {
            publisher,
            size: t.size as usize,
            loan: None,
        });
        // SAFETY: checked not NULL; writable as the header says.
        unsafe { put(out, Box::into_raw(s), "out") }
    })
}

/// Frees a sender (NULL is ignored); a loan it held is not sent.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_sender_free(s: *mut RtdSender) {
    if !s.is_null() {
        let _ = guard(|| {
            // SAFETY: made by rtd_sender_new, not freed.
            drop(unsafe { Box::from_raw(s) });
            RtdStatus::Ok
        });
    }
}

/// Publishes a copy of the `len` bytes at `msg` (`len` must be the
/// type's size).
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_send(s: *mut RtdSender, msg: *const c_void, len: usize) -> RtdStatus {
    guard(|| {
        // SAFETY: a sender or NULL.
        let s = tri!(unsafe { handle(s, "the sender") });
        if msg.is_null() {
            return fail(RtdStatus::Argument, "the message is NULL");
        }
        if len != s.size {
            return fail(
                RtdStatus::Argument,
                format_args!(
                    "the message is {len} bytes; the sender's type is {}",
                    s.size
                ),
            );
        }
        if s.loan.is_some() {
            return fail(
                RtdStatus::State,
                "a loan of this sender is taken: send or cancel it first",
            );
        }
        // SAFETY: `len` readable bytes at `msg`, as the header says.
        let bytes = unsafe { std::slice::from_raw_parts(msg as *const u8, len) };
        match s.publisher.publish(bytes) {
            Ok(_) => RtdStatus::Ok,
            Err(e) => fail(RtdStatus::Publish, Chain(&e)),
        }
    })
}

/// Lends the next message's slot: `*msg` points at the type's size of
/// writable bytes, 8-byte aligned, holding whatever the slot held (write
/// every field). `rtd_loan_send` publishes it, `rtd_loan_cancel` gives it
/// back; no other call on the sender in between.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_loan(s: *mut RtdSender, msg: *mut *mut c_void) -> RtdStatus {
    guard(|| {
        // SAFETY: a sender or NULL.
        let s = tri!(unsafe { handle(s, "the sender") });
        if msg.is_null() {
            return fail(RtdStatus::Argument, "msg is NULL");
        }
        if s.loan.is_some() {
            return fail(
                RtdStatus::State,
                "a loan of this sender is taken: send or cancel it first",
            );
        }
        match s.publisher.loan_raw(s.size) {
            Ok(l) => {
                let p = l.as_mut_ptr() as *mut c_void;
                s.loan = Some(l);
                // SAFETY: checked not NULL; writable as the header says.
                unsafe { put(msg, p, "msg") }
            }
            Err(e) => fail(RtdStatus::Publish, Chain(&e)),
        }
    })
}

/// Publishes the message the loan holds.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_loan_send(s: *mut RtdSender) -> RtdStatus {
    guard(|| {
        // SAFETY: a sender or NULL.
        let s = tri!(unsafe { handle(s, "the sender") });
        let Some(l) = s.loan.take() else {
            return fail(RtdStatus::State, "no loan of this sender is taken");
        };
        match s.publisher.send_raw(l) {
            Ok(_) => RtdStatus::Ok,
            Err(e) => fail(RtdStatus::Publish, Chain(&e)),
        }
    })
}

/// Gives a loan back unsent (nothing is published).
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_loan_cancel(s: *mut RtdSender) {
    // SAFETY: a sender or NULL.
    if let Some(s) = unsafe { s.as_mut() } {
        s.loan = None;
    }
}

// ---- fetchers --------------------------------------------------------------

/// `rtd_fetcher`: a reader of one channel that never wakes the loop.
pub struct RtdFetcher {
    reader: Subscriber,
    size: usize,
}

/// A fetcher of `channel`, bound to `type`.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_fetcher_new(
    lp: *mut RtdLoop,
    channel: *const c_char,
    ty: *const RtdType,
    out: *mut *mut RtdFetcher,
) -> RtdStatus {
    guard(|| {
        // SAFETY: as the header says, for each.
        let (l, name, t) = tri!(unsafe { channel_args(lp, channel, ty) });
        if out.is_null() {
            return fail(RtdStatus::Argument, "out is NULL");
        }
        let reader = match l.lp.make_record_fetcher(name, &t) {
            Ok(r) => r,
            Err(e) => return fail(channel_status(&e), Chain(&e)),
        };
        let f = Box::new(RtdFetcher {
            reader,
            size: t.size as usize,
        });
        // SAFETY: checked not NULL; writable.
        unsafe { put(out, Box::into_raw(f), "out") }
    })
}

/// Frees a fetcher (NULL is ignored).
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_fetcher_free(f: *mut RtdFetcher) {
    if !f.is_null() {
        let _ = guard(|| {
            // SAFETY: made by rtd_fetcher_new, not freed.
            drop(unsafe { Box::from_raw(f) });
            RtdStatus::Ok
        });
    }
}

enum Which {
    Latest,
    Next,
}

fn fetch(f: *mut RtdFetcher, msg: *mut *const c_void, which: Which) -> RtdStatus {
    guard(|| {
        // SAFETY: a fetcher or NULL.
        let f = tri!(unsafe { handle(f, "the fetcher") });
        if msg.is_null() {
            return fail(RtdStatus::Argument, "msg is NULL");
        }
        let size = f.size;
        let m = match which {
            Which::Latest => f.reader.latest(),
            Which::Next => f.reader.next_message(),
        };
        let p = match m {
            Ok(None) => std::ptr::null(),
            Ok(Some(m)) if m.data.len() == size => m.data.as_ptr() as *const c_void,
            Ok(Some(m)) => {
                let (index, got) = (m.index, m.data.len());
                return fail(
                    RtdStatus::Fetch,
                    format_args!("message {index} is {got} bytes, not a {size}-byte message of the fetcher's type"),
                );
            }
            Err(e) => return fail(RtdStatus::Fetch, Chain(&e)),
        };
        // SAFETY: checked not NULL; writable as the header says.
        unsafe { put(msg, p, "msg") }
    })
}

/// The newest message not fetched yet: `*msg` points at the fetcher's own
/// copy (the type's size, valid until the next call on the fetcher), or
/// is NULL when there is none.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_fetch_latest(
    f: *mut RtdFetcher,
    msg: *mut *const c_void,
) -> RtdStatus {
    fetch(f, msg, Which::Latest)
}

/// The next message in order (as `rtd_fetch_latest` otherwise).
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_fetch_next(f: *mut RtdFetcher, msg: *mut *const c_void) -> RtdStatus {
    fetch(f, msg, Which::Next)
}

/// Messages overwritten before the fetcher read them.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_fetcher_lost(f: *const RtdFetcher) -> u64 {
    // SAFETY: a fetcher or NULL.
    unsafe { f.as_ref() }.map_or(0, |f| f.reader.lost())
}

// ---- timing reports --------------------------------------------------------

/// `rtd_report_entry.kind` of a watcher.
pub const RTD_ENTRY_WATCHER: u32 = 0;
/// Of a timer or phased loop.
pub const RTD_ENTRY_TIMER: u32 = 1;
/// Of a sender.
pub const RTD_ENTRY_SENDER: u32 = 2;

/// `rtd_report_entry`: one watcher, timer or sender of a loop's timing
/// report (the figures `deploy status` shows), latencies over the report's
/// window.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RtdReportEntry {
    /// The channel's or timer's name, NUL-terminated (cut to 63 bytes).
    pub name: [c_char; 64],
    /// [`RTD_ENTRY_WATCHER`], [`RTD_ENTRY_TIMER`] or [`RTD_ENTRY_SENDER`].
    pub kind: u32,
    pub reserved: u32,
    pub count: u64,
    pub total: u64,
    pub latency_p50_ns: u64,
    pub latency_p99_ns: u64,
    pub latency_max_ns: u64,
    pub handler_p99_ns: u64,
    pub handler_max_ns: u64,
    pub lost: u64,
    pub missed: u64,
    pub errors: u64,
}

/// The loop's timing report now: up to `cap` entries into `entries`,
/// their number into `*n` (`*n` may exceed `cap`: the entries not
/// written). Allocates: a diagnostic, not for the real-time path.
///
/// # Safety
/// Each pointer is NULL or what `rtdeploy.h` says: a handle this library
/// made and did not free, a NUL-terminated string, storage to write to.
#[no_mangle]
pub unsafe extern "C" fn rtd_loop_report(
    lp: *const RtdLoop,
    entries: *mut RtdReportEntry,
    cap: usize,
    n: *mut usize,
) -> RtdStatus {
    guard(|| {
        // SAFETY: a loop or NULL.
        let Some(l) = (unsafe { lp.as_ref() }) else {
            return fail(RtdStatus::Argument, "the loop is NULL");
        };
        if n.is_null() || (entries.is_null() && cap > 0) {
            return fail(RtdStatus::Argument, "n, or entries with cap > 0, is NULL");
        }
        let r = l.lp.report_now();
        for (i, e) in r.entries.iter().enumerate().take(cap) {
            let mut name = [0 as c_char; 64];
            let mut len = e.name.len().min(63);
            while !e.name.is_char_boundary(len) {
                len -= 1;
            }
            for (d, s) in name.iter_mut().zip(&e.name.as_bytes()[..len]) {
                *d = *s as c_char;
            }
            let out = RtdReportEntry {
                name,
                kind: match e.kind {
                    controller::EntryKind::Watcher => RTD_ENTRY_WATCHER,
                    controller::EntryKind::Timer => RTD_ENTRY_TIMER,
                    controller::EntryKind::Sender => RTD_ENTRY_SENDER,
                },
                reserved: 0,
                count: e.count,
                total: e.total,
                latency_p50_ns: e.latency_p50_ns.unwrap_or(0),
                latency_p99_ns: e.latency_p99_ns,
                latency_max_ns: e.latency_max_ns,
                handler_p99_ns: e.handler_p99_ns,
                handler_max_ns: e.handler_max_ns,
                lost: e.lost,
                missed: e.missed,
                errors: e.errors,
            };
            // SAFETY: `cap` writable entries, as the header says.
            unsafe { entries.add(i).write(out) };
        }
        // SAFETY: checked not NULL.
        unsafe { n.write(r.entries.len()) };
        RtdStatus::Ok
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: rtd_last_error gives a NUL-terminated string.
        unsafe { CStr::from_ptr(rtd_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_is_a_status_and_its_message() {
        let s = guard(|| panic!("planted"));
        assert_eq!(s, RtdStatus::Panic);
        assert_eq!(last_error(), "the runtime panicked: planted");
        assert_eq!(guard_value(7u64, || panic!("again")), 7);
        assert_eq!(last_error(), "the runtime panicked: again");
    }

    #[test]
    fn a_long_message_is_cut_on_a_character_boundary() {
        fail(RtdStatus::Argument, "é".repeat(2000));
        let e = last_error();
        assert!(
            e.len() < ERROR_BYTES && e.len() >= ERROR_BYTES - 3,
            "{}",
            e.len()
        );
        assert!(e.chars().all(|c| c == 'é'));
    }

    #[test]
    fn type_records_the_runtime_cannot_carry_are_refused() {
        let name = c"Pose";
        let ok = RtdType {
            name: name.as_ptr(),
            size: 24,
            align: 8,
            layout_hash: 42,
        };
        // SAFETY: valid records throughout.
        unsafe {
            let r = record(&ok).unwrap();
            assert_eq!(
                (r.name.as_str(), r.size, r.align, r.layout_hash),
                ("Pose", 24, 8, 42)
            );
            for (t, why) in [
                (RtdType { align: 3, ..ok }, "alignment 3"),
                (
                    RtdType {
                        align: 16,
                        size: 32,
                        ..ok
                    },
                    "alignment 16",
                ),
                (RtdType { size: 20, ..ok }, "size 20"),
                (
                    RtdType {
                        size: 128 << 20,
                        ..ok
                    },
                    "at most",
                ),
                (
                    RtdType {
                        name: std::ptr::null(),
                        ..ok
                    },
                    "name is NULL",
                ),
                (
                    RtdType {
                        name: c"".as_ptr(),
                        ..ok
                    },
                    "1 to 64 bytes",
                ),
                (
                    RtdType {
                        name: c"\xff".as_ptr(),
                        ..ok
                    },
                    "not UTF-8",
                ),
            ] {
                assert_eq!(record(&t), Err(RtdStatus::Argument));
                assert!(last_error().contains(why), "{why}: {}", last_error());
            }
            assert_eq!(record(std::ptr::null()), Err(RtdStatus::Argument));
        }
    }

    #[test]
    fn status_names_are_the_headers() {
        let name = |s| {
            // SAFETY: static strings.
            unsafe { CStr::from_ptr(rtd_status_name(s)) }
                .to_str()
                .unwrap()
        };
        assert_eq!(name(RtdStatus::Ok), "RTD_OK");
        assert_eq!(name(RtdStatus::Type), "RTD_ERR_TYPE");
        assert_eq!(name(RtdStatus::System), "RTD_ERR_SYSTEM");
    }
}
