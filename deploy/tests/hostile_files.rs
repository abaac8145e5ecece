//! Files from outside the process, tried as a hostile or careless peer
//! would, through the real binary under an address-space limit and a
//! watchdog (see `bounded`): MCAP logs whose chunks expand a
//! thousandfold or whose CRC does not match, FIFOs and devices where a
//! regular file is expected, a sysroot whose /proc and /sys files are
//! FIFOs or never end, a boot-check history of two million bad lines.
//! Each is refused or read within its bounds, with an error that says
//! what and where.

mod bounded;
mod mcap_bytes;

use std::fs;
use std::path::{Path, PathBuf};

use mcap_bytes::{json_messages, message, Mcap};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, bytes).unwrap();
    p
}

/// A small chunk of ten messages, then chunks of 4 MiB of one message
/// repeated (a few hundred bytes each, compressed): what their chunks
/// expand to passes [`logbook::read::MAX_EXPANSION`] times the file
/// within a few chunks. Read without the bound, the file is 256 MiB of
/// messages.
fn expanding_file() -> Vec<u8> {
    let mut m = Mcap::new("/bomb");
    m.chunk(
        &json_messages(0, 10, 1_000_000_000),
        3,
        None,
        (1_000_000_000, 1_009_000_000),
    );
    let one = message(
        10,
        2_000_000_000,
        format!("{{\"pad\":\"{}\"}}", "x".repeat(1000)).as_bytes(),
    );
    let records = one.repeat((4 << 20) / one.len());
    for _ in 0..64 {
        m.chunk(&records, 3, None, (2_000_000_000, 2_000_000_000));
    }
    m.finish()
}

#[test]
fn chunks_that_expand_a_thousandfold_are_read_up_to_the_bound_and_no_further() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = expanding_file();
    let size = bytes.len() as u64;
    assert!(size < 200_000, "{size} bytes");
    let file = write(dir.path(), "bomb.mcap", &bytes);
    let bound = logbook::read::MAX_EXPANSION * size + logbook::read::EXPANSION_FLOOR;

    let info = bounded::deploy(&["--json", "log", "info", s(&file)]);
    info.assert_exit(0);
    let doc: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let state = doc["state"].as_str().unwrap();
    assert!(
        state.starts_with("cut short: chunk ")
            && state.contains("would take what the chunks expand to past"),
        "{state}"
    );
    let decompressed = doc["file"]["decompressed"].as_u64().unwrap();
    assert!(decompressed <= bound, "{decompressed} > {bound}");
    let messages = doc["file"]["messages"].as_u64().unwrap();
    assert!(messages > 10, "the chunks within the bound are read");
    eprintln!(
        "{size}-byte file: {messages} messages, {decompressed} bytes decompressed (bound {bound})"
    );

    // The messages are written as they are read: the JSON document and
    // the text both come out whole, with what the bound let through.
    let cat = bounded::deploy(&["--json", "log", "cat", s(&file)]);
    cat.assert_exit(0);
    let doc: serde_json::Value = serde_json::from_slice(&cat.stdout).unwrap();
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(doc["messages"].as_array().unwrap().len() as u64, messages);
    assert_eq!(doc["messages"][3]["value"]["v"], 3);
    assert!(doc["state"]
        .as_str()
        .unwrap()
        .starts_with("cut short: chunk "));
    let text = bounded::deploy(&["log", "cat", s(&file)]);
    text.assert_exit(0);
    assert_eq!(text.stdout_text().lines().count() as u64, messages);
    assert!(
        text.stderr
            .contains("would take what the chunks expand to past"),
        "{}",
        text.stderr
    );
    // --limit stops reading, not only printing.
    let few = bounded::deploy(&["log", "cat", "--limit", "5", s(&file)]);
    few.assert_exit(0);
    assert_eq!(few.stdout_text().lines().count(), 5);
}

