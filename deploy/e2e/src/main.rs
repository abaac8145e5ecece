//! rtdeploy's end-to-end tests, host side: builds what a board would get,
//! boots it under QEMU and checks what the guest reports against the plan,
//! reading our formats through our own types (`deploy plan --json` as
//! `deploy::cmd::plan::Plan`, `deploy status --json` as
//! `services::status::SupervisorStatus`, durations with `units::Dur`).
//! Only the guests' init scripts are shell (`scripts/e2e/`).
//!
//! Run as root on Debian 12 (CI does): `cargo run -p e2e -- x86-64`.
//! Every assertion prints PASS, FAIL or SKIP (with why it cannot run).
//! Exit status: 0 when none failed, 1 when one did, 2 on a setup error.

mod aarch64;
mod capture;
mod checks;
mod guest;
mod host;
mod qemu;
mod report;
mod ssh;
mod x86;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "rtdeploy's end-to-end tests under QEMU")]
struct Args {
    #[command(subcommand)]
    run: Run,
}

#[derive(Subcommand)]
enum Run {
    /// An image built by `deploy image` boots Debian's PREEMPT_RT kernel
    /// (x86_64, TCG, 4 CPUs) with the supervisor as PID 1: four boots
    /// (the kernel probed; the image; the image with io_uring and
    /// futex_waitv denied; the image on a 5.10 PREEMPT_RT kernel).
    X86_64(x86::Options),
    /// The image on the aarch64 `virt` machine along the real boot path:
    /// U-Boot, extlinux.conf, Debian's arm64 PREEMPT_RT kernel, systemd;
    /// field and system updates over ssh, the runtime's suites and the
    /// wake census in the guest, the fallback labels, a broken disk.
    Aarch64(aarch64::Options),
    /// Boots the x86 probe guest and captures the /proc and /sys files
    /// `deploy verify` reads, laid out like /, for `--sysroot` tests.
    CaptureFixture(capture::Options),
}

/// Settings every run shares, from the environment CI and the README use.
pub struct Env {
    /// The repository (the source tree built and the guest scripts).
    pub repo: PathBuf,
    /// Fetched kernels and bases, keyed by content (`RTDEPLOY_CACHE`).
    pub cache: PathBuf,
    /// The cargo target directory of the guest builds (`E2E_TARGET_DIR`).
    pub target_dir: PathBuf,
    /// Keep the work directory (`E2E_KEEP=1`).
    pub keep: bool,
}

impl Env {
    fn from_env() -> Env {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .canonicalize()
            .unwrap_or_else(|_| PathBuf::from("."));
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let cache = var(units::env::CACHE).unwrap_or_else(|| repo.join(".cache"));
        let target_dir = var("E2E_TARGET_DIR").unwrap_or_else(|| repo.join("target-e2e"));
        Env {
            keep: std::env::var("E2E_KEEP").as_deref() == Ok("1"),
            repo,
            cache,
            target_dir,
        }
    }

    /// A new work directory under /tmp, removed at the end unless kept.
    pub fn work_dir(&self, name: &str) -> std::io::Result<tempfile::TempDir> {
        let mut d = tempfile::Builder::new().prefix(name).tempdir_in("/tmp")?;
        if self.keep {
            d.disable_cleanup(true);
            say(format!("work directory kept: {}", d.path().display()));
        }
        Ok(d)
    }
}

/// Runs `body` in a new work directory (see [`Env::work_dir`]); exit
/// status 2 when there is none.
pub fn in_work_dir(env: &Env, name: &str, body: impl FnOnce(&std::path::Path) -> u8) -> u8 {
    match env.work_dir(name) {
        Ok(w) => body(w.path()),
        Err(e) => {
            say(format!("no work directory: {e}"));
            2
        }
    }
}

/// A progress line on standard error: `[e2e HH:MM:SS] ...`.
pub fn say(msg: impl AsRef<str>) {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        % 86400;
    eprintln!(
        "[e2e {:02}:{:02}:{:02}] {}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        msg.as_ref()
    );
}

fn main() -> ExitCode {
    let args = Args::parse();
    let env = Env::from_env();
    let code = match args.run {
        Run::X86_64(o) => x86::run(&env, &o),
        Run::Aarch64(o) => aarch64::run(&env, &o),
        Run::CaptureFixture(o) => capture::run(&env, &o),
    };
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use deploy::cmd::plan::{plan, Plan};

    /// The plans the end-to-end tests read back: what `deploy plan --json`
    /// prints reads as a `Plan` and prints the same again, for each example
    /// robot they boot.
    #[test]
    fn the_plan_json_of_each_booted_example_reads_back_as_the_same_plan() {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for example in [
            "examples/qemu.yaml",
            "examples/qemu-aarch64.yaml",
            "examples/dev.yaml",
        ] {
            let loaded = services::robot::load(&repo.join(example)).expect(example);
            let p = plan(&loaded.robot).expect(example);
            let text = serde_json::to_string(&p).unwrap();
            let back: Plan = serde_json::from_str(&text).expect(example);
            assert_eq!(serde_json::to_string(&back).unwrap(), text, "{example}");
            assert!(!back.cmdline.line.is_empty(), "{example}");
        }
    }
}
