//! The body of the `mcap_read` fuzz target, shared with the test that
//! runs its seed corpus (`services/logbook/tests/fuzz_seeds.rs`): whatever
//! the bytes, the MCAP reader returns (never panics), holds and does no
//! more than its bounds allow, and says why it stopped in one short line.
//!
//! Input: the bytes of a file, read as `deploy log cat` reads one: every
//! message handed on and decoded (ros2msg/cdr, json, timing reports), the
//! earliest log time taken from the chunk headers.

use std::path::Path;

use logbook::read::{first_log_time, scan, EXPANSION_FLOOR, MAX_EXPANSION};

/// The longest reason for stopping accepted, in characters: one line
/// naming a chunk and a few figures (the reader cuts at 600 and adds
/// `...`).
pub const MAX_REASON: usize = 603;

/// The smallest message record: opcode, length, channel, sequence, two
/// times.
const MIN_MESSAGE: u64 = 9 + 2 + 4 + 8 + 8;

pub fn run(data: &[u8]) {
    let path = Path::new("fuzz.mcap");
    let _ = first_log_time(path, data);
    let mut seen = 0u64;
    let mut bytes = 0u64;
    let r = scan(path, data, |m| {
        seen += 1;
        bytes += m.data.len() as u64;
        let _ = m.channel.decode(m.data);
        let _ = m.channel.payload(m.data);
        let _ = m.channel.recorded_type();
    });
    let Ok(sum) = r else {
        return;
    };
    // What the chunks expanded to is bounded by the input's size.
    let bound = MAX_EXPANSION * data.len() as u64 + EXPANSION_FLOOR;
    assert!(
        sum.decompressed <= bound,
        "{} bytes decompressed from {}",
        sum.decompressed,
        data.len()
    );
    // So is the number of messages (each is a record of 31 bytes or more,
    // in the file or in a chunk).
    assert_eq!(seen, sum.messages);
    assert!(
        seen <= (data.len() as u64 + sum.decompressed) / MIN_MESSAGE,
        "{seen} messages from {} bytes",
        data.len()
    );
    assert!(bytes <= data.len() as u64 + sum.decompressed);
    assert!(sum.size <= data.len() as u64);
    if let Some(why) = &sum.truncated {
        let n = why.chars().count();
        assert!(n <= MAX_REASON, "{n} characters: {why:.200}");
        assert!(!why.chars().any(char::is_control), "{why}");
    }
}
