//! The bare futex pair the comparisons measure against: `FUTEX_WAKE` and
//! `FUTEX_WAIT` on the low 32 bits of a shared `AtomicU64`, with nothing
//! around them (no channel, no waiter count, no event loop). The `futex`
//! mechanism of `deploy bench wake` and the peers benchmark's floor use
//! it. They are the calls the runtime wakes through ([`units::futex`]).

pub use units::futex::{low_word_ptr, wait, wake_all};
