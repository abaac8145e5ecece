//! Frames: a typed header and a payload of a size decided at run time in
//! one message, for images, point clouds and maps.
//!
//! A frame of header `H` is `H` at offset 0, then the payload from
//! [`frame_offset::<H>()`](frame_offset) (`size_of::<H>()` rounded up to a
//! cache line, so that the payload starts on one, as the slot does). The
//! message's size is that offset plus the payload's length. A channel of
//! frames records `H` with a frame mark in its layout hash: a process
//! that opens it for plain `H` messages (or frames of another header) is
//! refused, as for any other type.

#![allow(unsafe_code)]

use crate::shm::{layout_hash_mix, ShmSafe, TypeName};

use super::owner::ChannelAttachError;
use super::publish::{ByteLoan, PublishError, Published, Publisher};
use super::{Channel, Held};

/// Mixed into a header's layout hash for a channel of frames.
const FRAME_MARK: u64 = 0x6672_616d_6573_0001; // "frames", 1

/// Where a frame's payload starts: the header's size rounded up to 64.
pub const fn frame_offset<H: ShmSafe>() -> usize {
    std::mem::size_of::<H>().div_ceil(64) * 64
}

impl Channel {
    /// Records frames of header `H` as this channel's messages, or checks
    /// them against what is recorded (see [`Channel::bind_type`]).
    pub fn bind_frames<H: ShmSafe>(&self) -> Result<(), ChannelAttachError> {
        self.bind_recorded_type(
            &TypeName::frame(H::TYPE_NAME),
            frame_offset::<H>() as u64,
            std::mem::align_of::<H>() as u64,
            layout_hash_mix(H::LAYOUT_HASH, FRAME_MARK),
        )
    }
}

/// A frame being written in place ([`Publisher::loan_frame`]): the header
/// and the payload, both in the publisher's scratch slot.
pub struct FrameLoan<'a, H: ShmSafe> {
    bytes: ByteLoan<'a>,
    _header: std::marker::PhantomData<fn(&H)>,
}

impl<H: ShmSafe> FrameLoan<'_, H> {
    /// The header and the payload, to write (both start as whatever the
    /// slot held: write every field and every byte that counts).
    pub fn parts(&mut self) -> (&mut H, &mut [u8]) {
        let (head, payload) = self.bytes.split_at_mut(frame_offset::<H>());
        // SAFETY: `head` is at least size_of::<H>() bytes at the start of
        // the loan, which is 64-byte aligned in the slot and 8-aligned in
        // the staging buffer (H is at most 8-aligned: checked in
        // `loan_frame`); any bit pattern is a valid H (ShmSafe); the
        // reference borrows the loan mutably.
        let h = unsafe { &mut *(head.as_mut_ptr() as *mut H) };
        (h, payload)
    }

    /// Whether it is written in place (see [`super::Loan::in_place`]).
    pub fn in_place(&self) -> bool {
        self.bytes.in_place()
    }

    /// Publishes the frame.
    pub fn send(self) -> Result<Published, PublishError> {
        self.bytes.send()
    }
}

impl Publisher {
    /// Lends the scratch slot for a frame of header `H` and `len` payload
    /// bytes (see [`Publisher::loan_bytes`]); fails when it does not fit.
    pub fn loan_frame<H: ShmSafe>(&mut self, len: usize) -> Result<FrameLoan<'_, H>, PublishError> {
        const {
            assert!(
                std::mem::align_of::<H>() <= 8,
                "frame headers are at most 8-aligned"
            )
        };
        let total = frame_offset::<H>().saturating_add(len);
        Ok(FrameLoan {
            bytes: self.loan_bytes(total)?,
            _header: std::marker::PhantomData,
        })
    }
}

impl Held {
    /// The held message as a frame of header `H` (see the module's text):
    /// `None` when it is shorter than a header.
    pub fn frame<H: ShmSafe>(&self) -> Option<(&H, &[u8])> {
        let b = self.bytes();
        if b.len() < frame_offset::<H>() || (b.as_ptr() as usize) % std::mem::align_of::<H>() != 0 {
            return None;
        }
        let (head, payload) = b.split_at(frame_offset::<H>());
        // SAFETY: `head` holds at least size_of::<H>() bytes, aligned for
        // H (checked); any bit pattern is a valid H (ShmSafe); borrowed
        // from `self` like `bytes`.
        let h = unsafe { &*(head.as_ptr() as *const H) };
        Some((h, payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::ChannelGeometry;
    use std::path::Path;

    crate::shm_struct! {
        #[derive(Debug, PartialEq)]
        struct Image {
            width: u32,
            height: u32,
            stamp: u64,
        }
    }

    #[test]
    fn a_frame_is_a_typed_header_and_a_payload_of_any_length_in_one_slot() {
        let dir = tempfile::tempdir().unwrap();
        let g = ChannelGeometry::new(64 + 3 * 640 * 480, 2, 1).with_holds(1);
        let proc = Path::new("/proc");
        let (ch, _) = Channel::create(dir.path(), "/cam", &g, None, proc).unwrap();
        ch.bind_frames::<Image>().unwrap();
        assert!(
            ch.bind_type::<Image>().is_err(),
            "plain Image messages refused"
        );
        let mut p = ch.publisher(proc).unwrap();
        let mut sub = ch.subscriber(proc).unwrap();
        sub.claim_holds(1, proc).unwrap();
        for (n, (w, h)) in [(640u32, 480u32), (320, 240)].into_iter().enumerate() {
            let len = 3 * (w * h) as usize;
            let mut loan = p.loan_frame::<Image>(len).unwrap();
            assert!(loan.in_place());
            let (head, pixels) = loan.parts();
            *head = Image {
                width: w,
                height: h,
                stamp: n as u64,
            };
            assert_eq!(pixels.len(), len);
            pixels.fill(n as u8 + 1);
            loan.send().unwrap();
            let held = sub.hold_next().unwrap().unwrap();
            let (head, pixels) = held.frame::<Image>().unwrap();
            assert_eq!(head.width, w);
            assert_eq!(head.stamp, n as u64);
            assert_eq!(pixels.len(), len);
            assert_eq!(pixels.as_ptr() as usize % 64, 0, "payload on a cache line");
            assert!(pixels.iter().all(|&b| b == n as u8 + 1));
        }
        assert!(matches!(
            p.loan_frame::<Image>(3 * 640 * 480 + 1),
            Err(PublishError::TooLarge { .. })
        ));
    }
}
