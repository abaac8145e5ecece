//! Bundles with arbitrary bytes: the reader refuses them with a short
//! error, bounded, never panics, and never feeds a sink more of a blob
//! than its signed size (see `bundle_body.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "bundle_body.rs"]
mod bundle_body;

fuzz_target!(|data: &[u8]| {
    bundle_body::run(data);
});
