//! Shared-memory mappings and the one trait every type placed in shared
//! memory implements.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64};

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

/// A `MAP_SHARED` read-write mapping of a whole file.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; all concurrent access to it goes
// through atomics, so sharing the pointer between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` shared, read-write, prefaulted.
    pub fn map(file: &File, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping at an address the kernel chooses; the fd
        // is valid for the call; the result is checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: p as *mut u8,
            len,
        })
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
        // SAFETY: unmaps exactly the range mapped in `map`; no reference
        // into it outlives `self` (they all borrow it).
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}