#[test]
fn a_chunk_whose_crc_does_not_match_is_named_and_none_of_its_values_printed() {
    let dir = tempfile::tempdir().unwrap();
    for level in [3, 0] {
        let mut m = Mcap::new("/v");
        m.chunk(&json_messages(0, 10, 1_000_000_000), level, None, (1, 2));
        let before = m.bytes.len();
        m.chunk(
            &json_messages(10, 10, 1_000_000_000),
            level,
            Some(0xdead_beef),
            (3, 4),
        );
        m.chunk(&json_messages(20, 10, 1_000_000_000), level, None, (5, 6));
        let file = write(dir.path(), &format!("crc{level}.mcap"), &m.finish());
        let cat = bounded::deploy(&["log", "cat", s(&file)]);
        cat.assert_exit(0);
        let values: Vec<String> = cat
            .stdout_text()
            .lines()
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
            .collect();
        let want: Vec<String> = (0..10).map(|i| format!("{{\"v\":{i}}}")).collect();
        assert_eq!(values, want, "only the first chunk's values");
        let named = format!("chunk 2 (at byte {before}): its records' CRC is 0x");
        assert!(cat.stderr.contains(&named), "{named} in {}", cat.stderr);
        assert!(
            cat.stderr
                .contains("its header says 0xdeadbeef: the chunk is damaged"),
            "{}",
            cat.stderr
        );
        let info = bounded::deploy(&["--json", "log", "info", s(&file)]);
        info.assert_exit(0);
        let doc: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
        assert_eq!(doc["file"]["chunks"], 1);
        assert_eq!(doc["file"]["messages"], 10);
    }
}

#[test]
fn fifos_and_devices_where_a_file_is_expected_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    bounded::mkfifo(&fifo);
    let prefix = dir.path().join("robot");
    fs::create_dir_all(&prefix).unwrap();
    let f = s(&fifo);
    for (args, what) in [
        (vec!["log", "info", "/dev/zero"], "a character device"),
        (vec!["log", "info", f], "a FIFO"),
        (vec!["log", "cat", f], "a FIFO"),
        (
            vec!["log", "export", f, "--out", "/nonexistent/x"],
            "a FIFO",
        ),
        (
            vec!["--prefix", s(&prefix), "replay", "--force", f],
            "a FIFO",
        ),
        (vec!["trace", "show", f], "a FIFO"),
        (vec!["trace", "show", "/dev/zero"], "a character device"),
    ] {
        let run = bounded::deploy(&args);
        let path = if what == "a FIFO" { f } else { "/dev/zero" };
        run.assert_refused(&format!("{path}: {what}, not a regular file"));
    }
}

#[test]
fn replay_says_a_channel_is_missing_before_reading_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("robot");
    fs::create_dir_all(prefix.join("dev/shm/rtdeploy")).unwrap();
    // The missing channel's messages come first, the expanding chunks
    // after: the answer comes at the first message.
    let file = write(dir.path(), "r.mcap", &expanding_file());
    let run = bounded::deploy(&["--prefix", s(&prefix), "replay", "--force", s(&file)]);
    run.assert_refused("channel /bomb: ");
}

/// A sysroot for `top --once`: this machine's CPUs, and every file top
/// reads a FIFO nobody writes.
fn fifo_sysroot() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let cpu = root.join("sys/devices/system/cpu/cpu0/cpufreq");
    let zone = root.join("sys/class/thermal/thermal_zone0");
    fs::create_dir_all(&cpu).unwrap();
    fs::create_dir_all(&zone).unwrap();
    fs::create_dir_all(root.join("proc")).unwrap();
    fs::write(zone.join("type"), "cpu-thermal\n").unwrap();
    for p in [
        root.join("proc/stat"),
        root.join("proc/interrupts"),
        cpu.join("scaling_cur_freq"),
        zone.join("temp"),
        zone.join("trip_point_0_temp"),
    ] {
        bounded::mkfifo(&p);
    }
    fs::write(zone.join("trip_point_0_type"), "passive\n").unwrap();
    d
}

