//! What flashing relies on in a built image: an extlinux.conf the Jetson
//! boot loader (L4TLauncher) reads as rtdeploy wrote it. A base whose
//! extlinux.conf leaves no room for the fallback label, or uses a line the
//! boot loader skips, builds nothing.

mod common;

use std::fs;

use common::{leftovers, no_progress, Inputs};
use rootfs::{build, Format};

fn with_extlinux(conf: &str) -> (tempfile::TempDir, Inputs) {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    fs::write(t.path().join("base/boot/extlinux/extlinux.conf"), conf).unwrap();
    (t, inputs)
}

/// Ten entries: the most L4TLauncher keeps (MAX_EXTLINUX_OPTIONS), so the
/// fallback label would be an eleventh.
#[test]
fn ten_entries_leave_no_room_for_the_fallback_and_nothing_is_written() {
    let mut conf = String::from("TIMEOUT 30\nDEFAULT primary\n");
    for name in [
        "primary", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9",
    ] {
        conf.push_str(&format!(
            "\nLABEL {name}\n      LINUX /boot/Image\n      APPEND ${{cbootargs}}\n"
        ));
    }
    let (t, inputs) = with_extlinux(&conf);
    let out = t.path().join("robot.tar");
    let e = build(&inputs.spec(), &out, Format::Tar, &mut no_progress())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the fallback label `rtdeploy-original` would be entry 11 of extlinux.conf, over the 10 the boot loader (L4TLauncher) keeps"),
        "{e}"
    );
    assert!(!out.exists());
    assert!(leftovers(t.path()).is_empty(), "{:?}", leftovers(t.path()));
}

#[test]
fn a_kernel_line_is_refused_and_nothing_is_written() {
    let (t, inputs) = with_extlinux(
        "TIMEOUT 30\nDEFAULT primary\n\nLABEL primary\n      KERNEL /boot/Image\n      APPEND ${cbootargs}\n",
    );
    let out = t.path().join("robot.tar");
    let e = build(&inputs.spec(), &out, Format::Tar, &mut no_progress())
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not read KERNEL"), "{e}");
    assert!(!out.exists());
    assert!(leftovers(t.path()).is_empty(), "{:?}", leftovers(t.path()));
}
