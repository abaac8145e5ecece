//! `robot.yaml`: the whole robot description, composed from the sections
//! each crate owns, with the checks that cross sections, and what the
//! other crates are given from it (the CPU plan's input, the timing
//! check's inputs, the supervisor's configuration).
//!
//! The file may come from anywhere (a bundle, a hand edit, a broken disk),
//! so reading it is bounded: its size ([`MAX_FILE_BYTES`]), its nesting and
//! aliases (see `yaml`), its numbers (each section's validation) and the
//! number of problems reported ([`MAX_DIAGNOSTICS`]). Every refusal is a
//! diagnostic with the file, line and column, naming the limit.

mod de;
mod echo;
mod validate;
mod yaml;

use std::io::Read;
use std::path::{Path, PathBuf};

use check::config::{BootCheckSection, CheckSection};
use check::{CheckInputs, NamedBudget, TraceRequest};
use controller::config::ChannelConfig;
use cpusets::config::{
    BoardSection, CpusSection, IrqsSection, KernelSection, PowerSection, SysctlSection,
};
use cpusets::model::live::{Live, ModelReadError};
use cpusets::plan::{Isolation, PlanBuildError, RuntimePlan};
use serde::Serialize;

use crate::config::{ProcessConfig, RobotSection, UpdateSection};
use units::cpu::CpuSet;

pub use echo::MAX_MESSAGE_CHARS;
pub use validate::{Diagnostic, Severity, MAX_DIAGNOSTICS};
pub use yaml::{MAX_ALIASES, MAX_ALIAS_BYTES, MAX_ALIAS_NODES, MAX_DEPTH};

/// The largest robot.yaml read: 512 KiB. The bundled examples are under
/// 5 KB, so this leaves a hundred times the room. It bounds everything
/// after it: the tree, and the parser's own buffer, which holds a flow
/// list nested in a flow list whole until it ends (about 450 bytes for a
/// two-byte value like `1,`: the worst file costs about 120 MiB).
pub const MAX_FILE_BYTES: usize = crate::config::MAX_ROBOT_YAML as usize;

/// The validated robot description.
#[derive(Debug, Clone, Serialize)]
pub struct Robot {
    pub robot: RobotSection,
    pub board: BoardSection,
    pub cpus: CpusSection,
    pub kernel: KernelSection,
    pub irqs: IrqsSection,
    pub sysctl: SysctlSection,
    pub power: PowerSection,
    pub channels: Vec<ChannelConfig>,
    pub processes: Vec<ProcessConfig>,
    pub check: CheckSection,
    pub boot_check: BootCheckSection,
    pub update: UpdateSection,
    pub metrics: crate::config::MetricsSection,
    /// `log:`: the supervisor's logger (absent: none).
    pub log: Option<logbook::LogSection>,
    /// `watchdog:`: the hardware watchdog the supervisor feeds (absent:
    /// none).
    pub watchdog: Option<crate::config::WatchdogSection>,
    /// `bridge:`: channels to and from Zenoh (absent: no bridge). Its
    /// process, [`crate::bridge::PROCESS`], is in `processes`.
    pub bridge: Option<crate::bridge::BridgeSection>,
}

