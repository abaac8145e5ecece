//! `deploy check`: timing validation of this board against the budgets of
//! robot.yaml, under the load the scenario describes (the engine is
//! the `check` crate; this module parses, composes and prints).
//!
//! Exit: 0 every budget met, 1 a budget failed (named in the output),
//! 2 could not run.
//!
//! Also the hidden `__check-worker` subcommand: the engine starts this
//! same binary for its worker processes, so one binary on the robot is
//! enough.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use check::{self, CheckEnv, Mechanism, Progress};
use clap::Args;
use cpusets::verify::{self, VerifyOptions};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use units::duration::{Dur, DurParseError};

use crate::ctx::{Ctx, Exit};
use services::robot::Robot;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Run for this long (default: robot.yaml `check.duration`); a quarter
    /// measures timer latency, the rest runs the scenario (per mechanism
    /// with --compare).
    #[arg(long, value_name = "D", value_parser = parse_dur)]
    pub duration: Option<Dur>,

    /// Run the scenario once per wake mechanism and show them side by side:
    /// the runtime's own on this kernel first (its budgets decide the exit
    /// status), then the others the check drives.
    #[arg(long, conflicts_with_all = ["mechanism", "boot"])]
    pub compare: bool,

    /// The wake mechanism: doorbell (the runtime's own for a real-time
    /// subscriber, the default), io_uring or futex_waitv (the runtime's
    /// other backends), io_uring_shared (the one-word reference), futex,
    /// eventfd, signalfd, msg_ring.
    #[arg(long, value_name = "M", value_parser = parse_mechanism)]
    pub mechanism: Option<Mechanism>,

    /// Compare these mechanisms only (comma separated), the first deciding
    /// the verdict, as --compare does for all of them.
    #[arg(long, value_name = "M,M..", value_delimiter = ',', value_parser = parse_mechanism, conflicts_with_all = ["mechanism", "compare", "boot"])]
    pub mechanisms: Vec<Mechanism>,

    /// With --compare or --mechanisms: run the scenario in N interleaved
    /// rounds (each mechanism 1/N of its time per round, the order rotated
    /// each round), with the one-word reference (io_uring_shared) run a
    /// second time in every round as the A/A floor, and report each
    /// mechanism's delivery p50 over the reference's and a real-time
    /// publish's cost over a best-effort one's: medians over the rounds
    /// with their spread.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100), default_value_t = 1)]
    pub rounds: u32,

    /// Take the census (root, tracefs): for the whole run, which task
    /// touched which futex word (syscalls, keyed by file and offset) and,
    /// where the kernel has kprobes, which hash bucket (futex_hash), and
    /// every wait of a real-time thread on a lock a lower-priority task
    /// held (priority-inheritance boosts inside its wakes and waits:
    /// counted; its other lock waits: listed). A positive control runs
    /// first: a best-effort process holds a PI futex a real-time one then
    /// locks.
    #[arg(long)]
    pub census: bool,

    /// With every mechanism: N best-effort threads on the housekeeping CPUs
    /// calling FUTEX_WAKE on the channel's best-effort word (the one the
    /// one-word reference shares) in a tight loop.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=16), default_value_t = 0)]
    pub hammer: u32,

    /// The supervisor's short run (`boot_check.duration`), writing its
    /// report to <prefix>/var/lib/rtdeploy/boot-check.json.
    #[arg(long)]
    pub boot: bool,

    /// Also write the latency histograms in cyclictest's histogram file
    /// format to FILE.
    #[arg(long, value_name = "FILE")]
    pub histogram: Option<PathBuf>,

    /// Also draw the latency histograms with the budget lines as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    /// Skip the verify pass that runs before the timing run.
    #[arg(long)]
    pub no_verify: bool,

    /// Trace the kernel (tracefs) on the sender's and receiver's CPUs and
    /// snapshot every delivery over its budget (and, with
    /// `check.budgets.timer_max`, every timer wake over it on the isolated
    /// CPUs): raw text and trace-event JSON in DIR (default
    /// <prefix>/var/lib/rtdeploy/traces), at most robot.yaml
    /// `check.trace_on_miss` of each kind (default 10), each with a
    /// verdict in the report; `deploy trace show FILE` prints one again.
    /// Without tracefs the check runs untraced and says why.
    #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true)]
    pub trace: Option<Option<PathBuf>>,

    /// With --trace: run the scenario twice in this run, untraced (it
    /// decides) and traced, side by side, and state the tracer's cost
    /// (p50, p99, longest of send and delivery) in a note.
    #[arg(long, requires = "trace", conflicts_with = "compare")]
    pub trace_compare: bool,

    /// Run the scenario twice in this run: without a logger (it decides),
    /// then with the supervisor's logger (robot.yaml `log:`) recording the
    /// check's channel from the housekeeping CPUs, side by side, and state
    /// the logger's cost (delivery and send p50, p99, p99.9, longest), its
    /// CPU time per 100k messages and its bytes per message in notes.
    #[arg(long, conflicts_with_all = ["compare", "trace_compare"])]
    pub log_compare: bool,

    /// Run nothing: show the boot checks kept in
    /// <prefix>/var/lib/rtdeploy/boot-check-history.jsonl (p99, max and
    /// verdict per boot) and the kernel or release changes that made them
    /// worse. Exit 0 (1 when the latest boot check did not pass).
    #[arg(long, conflicts_with_all = ["compare", "mechanism", "boot", "duration", "trace", "histogram", "plot"])]
    pub history: bool,
}

