//! SHA-256 of two messages at once.
//!
//! With the SHA extensions of x86_64, a SHA-256 block is a chain of 32
//! `sha256rnds2`, each waiting for the one before: one message keeps the
//! unit busy a third of the time or less. Two messages interleaved fill
//! the gaps, so the per-file digests of an image cost little more than
//! half as much CPU time. Elsewhere (no SHA extensions, aarch64), each
//! message goes through `sha2` on its own, with the same results.
//!
//! A [`Lane`] is one message's running digest. [`update_pair`] feeds two
//! lanes; [`Lane::update`] one.

#![allow(unsafe_code)]

use sha2::digest::consts::U64;
use sha2::digest::generic_array::GenericArray;

const BLOCK: usize = 64;

const H0: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// One message's running SHA-256.
#[derive(Clone)]
pub struct Lane {
    state: [u32; 8],
    /// The start of a block not yet complete.
    tail: [u8; BLOCK],
    tail_len: usize,
    /// Bytes fed so far.
    len: u64,
}

impl Default for Lane {
    fn default() -> Self {
        Lane::new()
    }
}

impl Lane {
    pub fn new() -> Lane {
        Lane {
            state: H0,
            tail: [0; BLOCK],
            tail_len: 0,
            len: 0,
        }
    }

    /// Completes the partial block from the front of `data`; returns what
    /// is left, whose whole blocks go next (the tail is then empty) or, if
    /// `data` ran out first, nothing.
    fn top_up<'d>(&mut self, data: &'d [u8]) -> &'d [u8] {
        self.len += data.len() as u64;
        if self.tail_len == 0 {
            return data;
        }
        let n = (BLOCK - self.tail_len).min(data.len());
        self.tail[self.tail_len..self.tail_len + n].copy_from_slice(&data[..n]);
        self.tail_len += n;
        if self.tail_len == BLOCK {
            let block = self.tail;
            compress1(&mut self.state, &block);
            self.tail_len = 0;
        }
        &data[n..]
    }

    /// Compresses the whole blocks of `rest` (what `top_up` left) and
    /// keeps the bytes after them for later (none: a partial block that
    /// `top_up` did not complete stays).
    fn absorb(&mut self, rest: &[u8]) {
        let whole = rest.len() / BLOCK * BLOCK;
        compress1(&mut self.state, &rest[..whole]);
        let tail = &rest[whole..];
        if tail.is_empty() {
            return;
        }
        debug_assert!(self.tail_len == 0);
        self.tail[..tail.len()].copy_from_slice(tail);
        self.tail_len = tail.len();
    }

    /// Feeds `data` to this lane alone.
    pub fn update(&mut self, data: &[u8]) {
        let rest = self.top_up(data);
        self.absorb(rest);
    }

    /// The padding: 0x80, zeros, the length in bits, so that the message
    /// ends on a block boundary (one or two blocks).
    fn padding(&self) -> ([u8; 2 * BLOCK], usize) {
        let mut pad = [0u8; 2 * BLOCK];
        pad[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
        pad[self.tail_len] = 0x80;
        let blocks = if self.tail_len < BLOCK - 8 { 1 } else { 2 };
        let end = blocks * BLOCK;
        pad[end - 8..end].copy_from_slice(&(self.len * 8).to_be_bytes());
        (pad, end)
    }

    fn digest(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&w.to_be_bytes());
        }
        out
    }

    /// The digest of everything fed.
    pub fn finish(mut self) -> [u8; 32] {
        let (pad, end) = self.padding();
        compress1(&mut self.state, &pad[..end]);
        self.digest()
    }
}

/// Feeds `da` to `a` and `db` to `b`, the whole blocks both have side by
/// side.
pub fn update_pair(a: &mut Lane, da: &[u8], b: &mut Lane, db: &[u8]) {
    let ra = a.top_up(da);
    let rb = b.top_up(db);
    let both = ra.len().min(rb.len()) / BLOCK * BLOCK;
    compress2(&mut a.state, &ra[..both], &mut b.state, &rb[..both]);
    a.absorb(&ra[both..]);
    b.absorb(&rb[both..]);
}

