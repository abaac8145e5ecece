//! The messages both sides send: `[u64; W]`, the same type and the same
//! bytes for our channels and for iceoryx2.
//!
//! Word 0 carries the benchmark's stamp (a `CLOCK_MONOTONIC` send time,
//! echoed back in ping-pong; a sequence number in the throughput and
//! publish benchmarks); every other word carries the sequence number. A
//! sender writes every word of every message, in place in the slot it
//! loaned; a receiver reads word 0 and the last word. [`STOP`] in word 0
//! tells a receiver that the sender is done.
//!
//! No `[u64; W]` is ever a value here: a message of 4 MiB would not fit
//! a thread's stack. Messages are written where they are sent from (a
//! loan) and read where they arrived (a slot, a sample, a loop's buffer),
//! always through a reference.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

/// Word 0 of the message that ends a run.
pub const STOP: u64 = u64::MAX;

/// The message sizes the benchmark is built for, in bytes (each one a
/// monomorphised `[u64; size / 8]`).
pub const SIZES: [usize; 7] = [8, 64, 1024, 4096, 65536, 1 << 20, 4 << 20];

/// The sizes measured unless told otherwise.
pub const DEFAULT_SIZES: [usize; 5] = [8, 1024, 65536, 1 << 20, 4 << 20];

/// Messages above this many bytes are large: they get the shorter
/// queues, longer periods and fewer messages of the `--large-*` flags (a
/// queue of 64 slots of 4 MiB is 256 MiB per channel).
pub const LARGE: usize = 65536;

/// Writes a whole message of `W` words at `dst`: `stamp` into word 0,
/// `seq` into every other word.
///
/// # Safety
///
/// `dst` points to `W` `u64`s, aligned, writable and not accessed through
/// any other reference while this runs (initialised or not: only writes).
#[inline]
unsafe fn fill_raw<const W: usize>(dst: *mut u64, stamp: u64, seq: u64) {
    // SAFETY: the caller's conditions: word 0 is in bounds and ours to write.
    unsafe { dst.write(stamp) };
    // The loop below becomes 16-byte vector stores from word `first` on:
    // started on a 16-byte boundary, none of them straddles two cache
    // lines, wherever the payload starts (our slots' payloads are 64-byte
    // aligned, so word 1 is not; iceoryx2's lie 8 bytes off, so it is):
    // both sides write at the same speed.
    let first = if W > 2 && !(dst.wrapping_add(1) as usize).is_multiple_of(16) {
        // SAFETY: W > 2, so word 1 is in bounds.
        unsafe { dst.add(1).write(seq) };
        2
    } else {
        1
    };
    for i in first..W {
        // SAFETY: i < W, so in bounds of the caller's W words.
        unsafe { dst.add(i).write(seq) };
    }
}

/// Writes a whole message into `m` (a loan of our channel).
#[inline]
pub fn fill<const W: usize>(m: &mut [u64; W], stamp: u64, seq: u64) {
    // SAFETY: `m` is W aligned words behind an exclusive reference.
    unsafe { fill_raw::<W>(m.as_mut_ptr(), stamp, seq) }
}

/// Writes a whole message into `m` (an uninitialised loan of iceoryx2's);
/// every word is initialised afterwards.
#[inline]
pub fn fill_uninit<const W: usize>(m: &mut MaybeUninit<[u64; W]>, stamp: u64, seq: u64) {
    // SAFETY: a MaybeUninit<[u64; W]> is W aligned words, here behind an
    // exclusive reference; fill_raw only writes them.
    unsafe { fill_raw::<W>(m.as_mut_ptr().cast::<u64>(), stamp, seq) }
}

/// The stamp (word 0) and the sequence number (the last word) of a
/// message; for an 8-byte message both are word 0.
#[inline]
pub fn read<const W: usize>(m: &[u64; W]) -> (u64, u64) {
    (m[0], m[W - 1])
}

/// Bytes as the tables write them: `8 B`, `1 KiB`, `64 KiB`, `4 MiB`.
pub fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// Calls `$body` with `W` bound to the word count of `$size` (one of
/// [`SIZES`]).
#[macro_export]
macro_rules! with_words {
    ($size:expr, $w:ident => $body:expr) => {
        match $size {
            8 => {
                const $w: usize = 1;
                $body
            }
            64 => {
                const $w: usize = 8;
                $body
            }
            1024 => {
                const $w: usize = 128;
                $body
            }
            4096 => {
                const $w: usize = 512;
                $body
            }
            65536 => {
                const $w: usize = 8192;
                $body
            }
            1048576 => {
                const $w: usize = 131072;
                $body
            }
            4194304 => {
                const $w: usize = 524288;
                $body
            }
            other => ::anyhow::bail!(
                "message size {other} is not one this benchmark is built for ({:?})",
                $crate::message::SIZES
            ),
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_writes_every_word_and_read_finds_stamp_and_sequence() {
        let mut m = [0u64; 128];
        fill(&mut m, 7, 9);
        assert_eq!(read(&m), (7, 9));
        assert!(m[1..].iter().all(|&w| w == 9));
        let mut one = MaybeUninit::<[u64; 1]>::uninit();
        fill_uninit(&mut one, 5, 6);
        // SAFETY: fill_uninit initialised the one word.
        let one = unsafe { one.assume_init() };
        assert_eq!(read(&one), (5, 5));
    }

    #[test]
    fn sizes_are_labelled_in_bytes_or_kib() {
        assert_eq!(size_label(8), "8 B");
        assert_eq!(size_label(1024), "1 KiB");
        assert_eq!(size_label(65536), "64 KiB");
        assert_eq!(size_label(1 << 20), "1 MiB");
        assert_eq!(size_label(4 << 20), "4 MiB");
        assert_eq!(size_label(1536 << 10), "1536 KiB");
    }

    #[test]
    fn a_large_message_is_written_and_read_in_place_on_the_heap() {
        // 4 MiB: a value of this type on a test thread's 2 MiB stack would
        // overflow it; through references it never is one.
        const W: usize = (4 << 20) / 8;
        let mut words = vec![0u64; W].into_boxed_slice();
        let m: &mut [u64; W] = (&mut *words).try_into().unwrap();
        fill(m, 3, 4);
        assert_eq!(read(m), (3, 4));
        let mut raw = Box::<[u64]>::new_uninit_slice(W);
        let m: &mut [MaybeUninit<u64>; W] = (&mut *raw).try_into().unwrap();
        // SAFETY: [MaybeUninit<u64>; W] and MaybeUninit<[u64; W]> have the
        // same layout.
        let m = unsafe { &mut *(m as *mut [MaybeUninit<u64>; W]).cast::<MaybeUninit<[u64; W]>>() };
        fill_uninit(m, 5, 6);
        // SAFETY: fill_uninit initialised every word.
        let m = unsafe { m.assume_init_ref() };
        assert_eq!(read(m), (5, 6));
    }

    #[test]
    fn every_size_has_its_word_count() -> anyhow::Result<()> {
        for size in SIZES {
            let words = with_words!(size, W => W);
            assert_eq!(words * 8, size);
        }
        Ok(())
    }
}
