//! The seed corpus of the `channel_read` fuzz target, run as a test: each
//! seed (scribbled index, ring, waiter count, scratch slot, truncation,
//! raw header) goes through the target's body, which asserts that readers
//! settle and never panic. The fuzzer itself runs by hand
//! (`cargo fuzz run channel_read fuzz/seeds/channel_read`).

#[path = "../../fuzz/fuzz_targets/channel_body.rs"]
mod channel_body;

#[test]
fn the_channel_seed_corpus_runs_clean() {
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/channel_read");
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    for e in std::fs::read_dir(&seeds).unwrap() {
        let e = e.unwrap();
        let data = std::fs::read(e.path()).unwrap();
        println!("seed {}", e.file_name().to_string_lossy());
        channel_body::run(dir.path(), &data);
        n += 1;
    }
    assert!(n >= 8, "only {n} seeds in {}", seeds.display());
}