/// The digests of two lanes, their last blocks side by side.
pub fn finish_pair(mut a: Lane, mut b: Lane) -> ([u8; 32], [u8; 32]) {
    let (pa, ea) = a.padding();
    let (pb, eb) = b.padding();
    let both = ea.min(eb);
    compress2(&mut a.state, &pa[..both], &mut b.state, &pb[..both]);
    compress1(&mut a.state, &pa[both..ea]);
    compress1(&mut b.state, &pb[both..eb]);
    (a.digest(), b.digest())
}

/// The SHA-256 digests of two whole messages.
pub fn digest_pair(a: &[u8], b: &[u8]) -> ([u8; 32], [u8; 32]) {
    let (mut la, mut lb) = (Lane::new(), Lane::new());
    update_pair(&mut la, a, &mut lb, b);
    finish_pair(la, lb)
}

/// The SHA-256 digest of one message.
pub fn digest(data: &[u8]) -> [u8; 32] {
    let mut l = Lane::new();
    l.update(data);
    l.finish()
}

/// Whole blocks of one message.
fn compress1(state: &mut [u32; 8], blocks: &[u8]) {
    debug_assert!(blocks.len() % BLOCK == 0);
    if blocks.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if ni::available() {
        // SAFETY: the CPU has the SHA extensions and SSE4.1 (checked).
        unsafe { ni::compress1(state, blocks) };
        return;
    }
    sha2::compress256(state, as_blocks(blocks));
}

/// `blocks` as sha2's blocks, without a copy.
fn as_blocks(blocks: &[u8]) -> &[GenericArray<u8, U64>] {
    debug_assert!(blocks.len() % BLOCK == 0);
    // SAFETY: GenericArray<u8, U64> is `repr(transparent)` over nested
    // `repr(C)` halves of u8, laid out as [u8; 64] (size 64, align 1, as
    // generic-array's own Deref relies on); the slice covers len / 64 such
    // arrays inside `blocks`, borrowed for as long.
    unsafe {
        std::slice::from_raw_parts(
            blocks.as_ptr().cast::<GenericArray<u8, U64>>(),
            blocks.len() / BLOCK,
        )
    }
}

/// Whole blocks of two messages, as many of each.
fn compress2(sa: &mut [u32; 8], a: &[u8], sb: &mut [u32; 8], b: &[u8]) {
    debug_assert!(a.len() == b.len() && a.len() % BLOCK == 0);
    if a.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if ni::available() {
        // SAFETY: the CPU has the SHA extensions and SSE4.1 (checked).
        unsafe { ni::compress2(sa, a, sb, b) };
        return;
    }
    compress1(sa, a);
    compress1(sb, b);
}