impl Robot {
    /// The sections the cpusets plan reads.
    pub fn isolation(&self) -> Isolation<'_> {
        Isolation {
            board: &self.board,
            cpus: &self.cpus,
            kernel: &self.kernel,
            irqs: &self.irqs,
            sysctl: &self.sysctl,
            power: &self.power,
        }
    }

    /// Every CPU of the board (validation guarantees the count is known).
    pub fn all_cpus(&self) -> CpuSet {
        self.board.all_cpus().unwrap_or_default()
    }

    /// The housekeeping CPUs, as written or derived.
    pub fn housekeeping(&self) -> CpuSet {
        self.cpus.housekeeping(&self.all_cpus())
    }

    /// The programs robot.yaml runs (`processes[].exec`), which a release
    /// must hold ([`releases::check_programs`]).
    pub fn programs(&self) -> Vec<String> {
        self.processes.iter().map(|p| p.exec.clone()).collect()
    }

    /// The CPUs a process runs on: as written, else the isolated CPUs for
    /// fifo/rr and the housekeeping CPUs for `other`.
    pub fn process_cpus(&self, p: &ProcessConfig) -> CpuSet {
        match &p.cpus {
            Some(c) => c.clone(),
            None if p.policy.is_realtime() => self.cpus.isolated.clone(),
            None => self.housekeeping(),
        }
    }

    /// Every process's wake class, from its placement (see
    /// [`crate::wake_class`]), in robot.yaml's order.
    pub fn wake_classes(&self) -> Vec<crate::wake_class::ProcessClass> {
        let cpus: Vec<CpuSet> = self
            .processes
            .iter()
            .map(|p| self.process_cpus(p))
            .collect();
        crate::wake_class::Placement {
            processes: &self.processes,
            cpus: &cpus,
            isolated: &self.cpus.isolated,
            irqs: &self.irqs,
        }
        .classes()
    }

    /// How many processes publish on a channel.
    pub fn publishers_of(&self, channel: &str) -> usize {
        self.processes
            .iter()
            .filter(|p| p.publishes.iter().any(|c| c == channel))
            .count()
    }

    /// The cpusets runtime plan against the live system under `sysroot`
    /// (what `deploy apply` writes, `deploy verify` checks, `deploy check`
    /// verifies first and the supervisor applies at start).
    pub fn cpu_plan(&self, sysroot: &Path) -> Result<RuntimePlan, RobotPlanError> {
        let live = Live::read(sysroot).map_err(RobotPlanError::Live)?;
        Ok(cpusets::plan::plan(&self.isolation(), &live.inventory())?)
    }

    /// The timing check's inputs: the scenario (`check:`), the CPUs, and
    /// every budget that holds for the real-time receiver (channels', and
    /// real-time processes' `budgets.wakeup`).
    pub fn check_inputs(&self) -> CheckInputs {
        let mut inputs = CheckInputs::new(
            self.robot.name.clone(),
            self.check.clone(),
            self.cpus.isolated.iter().map(|c| c as usize).collect(),
            self.housekeeping().iter().map(|c| c as usize).collect(),
        );
        inputs.cpu_dma_latency_us = self.power.cpu_dma_latency.map(|m| m.0);
        inputs.channel_budgets = self
            .channels
            .iter()
            .filter_map(|c| {
                c.budget.map(|b| NamedBudget {
                    name: format!("channels.{}.budget", c.name),
                    limit: b,
                })
            })
            .collect();
        // Real-time processes' wakeup budgets hold for the real-time receiver.
        inputs.process_budgets = self
            .processes
            .iter()
            .filter(|p| p.policy.is_realtime())
            .filter_map(|p| {
                p.budgets.wakeup.map(|b| NamedBudget {
                    name: format!("processes.{}.budgets.wakeup", p.name),
                    limit: b,
                })
            })
            .collect();
        inputs
    }

    /// Where and how many traced misses a run keeps: `dir` (`--trace=DIR`),
    /// else `<prefix>/var/lib/rtdeploy/traces`, when `asked` (`--trace`)
    /// or robot.yaml's `check.trace_on_miss` says (also for the
    /// supervisor's boot check and miss tracing); `None` when neither asks.
    pub fn trace_request(
        &self,
        prefix: &Path,
        asked: bool,
        dir: Option<&Path>,
    ) -> Option<TraceRequest> {
        let keep = self.check.trace_on_miss.map(|n| n as usize);
        if !asked && keep.is_none() {
            return None;
        }
        let dir = match dir {
            Some(d) => d.to_path_buf(),
            None => releases::Layout::new(prefix)
                .boot_check_report()
                .with_file_name("traces"),
        };
        Some(TraceRequest {
            dir,
            keep: keep.unwrap_or(DEFAULT_TRACE_KEEP).max(1),
        })
    }
}

impl Robot {
    /// The supervisor's systemd unit ([`crate::unit`]), started after the
    /// boot partition it reads the boot loader's count from.
    pub fn unit(&self) -> String {
        let mounts: Vec<&str> = self
            .update
            .boot_attempts
            .iter()
            .map(|b| b.partition.as_str())
            .collect();
        crate::unit::render(&self.robot, &self.housekeeping(), &self.processes, &mounts)
    }

    /// Each process's name and CPUs, for [`Robot::system_part`].
    pub fn process_cpu_list(&self) -> Vec<(String, CpuSet)> {
        self.processes
            .iter()
            .map(|p| (p.name.clone(), self.process_cpus(p)))
            .collect()
    }

    /// The system part a system update compares
    /// ([`releases::system_plan`]), with `processes` from
    /// [`Robot::process_cpu_list`] and `all_cpus` from [`Robot::all_cpus`].
    pub fn system_part<'a>(
        &'a self,
        all_cpus: &'a CpuSet,
        processes: &'a [(String, CpuSet)],
    ) -> releases::system_plan::SystemPart<'a> {
        releases::system_plan::SystemPart {
            isolation: self.isolation(),
            all_cpus,
            processes,
            boot_attempts: self
                .update
                .boot_attempts
                .as_ref()
                .map(|b| (b.partition.as_str(), b.limit)),
        }
    }

    /// The planner the installer is given on this robot: this
    /// robot.yaml against each new release's ([`releases::system_plan`]);
    /// `boot_id` is the kernel's boot id file, `add_entry` makes an
    /// extlinux.conf boot entry.
    pub fn system_planner(
        self,
        prefix: PathBuf,
        boot_id: PathBuf,
        add_entry: Box<releases::system_plan::AddBootEntry>,
    ) -> Box<releases::PlanSystem> {
        Box::new(move |release: &str, yaml: &str| {
            let new = load_str(Path::new("robot.yaml"), yaml.to_string())
                .map_err(|e| format!("its robot.yaml does not load: {e}"))?
                .robot;
            let (old_cpus, new_cpus) = (self.all_cpus(), new.all_cpus());
            let (old_p, new_p) = (self.process_cpu_list(), new.process_cpu_list());
            releases::system_plan::plan(
                &prefix,
                &boot_id,
                &self.system_part(&old_cpus, &old_p),
                &new.system_part(&new_cpus, &new_p),
                release,
                &*add_entry,
            )
            .map_err(|e| e.to_string())
        })
    }
}

