//! The logger's cost at a fixed message rate: a publisher sends 16-byte
//! messages (a sequence number and a time, as the examples do) at 100k
//! messages a second for a few seconds on a channel the logger records;
//! prints the logger thread's CPU time per second of recording (the share
//! of one CPU it takes at that rate), bytes per message on disk and what
//! was lost.
//!
//! `cargo bench -p logbook` (or `... -- RATE SECONDS`); `--json` for one
//! JSON line.

use std::path::Path;
use std::time::{Duration, Instant};

use controller::{Channel, ChannelGeometry};
use logbook::schema::TypeDecl;
use logbook::{LogSection, Recorder, RecorderConfig};
use units::duration::Dur;

controller::shm_struct! {
    pub struct Sample {
        pub seq: u64,
        pub time_ns: u64,
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let json = args.iter().any(|a| a == "--json");
    let nums: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let rate = nums.first().copied().unwrap_or(100_000).max(1000);
    let secs = nums.get(1).copied().unwrap_or(5).max(1);
    let shm = tempfile::tempdir().unwrap();
    // The logs go to the disk this runs on, as on a robot.
    let out = tempfile::tempdir_in(
        std::env::var_os("CARGO_TARGET_TMPDIR").unwrap_or_else(|| std::env::temp_dir().into()),
    )
    .unwrap();
    // 100 ms of retention at the rate.
    let geom = ChannelGeometry::new(16, (rate / 10).next_power_of_two(), 2);
    let (ch, _) =
        Channel::create(shm.path(), "/bench/sample", &geom, None, Path::new("/proc")).unwrap();
    ch.bind_type::<Sample>().unwrap();
    let section = LogSection {
        types: [(
            "/bench/sample".to_string(),
            TypeDecl {
                name: "bench/Sample".into(),
                fields: vec!["uint64 seq".into(), "uint64 time_ns".into()],
            },
        )]
        .into(),
        poll: Dur::from_millis(10),
        ..LogSection::default()
    };
    let rec = Recorder::start(RecorderConfig {
        section,
        dir: out.path().to_path_buf(),
        shm_dir: shm.path().to_path_buf(),
        channels: vec!["/bench/sample".into()],
        boot_id: String::new(),
        cpus: units::cpu::CpuSet::new(),
        from_oldest: true,
    })
    .unwrap();
    let mut p = ch.publisher(Path::new("/proc")).unwrap();
    let batch = rate / 1000;
    let start = Instant::now();
    let mut sent = 0u64;
    let mut next = start;
    while start.elapsed() < Duration::from_secs(secs) {
        for _ in 0..batch {
            p.publish_value(&Sample {
                seq: sent,
                time_ns: controller::Monotonic::now().as_nanos(),
            })
            .unwrap();
            sent += 1;
        }
        next += Duration::from_millis(1);
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    let wall = start.elapsed().as_secs_f64();
    // Let the logger catch up, then finish the file.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let s = rec.status();
        let c = s.channels.get("/bench/sample").cloned().unwrap_or_default();
        if c.logged + c.gaps >= sent {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = rec.stop();
    let c = st
        .channels
        .get("/bench/sample")
        .cloned()
        .unwrap_or_default();
    let bytes: u64 = logbook::recorder::list_files(out.path())
        .iter()
        .map(|f| f.1)
        .sum();
    let cpu_share = st.cpu_ns as f64 / 1e9 / wall;
    let per_msg = bytes as f64 / c.logged.max(1) as f64;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "rate": rate, "seconds": wall, "sent": sent, "logged": c.logged, "lost": c.gaps,
                "logger_cpu_ns": st.cpu_ns, "logger_cpu_share": cpu_share,
                "bytes": bytes, "bytes_per_message": per_msg,
            })
        );
    } else {
        println!(
            "logger at {rate} messages/s for {wall:.1}s: {sent} sent, {} logged, {} lost; logger CPU {:.1}% of one CPU ({:.1} ms per 100k messages); {bytes} bytes on disk, {per_msg:.2} bytes/message (16-byte payload, zstd)",
            c.logged,
            c.gaps,
            cpu_share * 100.0,
            st.cpu_ns as f64 / 1e6 / (c.logged.max(1) as f64 / 1e5),
        );
    }
}
