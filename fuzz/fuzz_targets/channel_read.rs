//! Channel files with arbitrary contents: readers, publishers and openers
//! return errors, never hang or panic (see `channel_body.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "channel_body.rs"]
mod channel_body;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("rtdeploy-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    channel_body::run(&dir, data);
});