/// `deploy check --history`.
fn show_history(ctx: &Ctx) -> anyhow::Result<Exit> {
    let path = releases::Layout::new(&ctx.prefix).boot_check_history();
    let h = services::boot_history::read(&path)?;
    if ctx.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            path: String,
            #[serde(flatten)]
            history: &'a services::boot_history::History,
            trend: services::boot_history::Trend,
        }
        ctx.print_json(&Out {
            path: path.display().to_string(),
            history: &h,
            trend: services::boot_history::trend(&h.records),
        })?;
    } else {
        crate::ctx::write_stdout(&services::boot_history::render(&h))?;
    }
    Ok(match h.records.last() {
        Some(r) if r.verdict != "pass" => Exit::Failed,
        _ => Exit::Ok,
    })
}

/// Why a `--duration` or `--mechanism` argument was refused.
#[derive(Debug, thiserror::Error)]
pub enum CheckArgError {
    #[error(transparent)]
    Duration(#[from] DurParseError),
    #[error("duration 0 (expected a positive duration like `10s`)")]
    ZeroDuration,
    #[error("unknown mechanism `{given}` (expected one of {expected})")]
    UnknownMechanism { given: String, expected: String },
}

fn parse_dur(s: &str) -> Result<Dur, CheckArgError> {
    let d = Dur::parse(s)?;
    if d.is_zero() {
        return Err(CheckArgError::ZeroDuration);
    }
    Ok(d)
}

fn parse_mechanism(s: &str) -> Result<Mechanism, CheckArgError> {
    Mechanism::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Mechanism::ALL.iter().map(|m| m.short()).collect();
        CheckArgError::UnknownMechanism {
            given: s.into(),
            expected: names.join(", "),
        }
    })
}

/// The hidden worker entry: `deploy __check-worker <role> key=value...`.
#[derive(Debug, Args)]
pub struct CheckWorkerArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// Runs a worker role; its exit code becomes the process's.
pub fn run_worker(args: CheckWorkerArgs) -> ! {
    std::process::exit(check::worker::main(&args.args))
}

/// A short verify pass (cpusets plan against the live system), summarised
/// in one line; drift is reported, it does not stop the timing run.
fn verify_summary(ctx: &Ctx, r: &Robot) -> String {
    let result =
        (|| -> anyhow::Result<String> {
            let plan = r.cpu_plan(&ctx.sysroot)?;
            let opts = VerifyOptions {
                sample_window: Duration::from_millis(200),
                interrupts_after: None,
                allow_tasks: r
                    .processes
                    .iter()
                    .map(|p| p.name.chars().take(15).collect())
                    .collect(),
                unmovable_irqs: vec![],
                declared_kernel: r.kernel.declared(),
                kernel_offers: Some(services::robot::kernel_offers),
            };
            let report = verify::verify(&plan, &ctx.sysroot, &opts)?;
            let s = report.summary();
            let mut drifted: Vec<String> = report.drifted().map(|c| c.id.clone()).take(6).collect();
            if s.drift > drifted.len() {
                drifted.push(format!("{} more", s.drift - drifted.len()));
            }
            Ok(format!(
            "verify: {} ok, {} drift{}, {} unmovable, {} unsupported (`deploy verify` for details)",
            s.ok,
            s.drift,
            if drifted.is_empty() { String::new() } else { format!(" ({})", drifted.join(", ")) },
            s.unmovable,
            s.unsupported
        ))
        })();
    result.unwrap_or_else(|e| format!("verify could not run: {e:#}"))
}

/// The progress bar: phase, share of the run, running worst case.
struct Bar(ProgressBar);