/// The SHA extensions (SHA-NI) of x86_64.
#[cfg(target_arch = "x86_64")]
mod ni {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// The round constants, four per group of four rounds.
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];

    pub fn available() -> bool {
        static HAVE: OnceLock<bool> = OnceLock::new();
        *HAVE.get_or_init(|| {
            is_x86_feature_detected!("sha")
                && is_x86_feature_detected!("sse4.1")
                && is_x86_feature_detected!("ssse3")
        })
    }

    /// The state as the instructions hold it: (ABEF, CDGH).
    #[inline(always)]
    unsafe fn load(state: &[u32; 8]) -> (__m128i, __m128i) {
        // SAFETY: unaligned loads of the 8 words of
        // `state`; register operations.
        unsafe {
            let dcba = _mm_loadu_si128(state.as_ptr().cast());
            let hgfe = _mm_loadu_si128(state.as_ptr().add(4).cast());
            let cdab = _mm_shuffle_epi32(dcba, 0xB1);
            let efgh = _mm_shuffle_epi32(hgfe, 0x1B);
            (
                _mm_alignr_epi8(cdab, efgh, 8),
                _mm_blend_epi16(efgh, cdab, 0xF0),
            )
        }
    }

    #[inline(always)]
    unsafe fn store(state: &mut [u32; 8], abef: __m128i, cdgh: __m128i) {
        // SAFETY: unaligned stores to the 8 words
        // of `state`; register operations.
        unsafe {
            let feba = _mm_shuffle_epi32(abef, 0x1B);
            let dchg = _mm_shuffle_epi32(cdgh, 0xB1);
            let dcba = _mm_blend_epi16(feba, dchg, 0xF0);
            let hgfe = _mm_alignr_epi8(dchg, feba, 8);
            _mm_storeu_si128(state.as_mut_ptr().cast(), dcba);
            _mm_storeu_si128(state.as_mut_ptr().add(4).cast(), hgfe);
        }
    }

    /// The block's 16 words, big-endian, four per register.
    #[inline(always)]
    unsafe fn words(block: *const u8) -> [__m128i; 4] {
        // SAFETY: the caller passes 64 readable
        // bytes; unaligned loads.
        unsafe {
            let swap = _mm_set_epi64x(0x0c0d_0e0f_0809_0a0b, 0x0405_0607_0001_0203);
            let w = |i: usize| _mm_shuffle_epi8(_mm_loadu_si128(block.add(16 * i).cast()), swap);
            [w(0), w(1), w(2), w(3)]
        }
    }

    /// `$body` for `g` from 0 to 15, written out: with each `g` a
    /// constant, the schedule's four registers stay registers.
    macro_rules! sixteen {
        (|$g:ident| $body:expr) => {{
            sixteen!(@ $g $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
        }};
        (@ $g:ident $body:expr; $($n:literal)*) => {{
            $({
                let $g: usize = $n;
                $body;
            })*
        }};
    }

    /// Rounds 4g to 4g + 3: the next four words of the schedule (from
    /// group 4 on), then two `sha256rnds2`.
    #[inline(always)]
    unsafe fn group(g: usize, w: &mut [__m128i; 4], abef: &mut __m128i, cdgh: &mut __m128i) {
        // SAFETY: register operations, and a load
        // of K[4g..4g + 4] (g < 16).
        unsafe {
            if g >= 4 {
                // W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16].
                let t = _mm_sha256msg1_epu32(w[g % 4], w[(g + 1) % 4]);
                let t = _mm_add_epi32(t, _mm_alignr_epi8(w[(g + 3) % 4], w[(g + 2) % 4], 4));
                w[g % 4] = _mm_sha256msg2_epu32(t, w[(g + 3) % 4]);
            }
            let k = _mm_loadu_si128(K.as_ptr().add(4 * g).cast());
            let msg = _mm_add_epi32(w[g % 4], k);
            *cdgh = _mm_sha256rnds2_epu32(*cdgh, *abef, msg);
            *abef = _mm_sha256rnds2_epu32(*abef, *cdgh, _mm_shuffle_epi32(msg, 0x0E));
        }
    }

    /// # Safety
    ///
    /// The CPU has the SHA extensions, SSSE3 and SSE4.1; `blocks` is whole
    /// blocks.
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    pub unsafe fn compress1(state: &mut [u32; 8], blocks: &[u8]) {
        // SAFETY: the caller's conditions; each
        // block pointer has 64 bytes behind it (chunks_exact).
        unsafe {
            let (mut abef, mut cdgh) = load(state);
            for block in blocks.chunks_exact(super::BLOCK) {
                let (abef0, cdgh0) = (abef, cdgh);
                let mut w = words(block.as_ptr());
                sixteen!(|g| group(g, &mut w, &mut abef, &mut cdgh));
                abef = _mm_add_epi32(abef, abef0);
                cdgh = _mm_add_epi32(cdgh, cdgh0);
            }
            store(state, abef, cdgh);
        }
    }

    /// # Safety
    ///
    /// As for [`compress1`]; `a` and `b` are as long.
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    pub unsafe fn compress2(sa: &mut [u32; 8], a: &[u8], sb: &mut [u32; 8], b: &[u8]) {
        // SAFETY: as in compress1, for both.
        unsafe {
            let (mut abef_a, mut cdgh_a) = load(sa);
            let (mut abef_b, mut cdgh_b) = load(sb);
            for (ba, bb) in a
                .chunks_exact(super::BLOCK)
                .zip(b.chunks_exact(super::BLOCK))
            {
                let (abef_a0, cdgh_a0) = (abef_a, cdgh_a);
                let (abef_b0, cdgh_b0) = (abef_b, cdgh_b);
                let mut wa = words(ba.as_ptr());
                let mut wb = words(bb.as_ptr());
                sixteen!(|g| {
                    group(g, &mut wa, &mut abef_a, &mut cdgh_a);
                    group(g, &mut wb, &mut abef_b, &mut cdgh_b);
                });
                abef_a = _mm_add_epi32(abef_a, abef_a0);
                cdgh_a = _mm_add_epi32(cdgh_a, cdgh_a0);
                abef_b = _mm_add_epi32(abef_b, abef_b0);
                cdgh_b = _mm_add_epi32(cdgh_b, cdgh_b0);
            }
            store(sa, abef_a, cdgh_a);
            store(sb, abef_b, cdgh_b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn reference(data: &[u8]) -> [u8; 32] {
        Sha256::digest(data).into()
    }

    /// sha2's block function, one block at a time, each through
    /// `GenericArray::from_slice` (no cast of ours).
    fn block_by_block(mut state: [u32; 8], blocks: &[u8]) -> [u32; 8] {
        for b in blocks.chunks_exact(BLOCK) {
            sha2::compress256(
                &mut state,
                std::slice::from_ref(GenericArray::from_slice(b)),
            );
        }
        state
    }

    #[test]
    fn known_answers() {
        assert_eq!(
            hex::encode(digest(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex::encode(digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn pairs_of_every_length_around_the_block_and_padding_edges() {
        let lengths: Vec<usize> = (0..=130)
            .chain([191, 192, 1000, 4095, 4096, 65537])
            .collect();
        for &la in &lengths {
            for &lb in [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 4096].iter() {
                let (a, b) = (bytes(la, la as u64), bytes(lb, 7 + lb as u64));
                let (da, db) = digest_pair(&a, &b);
                assert_eq!(da, reference(&a), "a: {la} bytes (b: {lb})");
                assert_eq!(db, reference(&b), "b: {lb} bytes (a: {la})");
                assert_eq!(digest(&a), reference(&a), "{la} bytes alone");
            }
        }
    }

    #[test]
    fn fed_in_pieces_of_any_size_alone_or_in_pairs() {
        let a = bytes(10_000, 1);
        let b = bytes(7_777, 2);
        for piece in [1, 3, 63, 64, 65, 1000, 4096] {
            let (mut la, mut lb) = (Lane::new(), Lane::new());
            let mut single = Lane::new();
            let (mut ca, mut cb) = (a.chunks(piece), b.chunks(piece + 5));
            loop {
                match (ca.next(), cb.next()) {
                    (None, None) => break,
                    (x, y) => {
                        let (x, y) = (x.unwrap_or(&[]), y.unwrap_or(&[]));
                        update_pair(&mut la, x, &mut lb, y);
                        single.update(x);
                    }
                }
            }
            let (da, db) = finish_pair(la, lb);
            assert_eq!(da, reference(&a), "pieces of {piece}");
            assert_eq!(db, reference(&b), "pieces of {}", piece + 5);
            assert_eq!(single.finish(), reference(&a), "alone, pieces of {piece}");
        }
    }

    /// The instructions' block functions against sha2's, on states that
    /// are not the initial one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_instructions_compute_what_the_portable_block_function_does() {
        if !ni::available() {
            eprintln!("skipping: no SHA extensions here");
            return;
        }
        let data = bytes(64 * 37, 5);
        let other = bytes(64 * 37, 6);
        let start = block_by_block(H0, &bytes(64, 9));
        let (mut a, mut b, mut c) = (start, H0, start);
        // SAFETY: the CPU has the SHA extensions (checked above); whole
        // blocks, as many in both.
        unsafe {
            ni::compress2(&mut a, &data, &mut b, &other);
            ni::compress1(&mut c, &data);
        }
        assert_eq!(a, block_by_block(start, &data));
        assert_eq!(b, block_by_block(H0, &other));
        assert_eq!(c, a);
    }

    #[test]
    fn the_blocks_cast_for_sha2_are_the_bytes_given() {
        let data = bytes(64 * 5, 3);
        let blocks = as_blocks(&data);
        assert_eq!(blocks.len(), 5);
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!(b.as_slice(), &data[64 * i..64 * (i + 1)]);
        }
        let mut state = H0;
        sha2::compress256(&mut state, blocks);
        assert_eq!(state, block_by_block(H0, &data));
    }
}
