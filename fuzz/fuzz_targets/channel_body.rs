//! The body of the `channel_read` fuzz target, shared with the test that
//! runs its seed corpus (`controller/tests/fuzz_seeds.rs`): a channel file
//! whose bytes another process scribbled on must never make a reader, a
//! publisher or an opener hang, panic or touch memory out of bounds.
//!
//! Input: byte 0 picks the case and the geometry; the rest is a list of
//! 10-byte writes (`offset` as u16 in units of 8 bytes, then a u64 value,
//! little endian) applied to a freshly made channel file after a few
//! publishes. Case bit 0x80: the whole input after byte 0 is the file
//! (the opener's validation). Case bit 0x40: the file is then truncated to
//! half its size under the open mappings.

use std::os::unix::fs::FileExt;
use std::path::Path;

use controller::channel::{Channel, ChannelGeometry};

/// Reads or publishes at most this many times per call: a correct
/// runtime returns `None` or an error long before.
const MAX_STEPS: usize = 10_000;

pub fn run(dir: &Path, data: &[u8]) {
    let Some((&case, rest)) = data.split_first() else {
        return;
    };
    let proc_root = Path::new("/proc");
    let name = "/fuzz";
    let path = controller::channel::channel_path(dir, name);
    let _ = std::fs::remove_file(&path);
    if case & 0x80 != 0 {
        if std::fs::write(&path, rest).is_err() {
            return;
        }
        if let Ok(ch) = Channel::open(dir, name) {
            exercise(&ch, proc_root);
        }
        let _ = std::fs::remove_file(&path);
        return;
    }
    let geom = ChannelGeometry::new(
        8 + 8 * u64::from(case & 0x7),
        2 << ((case >> 3) & 0x3),
        1 + u32::from((case >> 5) & 0x1),
    )
    .with_subscribers(2);
    let Ok((ch, _)) = Channel::create(dir, name, &geom, None, proc_root) else {
        return;
    };
    let mut sub = ch.subscriber(proc_root).ok();
    if let Ok(mut p) = ch.publisher(proc_root) {
        for i in 0..3u64 {
            let _ = p.publish_value(&i);
        }
    }
    let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else {
        return;
    };
    let len = geom.total_bytes();
    for w in rest.chunks_exact(10) {
        let off = u64::from(u16::from_le_bytes([w[0], w[1]])) * 8 % len;
        let v = u64::from_le_bytes(w[2..10].try_into().unwrap());
        let _ = file.write_all_at(&v.to_le_bytes(), off);
    }
    if case & 0x40 != 0 {
        let _ = file.set_len(len / 2);
    }
    if let Some(s) = sub.as_mut() {
        drain(s);
    }
    exercise(&ch, proc_root);
    drop(sub);
    let _ = std::fs::remove_file(&path);
}

fn drain(s: &mut controller::Subscriber) {
    for step in 0.. {
        assert!(step < MAX_STEPS, "next_meta did not settle");
        match s.next_meta() {
            Ok(Some(m)) => {
                assert!(m.size <= s.channel().geometry().max_payload() as usize);
            }
            Ok(None) => break,
            Err(controller::channel::ChannelFault::Truncated) => break,
            Err(_) => {}
        }
    }
}

fn exercise(ch: &Channel, proc_root: &Path) {
    let mut r = ch.reader();
    let _ = r.latest_meta();
    drain(&mut r);
    if let Ok(mut s) = ch.subscriber(proc_root) {
        // A wait on whatever the word holds now returns at once or after
        // its timeout, never later.
        s.wait(Some(std::time::Duration::from_millis(1)));
        drain(&mut s);
    }
    if let Ok(mut p) = ch.publisher(proc_root) {
        for i in 0..4u64 {
            let _ = p.publish_value(&i);
        }
    }
    let _ = ch.recover(proc_root);
    let _ = ch.check_slot_ownership();
}
