//! A C program that knows only `rtdeploy.h` (`tests/c/pubsub.c`), linked
//! against `librtdeploy.a` and against `librtdeploy.so`, sends and receives
//! messages of a type a Rust process also uses: to itself, to a Rust
//! reader, and from a Rust publisher, every sequence number checked. A
//! sender of another layout under the same channel is refused naming both
//! types.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use controller::shm::TypeRecord;
use controller::{Channel, ChannelGeometry};

controller::shm_struct! {
    /// The Rust examples' message (`controller/examples/common`).
    pub struct Chatter {
        pub seq: u64,
        pub deadline_ns: u64,
    }
}

const CHANNEL: &str = "/demo/chatter";

/// Where cargo put the library: this test's `deps` directory.
fn lib_dir() -> PathBuf {
    // cargo builds the library's static and shared forms into `deps`
    // for the tests (it copies them up a level only for `cargo build`).
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().to_path_buf()
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Builds `tests/c/pubsub.c` into `dir`, against the static library
/// (`shared`: the shared one); the warnings of `-Wall -Wextra -pedantic`
/// are errors.
fn build(dir: &Path, shared: bool) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join(if shared { "pubsub-shared" } else { "pubsub" });
    let mut c = Command::new(cc());
    c.args([
        "-std=c11",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        "-I",
    ])
    .arg(root.join("include"))
    .arg(root.join("tests/c/pubsub.c"))
    .arg("-o")
    .arg(&out);
    if shared {
        c.arg(format!("-L{}", lib_dir().display()))
            .arg("-lrtdeploy")
            .arg(format!("-Wl,-rpath,{}", lib_dir().display()));
    } else {
        // A Rust static library needs these of the C library's.
        c.arg(lib_dir().join("librtdeploy.a")).args([
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-lc",
        ]);
    }
    let o = c.output().expect("a C compiler (cc, or $CC)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// A channel directory with the chatter channel, its type bound from Rust.
fn channel(dir: &Path, depth: u64) -> Channel {
    let (ch, _) = Channel::create(
        dir,
        CHANNEL,
        &ChannelGeometry::new(64, depth, 4),
        None,
        Path::new("/proc"),
    )
    .unwrap();
    ch.bind_type::<Chatter>().unwrap();
    ch
}

fn pubsub(bin: &Path, mode: &str, shm: &Path, count: u64) -> Command {
    let t = TypeRecord::of::<Chatter>();
    let mut c = Command::new(bin);
    c.arg(mode)
        .arg(shm)
        .arg(t.name.as_str())
        .arg(format!("{:#x}", t.layout_hash))
        .arg(count.to_string())
        // Not under a supervisor: none of its environment.
        .env_remove("RTDEPLOY_SHM_DIR")
        .env_remove("RTDEPLOY_PROCESS");
    c
}

fn run(mut c: Command) -> String {
    let o = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{}\n{text}", o.status);
    text
}

#[test]
fn a_c_program_sends_and_receives_through_the_header_alone() {
    let dir = tempfile::tempdir().unwrap();
    for shared in [false, true] {
        let bin = build(dir.path(), shared);
        let shm = tempfile::tempdir().unwrap();
        let _ch = channel(shm.path(), 1024);
        let out = run(pubsub(&bin, "self", shm.path(), 1000));
        eprintln!("{out}");
        assert!(
            out.contains("sent 1000, received 1000 of 1000, out of order 0"),
            "{out}"
        );
        // The other layout is refused, both types named.
        let wrong = out.lines().find(|l| l.starts_with("wrong type:")).unwrap();
        assert!(wrong.starts_with("wrong type: RTD_ERR_TYPE: "), "{wrong}");
        assert!(
            wrong.contains("Chatter") && wrong.contains("Swapped"),
            "{wrong}"
        );
        assert!(
            out.contains("null sender: RTD_ERR_ARGUMENT: the sender is NULL"),
            "{out}"
        );
        assert!(out.contains("fetched latest seq 999"), "{out}");
        // The loop's timing report: its sender and its watcher.
        assert!(
            out.contains("report /demo/chatter kind 2 total 1000 errors 0"),
            "{out}"
        );
        assert!(
            out.contains("report /demo/chatter kind 0 total 1000"),
            "{out}"
        );
    }
}

#[test]
fn a_rust_reader_gets_every_message_a_c_talker_sends() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build(dir.path(), false);
    let shm = tempfile::tempdir().unwrap();
    let ch = channel(shm.path(), 1024);
    let mut sub = ch.subscriber(Path::new("/proc")).unwrap();
    let out = run(pubsub(&bin, "talk", shm.path(), 500));
    assert!(out.contains("sent 500, received 0 of 0"), "{out}");
    let mut seqs = Vec::new();
    while let Some(m) = sub.next_message().unwrap() {
        let c: Chatter = m.value().expect("a Chatter");
        seqs.push(c.seq);
    }
    assert_eq!(seqs, (0..500).collect::<Vec<u64>>());
}

#[test]
fn a_c_listener_gets_every_message_a_rust_publisher_sends() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build(dir.path(), false);
    let shm = tempfile::tempdir().unwrap();
    let ch = channel(shm.path(), 1024);
    let mut child = pubsub(&bin, "listen", shm.path(), 300)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Publish once the listener's watcher is set up ("ready").
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let until = Instant::now() + Duration::from_secs(30);
    for l in lines.by_ref() {
        if l.unwrap() == "ready" {
            break;
        }
        assert!(Instant::now() < until, "the C listener never got ready");
    }
    let mut publisher = ch.publisher(Path::new("/proc")).unwrap();
    for seq in 0..300u64 {
        publisher
            .publish_value(&Chatter {
                seq,
                deadline_ns: 0,
            })
            .unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    let text = rest.join("\n");
    assert!(status.success(), "{status}\n{text}");
    assert!(
        text.contains("sent 0, received 300 of 300, out of order 0"),
        "{text}"
    );
}
