//! The benchmarks run end to end on the real kernel (tiny sizes: this
//! checks that every mechanism delivers and is counted, not speed).

use std::path::Path;
use std::time::Duration;

use check::bench::{self, Mechanism, WakeOptions};

#[test]
fn wake_bench_measures_every_mechanism() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = WakeOptions::new(dir.path());
    o.samples = 100;
    o.rounds = 2;
    o.priority = None; // keep the test process's policy
    o.dma_latency = dir.path().join("no-dma-latency");
    let r = bench::wake(&o).unwrap();
    assert!(
        r.settings.cpu_dma_latency.starts_with("not held"),
        "{}",
        r.settings.cpu_dma_latency
    );
    // Every mechanism, then the one-word reference again (the A/A floor).
    assert_eq!(r.results.len(), Mechanism::ALL.len() + 1);
    assert_eq!(r.results.last().unwrap().mechanism, "io_uring_shared (A/A)");
    for (res, m) in r.results.iter().zip(Mechanism::ALL) {
        assert_eq!(res.mechanism, m.short());
        if let Some(why) = &res.skipped {
            println!("{} skipped: {why}", res.mechanism);
            continue;
        }
        assert_eq!(res.count, 100, "{}", res.mechanism);
        assert!(res.min_ns <= res.p50_ns && res.p50_ns <= res.p99_ns && res.p99_ns <= res.max_ns);
        assert!(res.min_ns > 0, "{}: a wake cannot take 0ns", res.mechanism);
    }
    let table = r.table();
    assert!(table.contains("io_uring-futex") && table.contains("signalfd"));
    assert!(table.contains("doorbell backends"));
    // A ratio to the reference for every other mechanism measured, with
    // the A/A floor beside it.
    let measured = r.results.iter().filter(|x| x.skipped.is_none()).count();
    assert_eq!(r.ratios.len(), measured - 2, "{:?}", r.ratios);
    for ratio in &r.ratios {
        assert_eq!(ratio.denominator, "io_uring_shared");
        assert!(ratio.aa.is_some() && ratio.median > 0.0, "{ratio:?}");
    }
    assert!(
        table.contains("wake p50: doorbell / io_uring_shared"),
        "{table}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["results"][0]["mechanism"], "doorbell");
    assert_eq!(json["results"][3]["mechanism"], "io_uring_shared");
    assert_eq!(json["results"][4]["mechanism"], "futex");
}

#[test]
fn publish_and_throughput_benches_count() {
    let dir = tempfile::tempdir().unwrap();
    let p = bench::publish(dir.path(), Path::new("/proc"), 64, 20_000, 0).unwrap();
    assert_eq!(p.no_waiter.publishes, 20_000);
    assert_eq!(
        p.no_waiter.wake_syscalls, 0,
        "no subscriber waits, no wake syscall"
    );
    assert!(p.with_waiter.is_none());
    let t = bench::throughput(
        dir.path(),
        Path::new("/proc"),
        64,
        1,
        Duration::from_millis(50),
        None,
    )
    .unwrap();
    assert!(t.messages > 0 && t.messages_per_second > 0.0);
    println!("{}{}", p.table(), t.table());
}

#[test]
fn copy_and_loan_send_and_receive_every_message_of_both_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let opts = bench::CopyLoanOptions {
        rounds: 2,
        samples: 3,
    };
    let r = bench::copy_and_loan(dir.path(), Path::new("/proc"), &opts).unwrap();
    let sizes: Vec<usize> = r.sizes.iter().map(|s| s.bytes).collect();
    assert_eq!(sizes, bench::COPY_LOAN_SIZES);
    assert_eq!(sizes, [64, 1 << 20]);
    for s in &r.sizes {
        assert_eq!(s.samples, 6, "{} B: rounds x samples", s.bytes);
        assert!(s.per_sample >= 1);
        assert_eq!(
            s.bad_reads, 0,
            "{} B: every message read back as sent",
            s.bytes
        );
        assert_eq!(s.loans_staged, 0, "{} B: no reader in the way", s.bytes);
        for t in [
            s.memcpy,
            s.write,
            s.copy_send,
            s.copy_receive,
            s.loan_send,
            s.loan_receive,
        ] {
            assert!(
                t.median_ns > 0.0 && t.median_ns <= t.p90_ns,
                "{} B: {t:?}",
                s.bytes
            );
        }
    }
    // The channel directory is gone with the benchmark.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let table = r.table();
    assert!(
        table.contains("1 MiB message") && table.contains("loan: send"),
        "{table}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["sizes"][1]["bytes"], 1 << 20);
    assert!(json["sizes"][0]["loan_receive_per_memcpy"].is_number());
    println!("{table}");
}

#[test]
fn a_held_fanout_delivers_every_message_whole_to_every_subscriber() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench::FanoutOptions {
        bytes: 256 << 10,
        subscribers: 3,
        messages: 20,
        rounds: 2,
        period: Duration::from_millis(5),
        // The same tmpfs as a fourth arm: whatever it gives, the arm runs.
        huge_shm: Some(dir.path().to_path_buf()),
    };
    let r = bench::fanout(dir.path(), Path::new("/proc"), &o).unwrap();
    assert_eq!(r.bad_lines, 0, "every line read as written");
    assert_eq!(r.lost, 0, "a message per 5 ms: no subscriber falls behind");
    let huge = r.huge.as_ref().unwrap();
    assert!(r.huge_ratio.is_some() && r.huge_kib_seen.is_some());
    for arm in [&r.channel, &r.reference, &r.reference_again, huge] {
        assert_eq!(arm.rounds.len(), 2);
        assert!(
            arm.rounds.iter().all(|c| c.is_some_and(|ns| ns > 0.0)),
            "{arm:?}"
        );
    }
    let ratio = r.ratio.as_ref().unwrap();
    assert_eq!(ratio.per_round.len(), 2);
    assert!(ratio.aa.is_some());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let table = r.table();
    assert!(
        table.contains("256 KiB message by loan to 3 subscribers"),
        "{table}"
    );
    println!("{table}");
}