/// Traced misses kept when robot.yaml does not say (`--trace` alone).
pub const DEFAULT_TRACE_KEEP: usize = 10;

/// What the kernel of `release` offers the runtime, in one line (probed
/// when it is the kernel running here): verify's `kernel.capabilities`.
pub fn kernel_offers(release: &str, live: bool) -> String {
    controller::kernel::KernelFacts::of(release, live).summary()
}

/// Why the CPU plan could not be made against the live system.
#[derive(Debug, thiserror::Error)]
pub enum RobotPlanError {
    #[error("reading the live system")]
    Live(#[source] ModelReadError),
    #[error(transparent)]
    Plan(#[from] PlanBuildError),
}

/// A loaded, valid robot description with its warnings.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub robot: Robot,
    pub path: PathBuf,
    pub text: String,
    pub warnings: Vec<Diagnostic>,
}

/// Why a robot description was refused: every problem found, each with its
/// place in the file.
#[derive(Debug, thiserror::Error)]
pub enum RobotLoadError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not valid: {} error(s)", path.display(), diagnostics.iter().filter(|d| d.severity == Severity::Error).count())]
    Invalid {
        path: PathBuf,
        diagnostics: Vec<Diagnostic>,
    },
}

/// Reads, parses and validates `robot.yaml`. It must be a regular file
/// (through links: `/etc/rtdeploy/robot.yaml` is one into the current
/// release); a FIFO or a device is refused without waiting or reading
/// ([`units::bounded`]), and at most one byte past [`MAX_FILE_BYTES`] is
/// read of a file that grows.
pub fn load(path: &Path) -> Result<Loaded, RobotLoadError> {
    let limit = MAX_FILE_BYTES as u64 + 1;
    let read = || {
        let f = units::bounded::Bound::regular(limit)
            .following_links()
            .open(path)?;
        units::bounded::read_at_most(&mut f.take(limit), path, limit)
    };
    let bytes = read().map_err(|e| RobotLoadError::Read {
        path: path.to_path_buf(),
        source: e.into_io(),
    })?;
    load_bytes(path, bytes)
}

/// Parses and validates `bytes` as if read from `path`: refused when
/// larger than [`MAX_FILE_BYTES`] or not UTF-8, at the place it goes wrong.
pub fn load_bytes(path: &Path, bytes: Vec<u8>) -> Result<Loaded, RobotLoadError> {
    if let Some(refused) = too_large(path, &bytes) {
        return Err(refused);
    }
    match String::from_utf8(bytes) {
        Ok(text) => load_str(path, text),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let bytes = e.as_bytes();
            Err(invalid(
                path,
                yaml::pos_at(bytes, at),
                format!(
                    "byte 0x{:02x} is not UTF-8 (robot.yaml must be UTF-8 text)",
                    bytes[at]
                ),
            ))
        }
    }
}

/// Parses and validates `text` as if read from `path`.
pub fn load_str(path: &Path, text: String) -> Result<Loaded, RobotLoadError> {
    if let Some(refused) = too_large(path, text.as_bytes()) {
        return Err(refused);
    }
    let (robot, diagnostics) = validate::parse_and_validate(path, &text);
    match robot {
        Some(robot) if !diagnostics.iter().any(|d| d.severity == Severity::Error) => Ok(Loaded {
            robot,
            path: path.to_path_buf(),
            text,
            warnings: diagnostics,
        }),
        _ => Err(RobotLoadError::Invalid {
            path: path.to_path_buf(),
            diagnostics,
        }),
    }
}

/// The refusal of a text over [`MAX_FILE_BYTES`], at its first byte past
/// the limit.
fn too_large(path: &Path, bytes: &[u8]) -> Option<RobotLoadError> {
    (bytes.len() > MAX_FILE_BYTES).then(|| {
        invalid(
            path,
            yaml::pos_at(bytes, MAX_FILE_BYTES),
            format!(
                "the file is larger than {} KiB (the limit for robot.yaml)",
                MAX_FILE_BYTES >> 10
            ),
        )
    })
}

/// A refusal of the whole file with one error.
fn invalid(path: &Path, pos: yaml::Pos, message: String) -> RobotLoadError {
    RobotLoadError::Invalid {
        path: path.to_path_buf(),
        diagnostics: vec![Diagnostic::new(Severity::Error, path, pos, "", &message)],
    }
}
