//! `deploy`: one command for rtdeploy on the build host and on the robot.
//!
//! This binary only parses arguments, composes the library crates and
//! prints; the work lives in `controller`, `check`, `cpusets`, `services`,
//! `releases` and `rootfs`.
//! Exit codes everywhere: 0 ok, 1 a check/verify/budget failed, 2 error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use deploy::cmd;
use deploy::ctx::{Ctx, Exit};

/// Real-time robot controllers on embedded Linux, from one robot.yaml.
#[derive(Debug, Parser)]
#[command(name = "deploy", version, max_term_width = 100)]
struct Cli {
    /// Put every on-robot path (/etc/rtdeploy, /opt/rtdeploy, /run/rtdeploy,
    /// /var/lib/rtdeploy, /var/log/rtdeploy, /dev/shm/rtdeploy) under DIR.
    #[arg(long, global = true, value_name = "DIR", default_value = "/")]
    prefix: PathBuf,

    /// Read and write DIR/proc and DIR/sys instead of /proc and /sys.
    #[arg(long, global = true, value_name = "DIR", default_value = "/")]
    sysroot: PathBuf,

    /// robot.yaml [default: <prefix>/etc/rtdeploy/robot.yaml]
    #[arg(
        short,
        long,
        global = true,
        value_name = "FILE",
        env = units::env::CONFIG
    )]
    config: Option<PathBuf>,

    /// Print one JSON document (with "schema_version") on stdout, nothing else.
    #[arg(long, global = true)]
    json: bool,

    /// Quieter: no progress, no notes on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,

    /// More detail on stderr (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The first run: the example robot (examples/first-run.yaml) under a
    /// directory of its own for a bounded time, as any user, then its
    /// status, timing and log (exit 0 ran, 1 a process failed, 2 could
    /// not run).
    Demo(cmd::demo::DemoArgs),
    /// Simulation: the robot.yaml processes, the real binaries, on one
    /// virtual clock, deterministically and as fast as they run (exit 0
    /// ran to its end, 1 stopped early or a process failed, 2 could not
    /// start).
    Sim(cmd::sim::SimArgs),
    /// robot.yaml: validate it (exit 0 valid, 2 invalid).
    #[command(subcommand)]
    Config(cmd::config::ConfigCommand),
    /// Show the plan: CPU map, kernel command line, IRQ/thread/process
    /// placement, channel sizes.
    Plan(cmd::plan::PlanArgs),
    /// Apply the CPU plan: IRQ affinities, IRQ-thread priorities, sysctls,
    /// cgroup cpusets, cpufreq (exit 0 ok, 1 invalid partition, 2 error).
    Apply(cmd::apply::ApplyArgs),
    /// Check the live system against the CPU plan (exit 0 in sync, 1
    /// drift, 2 error).
    Verify(cmd::verify::VerifyArgs),
    /// Build a reproducible root filesystem image with the controller
    /// installed (tar, tar.zst, ext4, cpio.gz).
    Image(cmd::image::ImageArgs),
    /// Flash an image onto a Jetson board in recovery mode, with Jetson
    /// Linux's own flashing script (--dry-run prints its commands).
    Flash(cmd::image::FlashArgs),
    /// Run the supervisor: CPU plan, channels, boot check, processes (also
    /// as PID 1, and under systemd).
    Supervise(cmd::supervise::SuperviseArgs),
    /// Per process: state, pid, restarts, the policy/priority/CPUs in
    /// force, last exit, wakeup figures, budget (exit 1 when one failed).
    Status(cmd::status::StatusArgs),
    /// The supervisor's metrics in the Prometheus text format (what it
    /// writes to robot.yaml's `metrics.textfile`).
    Metrics(cmd::metrics::MetricsArgs),
    /// Live view: processes' wakeups against their budgets, channels,
    /// CPUs (q quits, p pauses, s sorts, / filters; --once prints one frame).
    Top(cmd::top::TopArgs),
    /// Start a process the supervisor stopped or gave up on.
    Start(cmd::control::StartArgs),
    /// Stop a process (SIGTERM, then SIGKILL after its stop_timeout), or
    /// with --all every process and the supervisor.
    Stop(cmd::control::StopArgs),
    /// Stop and start a process.
    Restart(cmd::control::RestartArgs),
    /// A process's output (-f: follow).
    Logs(cmd::control::LogsArgs),
    /// Timing validation under load against the budgets of robot.yaml
    /// (exit 0 all met, 1 a budget failed, 2 could not run).
    Check(cmd::check::CheckArgs),
    /// Saved kernel traces of budget misses (`deploy check --trace`).
    #[command(subcommand)]
    Trace(cmd::trace::TraceCommand),
    /// The logger's MCAP files (robot.yaml `log:`): ls, info, cat, export.
    #[command(subcommand)]
    Log(cmd::log::LogCommand),
    /// Publish a log's messages onto the channels at their recorded
    /// spacing (refused while a supervisor runs, without --force).
    Replay(cmd::log::ReplayArgs),
    /// Message types for Rust, C (and C++) and Python from `.msg`
    /// descriptions, all carrying the layout hash a channel records.
    Gen(cmd::gen::GenArgs),
    /// Microbenchmarks of the runtime: wake latency per mechanism, publish
    /// cost, throughput (exit 0 ran, 2 could not run).
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Make an ed25519 key pair for signing bundles (KEY, KEY.pub).
    Keygen(cmd::keygen::KeygenArgs),
    /// Write a signed release bundle from a release directory.
    Bundle(cmd::bundle::BundleArgs),
    /// Install a signed bundle on this robot, in trial (exit 0 installed,
    /// 2 refused).
    Install(cmd::install::InstallArgs),
    /// The releases on this robot: current, previous, trial, committed.
    Releases(cmd::release::ReleasesArgs),
    /// Go back to the previous release (ends a trial).
    Rollback(cmd::release::RollbackArgs),
    /// Mark the release in trial good (the supervisor does this by itself).
    Commit(cmd::release::CommitArgs),
    /// Reboot this robot when a release asked for it (a system update, or
    /// its rollback): exit 0 rebooting, 1 nothing asked, 2 refused.
    Reboot(cmd::release::RebootArgs),
    /// Send a bundle to robots over ssh and install it (exit 1 if any
    /// robot failed).
    Update(cmd::update::UpdateArgs),
    /// The robot's end of `deploy update` (speaks on stdin/stdout).
    #[command(name = "serve-update", hide = true)]
    ServeUpdate(cmd::install::ServeUpdateArgs),
    /// Our Mender update module: one state of Mender's update module
    /// protocol (v3) for this artifact's work directory (exit 0 done, 1
    /// the trial was rolled back, 2 refused or error).
    #[command(name = "mender-module", hide = true)]
    MenderModule(cmd::mender::MenderModuleArgs),
    /// The check's worker processes (started by `deploy check` itself).
    #[command(name = "__check-worker", hide = true)]
    CheckWorker(cmd::check::CheckWorkerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config_path = cli
        .config
        .clone()
        .unwrap_or_else(|| releases::Layout::new(&cli.prefix).config_link());
    let ctx = Ctx {
        prefix: cli.prefix.clone(),
        sysroot: cli.sysroot.clone(),
        config_path,
        json: cli.json,
        quiet: cli.quiet,
        verbose: cli.verbose,
    };
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(&ctx, a),
        Command::Sim(a) => cmd::sim::run(&ctx, a),
        Command::Config(c) => cmd::config::run(&ctx, c),
        Command::Plan(a) => cmd::plan::run(&ctx, a),
        Command::Image(a) => cmd::image::run(&ctx, a),
        Command::Flash(a) => cmd::image::run_flash(&ctx, a),
        Command::Apply(a) => cmd::apply::run(&ctx, a),
        Command::Verify(a) => cmd::verify::run(&ctx, a),
        Command::Supervise(a) => cmd::supervise::run(&ctx, a),
        Command::Status(a) => cmd::status::run(&ctx, a),
        Command::Metrics(a) => cmd::metrics::run(&ctx, a),
        Command::Top(a) => cmd::top::run(&ctx, a),
        Command::Start(a) => cmd::control::run_start(&ctx, a),
        Command::Stop(a) => cmd::control::run_stop(&ctx, a),
        Command::Restart(a) => cmd::control::run_restart(&ctx, a),
        Command::Logs(a) => cmd::control::run_logs(&ctx, a),
        Command::Check(a) => cmd::check::run(&ctx, a),
        Command::Bench(c) => cmd::bench::run(&ctx, c),
        Command::Gen(a) => cmd::gen::run(&ctx, a),
        Command::Trace(c) => cmd::trace::run(&ctx, c),
        Command::Log(c) => cmd::log::run(&ctx, c),
        Command::Replay(a) => cmd::log::run_replay(&ctx, a),
        Command::CheckWorker(a) => cmd::check::run_worker(a),
        Command::Keygen(a) => cmd::keygen::run(&ctx, a),
        Command::Bundle(a) => cmd::bundle::run(&ctx, a),
        Command::Install(a) => cmd::install::run(&ctx, a),
        Command::Releases(a) => cmd::release::run_releases(&ctx, a),
        Command::Rollback(a) => cmd::release::run_rollback(&ctx, a),
        Command::Reboot(a) => cmd::release::run_reboot(&ctx, a),
        Command::Commit(a) => cmd::release::run_commit(&ctx, a),
        Command::Update(a) => cmd::update::run(&ctx, a),
        Command::ServeUpdate(a) => cmd::install::run_serve(&ctx, a),
        Command::MenderModule(a) => cmd::mender::run(&ctx, a),
    };
    match result {
        Ok(exit) => ExitCode::from(exit.code()),
        Err(err) => {
            eprintln!("deploy: {}", chain_message(&err));
            ExitCode::from(Exit::Error.code())
        }
    }
}

/// `<what failed>: <why>`, each link of the chain once. A library error
/// whose message already shows its source (and also returns it from
/// `source()`) would otherwise print that cause twice, as `{err:#}` does;
/// a link whose text is already in the message is left out.
fn chain_message(err: &anyhow::Error) -> String {
    let mut message = String::new();
    for link in err.chain() {
        let text = link.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::chain_message;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {path}: {source}")]
    struct ShowsItsSource {
        path: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::from_raw_os_error(2);
        let err = anyhow::Error::new(ShowsItsSource {
            path: "a",
            source: io,
        })
        .context("cannot build b");
        assert_eq!(
            chain_message(&err),
            "cannot build b: cannot read a: No such file or directory (os error 2)"
        );
        // A source its parent does not show is still printed.
        let err = anyhow::Error::new(std::io::Error::from_raw_os_error(13))
            .context("cannot open c")
            .context("cannot install d");
        assert_eq!(
            chain_message(&err),
            "cannot install d: cannot open c: Permission denied (os error 13)"
        );
    }
}
