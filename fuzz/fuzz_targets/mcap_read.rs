//! MCAP files with arbitrary bytes: the reader (`deploy log info|cat`,
//! replay, export) returns, within its bounds on what chunks expand to
//! and what it holds, and says why it stopped in one short line (see
//! `mcap_body.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "mcap_body.rs"]
mod mcap_body;

fuzz_target!(|data: &[u8]| {
    mcap_body::run(data);
});
