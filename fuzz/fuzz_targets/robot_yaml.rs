//! robot.yaml parsing and validation never panic, whatever the bytes, and
//! every refusal names a place in the file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // YAML breaks lines at LF, CRLF and a lone CR.
    let lines = text.replace("\r\n", "\n").replace('\r', "\n").lines().count().max(1);
    match deploy::config::load_str(Path::new("robot.yaml"), text.to_string()) {
        Ok(loaded) => {
            // A valid description plans without panicking.
            let _ = deploy::cmd::plan::plan(&loaded.robot);
            // (an error here is allowed: a plan can refuse, never panic)
        }
        Err(deploy::config::ConfigLoadError::Invalid { diagnostics, .. }) => {
            assert!(!diagnostics.is_empty());
            for d in diagnostics {
                assert!(d.line >= 1 && d.line <= lines + 1, "line {} of {lines}: {d}", d.line);
                assert!(d.column >= 1);
            }
        }
        Err(e) => panic!("unexpected error kind: {e}"),
    }
});
