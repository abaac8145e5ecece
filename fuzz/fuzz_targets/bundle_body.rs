//! The body of the `bundle_read` fuzz target, shared with the test that
//! runs its seed corpus (`services/releases/tests/fuzz_seeds.rs`):
//! whatever the bytes, the bundle reader returns (never panics), gives a
//! sink no more of a blob than its signed manifest size, and refuses with
//! an error that is one short line (names cut and escaped).
//!
//! Input: the bytes of a bundle. The reader trusts the key made from
//! [`KEY_SEED`] for robot `arm` on board `generic`, so a seed bundle signed
//! with it takes the fuzzer past the signature into the blob phase.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{self, Read};
use std::sync::OnceLock;

use releases::bundle::{load_trusted_keys, BundleReader, Compat, SecretKey, TrustedKeys};

/// The signing key of the seed bundles (test material, not a real key).
pub const KEY_SEED: [u8; 32] = [0x5e; 32];
pub const ROBOT: &str = "arm";
pub const BOARD: &str = "generic";
/// The longest error accepted: a line with at most a few names, each cut
/// to 100 characters (up to 10 bytes each once escaped).
pub const MAX_ERROR: usize = 4096;

fn trust() -> &'static (TrustedKeys, Compat) {
    static T: OnceLock<(TrustedKeys, Compat)> = OnceLock::new();
    T.get_or_init(|| {
        let public = SecretKey::from_seed(KEY_SEED).public_base64();
        let keys = load_trusted_keys(std::path::Path::new("/nonexistent"), &[public])
            .expect("a valid key");
        let compat = Compat {
            robot: ROBOT.into(),
            board: BOARD.into(),
        };
        (keys, compat)
    })
}

fn check_error(e: &dyn std::error::Error) {
    let s = e.to_string();
    assert!(s.len() <= MAX_ERROR, "an error of {} bytes", s.len());
    assert!(
        !s.chars().any(char::is_control),
        "control characters: {s:?}"
    );
}

/// Reads `data` as a robot installing it and as a sender would; panics
/// on a broken rule. Returns whether the robot accepted it.
pub fn run(data: &[u8]) -> bool {
    let (keys, compat) = trust();
    let sizes = RefCell::new(BTreeMap::new());
    let mut fed = 0u64;
    let r = BundleReader::read(
        data,
        keys,
        compat,
        |v| {
            *sizes.borrow_mut() = v.manifest.blobs().into_iter().collect();
            Ok(())
        },
        |sha, d| {
            let size = sizes.borrow()[sha];
            // Try to read past the size: the reader must stop at it.
            let n = io::copy(&mut d.take(size.saturating_add(1)), &mut io::sink())?;
            assert!(n <= size, "blob {sha}: {n} bytes fed, manifest says {size}");
            fed += n;
            Ok(())
        },
    );
    let sizes = sizes.into_inner();
    let accepted = match &r {
        Ok(_) => {
            assert_eq!(fed, sizes.values().sum::<u64>(), "every blob whole");
            true
        }
        Err(e) => {
            check_error(e);
            false
        }
    };
    match BundleReader::read_manifest(data) {
        Ok((m, sig)) => assert!(m.len() <= 16 << 20 && sig.len() <= 64),
        Err(e) => check_error(&e),
    }
    if accepted {
        // The sender's reader on a bundle the robot accepts.
        let mut n = 0;
        BundleReader::for_each_blob(data, |_, _| {
            n += 1;
            Ok(())
        })
        .expect("a bundle the robot accepts streams");
        assert_eq!(n, sizes.len());
    }
    accepted
}
