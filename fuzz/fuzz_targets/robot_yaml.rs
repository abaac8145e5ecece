//! robot.yaml parsing and validation never panic, whatever the bytes, and
//! every refusal names a place in the file, in a bounded report: at most
//! `MAX_DIAGNOSTICS` (and one line counting the rest), each one line of
//! bounded length without control characters.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

/// The most characters of a diagnostic's field or message: cut to
/// `MAX_MESSAGE_CHARS` and a marker, each character escaped in at most 10
/// (`\u{10ffff}`).
const MAX_SHOWN_CHARS: usize = 10 * services::robot::MAX_MESSAGE_CHARS + 64;

fuzz_target!(|data: &[u8]| {
    // YAML breaks lines at LF, CRLF and a lone CR.
    let breaks = data
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b == b'\n' || (b == b'\r' && data.get(i + 1) != Some(&b'\n')))
        .count();
    let lines = breaks + 1;
    match services::robot::load_bytes(Path::new("robot.yaml"), data.to_vec()) {
        Ok(loaded) => {
            // A valid description plans without panicking.
            let _ = deploy::cmd::plan::plan(&loaded.robot);
            // (an error here is allowed: a plan can refuse, never panic)
        }
        Err(services::robot::RobotLoadError::Invalid { diagnostics, .. }) => {
            assert!(!diagnostics.is_empty());
            assert!(diagnostics.len() <= services::robot::MAX_DIAGNOSTICS + 1);
            for d in diagnostics {
                assert!(
                    d.line >= 1 && d.line <= lines,
                    "line {} of {lines}: {d}",
                    d.line
                );
                assert!(d.column >= 1);
                for text in [&d.field, &d.message] {
                    assert!(!text.chars().any(char::is_control), "{d}");
                    assert!(text.chars().count() <= MAX_SHOWN_CHARS, "{d}");
                }
            }
        }
        Err(e) => panic!("unexpected error kind: {e}"),
    }
});
