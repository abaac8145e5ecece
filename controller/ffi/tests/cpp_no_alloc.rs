//! A C++ handler loop allocates nothing in the runtime: `tests/cpp/no_alloc.cpp`
//! (`rtdeploy.hpp`, built with `-fno-exceptions`) runs a phased loop that
//! sends by loan and copy and a watcher that fetches and reads its context,
//! every handler under the allocation trap, with `rtdeploy_malloc_trap.c`
//! linked so that C++'s `new` is seen too: 0 allocations counted; the same
//! loop whose watcher does `new int` counts one per message (the trap sees
//! C++); one that makes a `std::vector` with the trap set to abort is
//! stopped with the trap's line.

use std::path::{Path, PathBuf};
use std::process::Command;

use controller::{Channel, ChannelGeometry};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn lib_dir() -> PathBuf {
    // cargo builds the library's static and shared forms into `deps`
    // for the tests (it copies them up a level only for `cargo build`).
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().to_path_buf()
}

fn build(dir: &Path) -> PathBuf {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let trap = dir.join("trap.o");
    let o = Command::new(&cc)
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-c", "-I"])
        .arg(root().join("include"))
        .arg(root().join("include/rtdeploy_malloc_trap.c"))
        .arg("-o")
        .arg(&trap)
        .output()
        .unwrap_or_else(|e| panic!("{cc}: {e}"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bin = dir.join("no_alloc");
    let o = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fno-exceptions",
            "-I",
        ])
        .arg(root().join("include"))
        .arg(root().join("tests/cpp/no_alloc.cpp"))
        .arg(&trap)
        .arg(lib_dir().join("librtdeploy.a"))
        .args([
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-o",
        ])
        .arg(&bin)
        .output()
        .unwrap_or_else(|e| panic!("{cxx}: {e}"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    bin
}

fn run(bin: &Path, mode: &str, n: u64) -> std::process::Output {
    let shm = tempfile::tempdir().unwrap();
    Channel::create(
        shm.path(),
        "/na/cpp",
        &ChannelGeometry::new(64, 1024, 2),
        None,
        Path::new("/proc"),
    )
    .unwrap();
    Command::new(bin)
        .arg(mode)
        .arg(shm.path())
        .arg(n.to_string())
        .env_remove("RTDEPLOY_SHM_DIR")
        .env_remove("RTDEPLOY_PROCESS")
        .output()
        .unwrap()
}

#[test]
fn a_cpp_handler_loop_allocates_nothing_and_the_trap_sees_cpp() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build(dir.path());
    let o = run(&bin, "count", 2000);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.starts_with("sent 2000, received 2000, allocations 0 "),
        "{out}"
    );
    // The control: `new int` in the watcher, once per message.
    let o = run(&bin, "control", 500);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.starts_with("sent 500, received 500, allocations 500 "),
        "{out}"
    );
    // Abort: the first allocation in a handler stops the process, said.
    let o = run(&bin, "abort", 100);
    let err = String::from_utf8_lossy(&o.stderr);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        o.status.signal(),
        Some(libc_sigabrt()),
        "{:?} {err}",
        o.status
    );
    assert!(
        err.contains("rtdeploy: heap allocation in a real-time section"),
        "{err}"
    );
}

/// SIGABRT (6 on Linux).
fn libc_sigabrt() -> i32 {
    6
}