impl Progress for Bar {
    fn update(&self, phase: &str, fraction: f64, worst_ns: u64) {
        self.0
            .set_position((fraction.clamp(0.0, 1.0) * 1000.0) as u64);
        self.0.set_message(format!(
            "{phase}: worst {}",
            check::report::fmt_ns(worst_ns)
        ));
    }
}

pub fn run(ctx: &Ctx, args: CheckArgs) -> anyhow::Result<Exit> {
    if args.history {
        return show_history(ctx);
    }
    let loaded = super::load_robot(ctx)?;
    let r = &loaded.robot;
    let mut inputs = r.check_inputs();
    inputs.duration = args.duration;
    inputs.trace = r.trace_request(
        &ctx.prefix,
        args.trace.is_some(),
        args.trace.as_ref().and_then(|d| d.as_deref()),
    );
    inputs.trace_compare = args.trace_compare;
    if args.log_compare {
        inputs.log_compare = Some(std::sync::Arc::new(SupervisorLogger));
    }
    if args.compare {
        inputs.mechanisms = Mechanism::compared();
    } else if !args.mechanisms.is_empty() {
        inputs.mechanisms = args.mechanisms.clone();
    } else if let Some(m) = args.mechanism {
        inputs.mechanisms = vec![m];
    }
    inputs.census = args.census;
    inputs.hammer = args.hammer;
    if args.rounds > 1 {
        if inputs.mechanisms.len() < 2 {
            anyhow::bail!(
                "--rounds {} needs mechanisms to compare (--compare or --mechanisms)",
                args.rounds
            );
        }
        inputs.rounds = args.rounds;
        inputs.aa_reference = inputs
            .mechanisms
            .contains(&Mechanism::IoUringShared)
            .then_some(Mechanism::IoUringShared);
    }
    if !args.no_verify {
        let line = verify_summary(ctx, r);
        ctx.detail(&line);
        inputs.notes.push(line);
    }
    let exe = std::env::current_exe()
        .context("cannot find the path of this executable (for the check's workers)")?;
    let report = if args.boot {
        inputs.duration = Some(args.duration.unwrap_or(r.boot_check.duration));
        let path = releases::Layout::new(&ctx.prefix).boot_check_report();
        let report = check::run_boot(&inputs, &ctx.prefix, &ctx.sysroot, &exe, &path)
            .map_err(|e| super::with_shm_hint(ctx, e.into()))?;
        ctx.note(format!("boot check report written to {}", path.display()));
        report
    } else {
        let env = CheckEnv {
            prefix: ctx.prefix.clone(),
            sysroot: ctx.sysroot.clone(),
            exe,
        };
        let bar = if ctx.quiet {
            ProgressBar::hidden()
        } else {
            let pb = ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::stderr());
            pb.set_style(
                ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {percent:>3}% {msg}")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            pb
        };
        let result = check::run(&inputs, &env, &Bar(bar.clone()));
        bar.finish_and_clear();
        result.map_err(|e| super::with_shm_hint(ctx, e.into()))?
    };
    if let Some(path) = &args.histogram {
        let ms: Vec<&check::Measurement> = report.measurements.iter().collect();
        std::fs::write(path, check::output::cyclictest_histogram(&ms))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, check::output::svg_plot(&report))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if ctx.json {
        ctx.print_json(&report)?;
    } else {
        crate::ctx::write_stdout(&report.to_text())?;
    }
    Ok(if report.passed() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

/// The supervisor's logger (logbook's recorder, with robot.yaml's default
/// `log:` section), as `--log-compare` runs it beside the scenario.
#[derive(Debug)]
struct SupervisorLogger;

impl check::ChannelLogger for SupervisorLogger {
    fn start(&self, run: &check::LoggerRun<'_>) -> std::io::Result<Box<dyn check::RunningLogger>> {
        let rec = logbook::Recorder::start(logbook::RecorderConfig {
            section: logbook::LogSection::default(),
            dir: run.dir.to_path_buf(),
            shm_dir: run.shm_dir.to_path_buf(),
            channels: vec![run.channel.to_string()],
            boot_id: String::new(),
            cpus: run.cpus.clone(),
            from_oldest: false,
        })?;
        Ok(Box::new(RunningRecorder(rec)))
    }
}

struct RunningRecorder(logbook::Recorder);

impl check::RunningLogger for RunningRecorder {
    fn stop(self: Box<Self>) -> check::LoggerFigures {
        let st = self.0.stop();
        check::LoggerFigures {
            logged: st.channels.values().map(|c| c.logged).sum(),
            lost: st.channels.values().map(|c| c.gaps).sum(),
            cpu_ns: st.cpu_ns,
            state: st.state,
        }
    }
}