#[test]
fn top_once_returns_with_notes_when_its_proc_and_sys_files_are_fifos() {
    let sysroot = fifo_sysroot();
    let prefix = tempfile::tempdir().unwrap();
    let run = bounded::deploy(&[
        "--prefix",
        s(prefix.path()),
        "--sysroot",
        s(sysroot.path()),
        "--json",
        "top",
        "--once",
        "--interval",
        "100ms",
    ]);
    // No supervisor here: exit 2, with a frame all the same.
    run.assert_exit(2);
    let f: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let notes = f["notes"].to_string();
    for file in ["proc/stat", "proc/interrupts"] {
        assert!(
            notes.contains(&format!("{file} is a FIFO, not a regular file")),
            "{file}: {notes}"
        );
    }
    let cpu0 = &f["cpus"][0];
    assert!(cpu0["freq_mhz"].is_null(), "{cpu0}");
    let zone = &f["thermal"][0];
    assert!(zone["temp_c"].is_null(), "{zone}");
}

/// A copy of the captured Orin Nano tree (cpusets/fixtures).
fn orin_tree() -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let dst = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &dst);
            } else if e.file_name() != ".keep" {
                fs::copy(e.path(), &dst).unwrap();
            }
        }
    }
    let t = tempfile::tempdir().unwrap();
    copy(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../cpusets/fixtures/orin-nano-5.15"),
        t.path(),
    );
    t
}

#[test]
fn verify_refuses_proc_interrupts_that_never_ends_or_is_a_fifo() {
    let yaml = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/orin-nano.yaml");
    let prefix = tempfile::tempdir().unwrap();
    // A baseline: the captured tree verifies (in sync or drift) within the
    // same limit.
    let t = orin_tree();
    let args = |root: &Path| {
        vec![
            "--sysroot".to_string(),
            s(root).to_string(),
            "--prefix".into(),
            s(prefix.path()).into(),
            "-c".into(),
            s(&yaml).into(),
            "verify".into(),
            "--window-ms".into(),
            "0".into(),
        ]
    };
    let a = args(t.path());
    let run = bounded::deploy(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        matches!(run.code, Some(0 | 1)) && !run.killed,
        "baseline: {run:?}"
    );
    let interrupts = t.path().join("proc/interrupts");
    fs::remove_file(&interrupts).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &interrupts).unwrap();
    let run = bounded::deploy(&a.iter().map(String::as_str).collect::<Vec<_>>());
    run.assert_refused(&format!(
        "{}: holds more than 4194304 bytes, the most read from it",
        interrupts.display()
    ));
    fs::remove_file(&interrupts).unwrap();
    bounded::mkfifo(&interrupts);
    let run = bounded::deploy(&a.iter().map(String::as_str).collect::<Vec<_>>());
    run.assert_refused(&format!(
        "{}: a FIFO, not a regular file",
        interrupts.display()
    ));
}

#[test]
fn two_million_bad_history_lines_give_twenty_notes_and_a_count() {
    let prefix = tempfile::tempdir().unwrap();
    let path = prefix
        .path()
        .join("var/lib/rtdeploy/boot-check-history.jsonl");
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, "x\n".repeat(2_000_000)).unwrap();
    let p = s(prefix.path());
    let text = bounded::deploy(&["--prefix", p, "check", "--history"]);
    text.assert_exit(0);
    let out = text.stdout_text();
    assert_eq!(out.matches("note: line ").count(), 20, "{out}");
    assert!(
        out.contains(
            "note: 1999980 more line(s) skipped or figures dropped (the first 20 are listed)"
        ),
        "{out}"
    );
    assert!(out.len() < 8 << 10, "{} bytes", out.len());
    let json = bounded::deploy(&["--prefix", p, "--json", "check", "--history"]);
    json.assert_exit(0);
    assert!(json.stdout.len() < 8 << 10, "{} bytes", json.stdout.len());
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["notes"].as_array().unwrap().len(), 20);
    assert_eq!(doc["skipped"], 2_000_000);
}
