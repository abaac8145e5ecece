//! NVIDIA Jetson power modes: `nvpmodel`.
//!
//! A Jetson's power mode decides which CPUs are online and how fast they
//! may run, and NVIDIA's modes switch off exactly the clusters a robot
//! isolates (the Orin NX 16GB's default 15 W mode keeps CPUs 0-3 only).
//! This module holds what NVIDIA's nvpmodel configuration files say of the
//! CPUs for each module ([`CONFS`]), resolves the mode `power.nvpmodel`
//! names against them (pure), and runs the `nvpmodel` tool, which is the
//! only way to change the mode: find it, query it, set a mode with no
//! terminal to ask on and within a timeout, and read the mode it recorded
//! in its status file.
//!
//! Only the CPU side of a mode is kept. A mode also caps the GPU, EMC
//! (memory), DLA and PVA clocks; rtdeploy leaves those to the mode.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::board::Board;
use units::cpu::CpuSet;

/// One power mode of an nvpmodel configuration file, as far as the CPUs
/// go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NvpMode {
    /// `< POWER_MODEL ID=n ...>`: what `nvpmodel -m` takes.
    pub id: u32,
    /// `NAME=...`: what `nvpmodel -q` prints.
    pub name: &'static str,
    /// The CPUs its `CPU_ONLINE CORE_n 1` lines keep online (the others
    /// are `0`).
    pub online: &'static str,
    /// The `CPU_A78_n MAX_FREQ` it sets, in kHz (as `scaling_max_freq`
    /// takes it); `None` for `-1`, which nvpmodel takes as no cap (the
    /// CPU's own maximum, `cpuinfo_max_freq`). Every cluster a mode keeps
    /// online gets the same value in the files below.
    pub cpu_max_khz: Option<u32>,
}

impl NvpMode {
    /// The CPUs the mode keeps online.
    pub fn online_cpus(&self) -> CpuSet {
        CpuSet::parse_list(self.online).expect("the nvpmodel table holds valid CPU lists")
    }

    /// `2 15W`, as the mode is listed in messages.
    pub fn label(&self) -> String {
        format!("{} {}", self.id, self.name)
    }

    /// The CPU clock cap in words.
    pub fn cap(&self) -> String {
        match self.cpu_max_khz {
            Some(khz) => format!("{khz} kHz"),
            None => "the CPU's own maximum".into(),
        }
    }
}

/// One of NVIDIA's nvpmodel configuration files
/// (`/etc/nvpmodel/nvpmodel_<name>.conf` on the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NvpConf {
    /// `p3767_0000_super` for `nvpmodel_p3767_0000_super.conf`.
    pub name: &'static str,
    /// The module part numbers (as in [`crate::board::JetsonModule`]) that
    /// use this file.
    pub parts: &'static [&'static str],
    /// The Jetson Linux release the values were read from.
    pub release: &'static str,
    /// `< PM_CONFIG DEFAULT=n >`: the mode a module boots in until
    /// `nvpmodel -m` records another.
    pub default_id: u32,
    pub modes: &'static [NvpMode],
}

impl NvpConf {
    /// The file's name on the module.
    pub fn file_name(&self) -> String {
        format!("nvpmodel_{}.conf", self.name)
    }

    /// The mode with this id.
    pub fn mode(&self, id: u32) -> Option<&'static NvpMode> {
        self.modes.iter().find(|m| m.id == id)
    }

    /// The modes, `0 MAXN, 1 10W, ...`.
    pub fn mode_list(&self) -> String {
        self.modes
            .iter()
            .map(NvpMode::label)
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn find(&'static self, want: &NvpmodelMode) -> Option<&'static NvpMode> {
        self.modes.iter().find(|m| want.names(m))
    }
}

const fn mode(
    id: u32,
    name: &'static str,
    online: &'static str,
    cpu_max_khz: Option<u32>,
) -> NvpMode {
    NvpMode {
        id,
        name,
        online,
        cpu_max_khz,
    }
}

// NVIDIA's nvpmodel configuration files, the CPU lines of each mode
// (`CPU_ONLINE CORE_n 0|1`, `CPU_A78_n MAX_FREQ`, `< PM_CONFIG DEFAULT=n >`).
// NVIDIA ships them in the nvidia-l4t-nvpmodel package of Jetson Linux; the
// public copies read here are the files (NVIDIA's copyright headers intact)
// that LineageOS builds its Jetson Orin device from,
// https://github.com/LineageOS/android_device_nvidia_concord, directory
// `nvpmodel/`:
// - L4T R36: `nvpmodel_p3767_0000_super.conf`, `nvpmodel_p3767_0001_super.conf`,
//   `nvpmodel_p3767_0003_super.conf`, `nvpmodel_p3767_0004_super.conf` at
//   commit 370b63a8dbe954cd5f2da0c24694a1af5796612f ("Copyright (c) 2024",
//   the `_KNEXT` sysfs paths of the R36 kernel's device tree), and
//   `nvpmodel_p3701_0000.conf`, `nvpmodel_p3701_0004.conf` at commit
//   0a7ce0b3cb5f72b34f1f3eab1456572991f13cc2 (same R36 paths). The
//   repository does not record the R36 minor release.
// - L4T R35: `nvpmodel_p3701_0000.conf`, `nvpmodel_p3701_0004.conf`,
//   `nvpmodel_p3767_0000.conf`, `nvpmodel_p3767_0001.conf`,
//   `nvpmodel_p3767_0003.conf`, `nvpmodel_p3767_0004.conf` on branch
//   lineage-21 (commit 640733e607499e9bb841d200638996680e5dd47b), which builds
//   against L4T R35's 5.10 kernel (`lineage.dependencies`:
//   `kernel/nvidia/kernel-5.10`).
// R35 and R36 agree on the AGX Orin files' CPU lines. For the P3767
// modules (Orin NX, Orin Nano) only R36's `_super` files were found; R36's
// plain `nvpmodel_p3767_000n.conf` were not, so the plain files below are
// R35's. (Looked for and not found: the plain R36 files in LineageOS's
// concord, whose R36 commits add only the `_super` ones, or any other
// public copy from JetPack 6.0-6.2; jetpack-nixos and Canonical's
// tegra-snap-samples take the files from NVIDIA's nvidia-l4t-nvpmodel
// package rather than carry them. NVIDIA's R36.3 Developer Guide,
// "Supported Modes and Power Efficiency", tabulates the plain modes' CPU
// counts and caps and would check these entries; it was not read here.)
// They differ from the `_super` ones: R35's Orin NX 16GB 15W caps
// the CPUs at 1651200 kHz, R36's `_super` at 1420800 kHz; the `_super`
// files add a 40W (NX) or 25W (Nano) mode and MAXN_SUPER, and boot in
// their highest mode but one (NX: 40W; Nano: 25W).
// Which file a module uses: P3701-0000 and P3767-0000/0001/0003/0004 by
// their own part number. P3767-0005 (the Orin Nano developer kit's module)
// uses `nvpmodel_p3767_0003.conf`, and P3701-0005 (AGX Orin 64GB)
// `nvpmodel_p3701_0000.conf`, in LineageOS's mapping
// (`init/init_concord.cpp`, `vendor_set_nvpmodel`), which follows NVIDIA's
// `nvpower.sh`; NVIDIA's own script was not read. Not confirmed, so left
// out: NVIDIA's own `nvpmodel_p3701_0005.conf` if R36 ships one, the
// industrial modules (P3701-0008), and any later R36 change to the
// `_super` files (a 7W mode on the Orin Nano).

/// Every nvpmodel configuration file rtdeploy knows (see the sources
/// above).
pub const CONFS: &[NvpConf] = &[
    NvpConf {
        name: "p3701_0000",
        parts: &["P3701-0000", "P3701-0005"],
        release: "R36 (R35 the same)",
        default_id: 2,
        modes: &[
            mode(0, "MAXN", "0-11", None),
            mode(1, "MODE_15W", "0-3", Some(1_113_600)),
            mode(2, "MODE_30W", "0-7", Some(1_728_000)),
            mode(3, "MODE_50W", "0-11", Some(1_497_600)),
        ],
    },
    NvpConf {
        name: "p3701_0004",
        parts: &["P3701-0004"],
        release: "R36 (R35 the same)",
        default_id: 2,
        modes: &[
            mode(0, "MAXN", "0-7", None),
            mode(1, "MODE_15W", "0-3", Some(1_113_600)),
            mode(2, "MODE_30W", "0-7", Some(1_728_000)),
            mode(3, "MODE_40W", "0-7", Some(1_497_600)),
        ],
    },
    NvpConf {
        name: "p3767_0000_super",
        parts: &["P3767-0000"],
        release: "R36",
        default_id: 4,
        modes: &[
            mode(0, "MAXN_SUPER", "0-7", None),
            mode(1, "10W", "0-3", Some(1_190_400)),
            mode(2, "15W", "0-3", Some(1_420_800)),
            mode(3, "25W", "0-7", Some(1_497_600)),
            mode(4, "40W", "0-7", Some(1_497_600)),
        ],
    },
    NvpConf {
        name: "p3767_0000",
        parts: &["P3767-0000"],
        release: "R35",
        default_id: 2,
        modes: &[
            mode(0, "MAXN", "0-7", None),
            mode(1, "10W", "0-3", Some(1_190_400)),
            mode(2, "15W", "0-3", Some(1_651_200)),
            mode(3, "25W", "0-7", Some(1_497_600)),
        ],
    },
    NvpConf {
        name: "p3767_0001_super",
        parts: &["P3767-0001"],
        release: "R36",
        default_id: 4,
        modes: &[
            mode(0, "MAXN_SUPER", "0-5", None),
            mode(1, "10W", "0-3", Some(1_190_400)),
            mode(2, "15W", "0-3", Some(1_420_800)),
            mode(3, "20W", "0-5", Some(1_497_600)),
            mode(4, "40W", "0-5", Some(1_984_000)),
        ],
    },
    NvpConf {
        name: "p3767_0001",
        parts: &["P3767-0001"],
        release: "R35",
        default_id: 2,
        modes: &[
            mode(0, "MAXN", "0-5", None),
            mode(1, "10W", "0-3", Some(1_190_400)),
            mode(2, "15W", "0-3", Some(1_420_800)),
            mode(3, "20W", "0-5", Some(1_497_600)),
        ],
    },
    NvpConf {
        name: "p3767_0003_super",
        parts: &["P3767-0003", "P3767-0005"],
        release: "R36",
        default_id: 1,
        modes: &[
            mode(0, "15W", "0-5", Some(1_497_600)),
            mode(1, "25W", "0-5", Some(1_344_000)),
            mode(2, "MAXN_SUPER", "0-5", None),
        ],
    },
    NvpConf {
        name: "p3767_0003",
        parts: &["P3767-0003", "P3767-0005"],
        release: "R35",
        default_id: 0,
        modes: &[
            mode(0, "15W", "0-5", None),
            mode(1, "7W", "0-3", Some(960_000)),
        ],
    },
    NvpConf {
        name: "p3767_0004_super",
        parts: &["P3767-0004"],
        release: "R36",
        default_id: 1,
        modes: &[
            mode(0, "10W", "0-5", Some(1_497_600)),
            mode(1, "25W", "0-5", Some(1_728_000)),
            mode(2, "MAXN_SUPER", "0-5", None),
        ],
    },
    NvpConf {
        name: "p3767_0004",
        parts: &["P3767-0004"],
        release: "R35",
        default_id: 0,
        modes: &[
            mode(0, "10W", "0-5", None),
            mode(1, "7W_AI", "0-3", Some(806_400)),
            mode(2, "7W_CPU", "0-3", Some(960_000)),
        ],
    },
];

/// The configuration file called `name` (`p3767_0003`, or the file name
/// `nvpmodel_p3767_0003.conf`).
pub fn find_conf(name: &str) -> Option<&'static NvpConf> {
    let bare = name.trim();
    let bare = bare.strip_prefix("nvpmodel_").unwrap_or(bare);
    let bare = bare.strip_suffix(".conf").unwrap_or(bare);
    CONFS.iter().find(|c| c.name.eq_ignore_ascii_case(bare))
}

/// The configuration files of the modules a board model covers; empty for
/// a board that is not a Jetson (or one whose files are not known).
pub fn confs_for(board: &Board) -> Vec<&'static NvpConf> {
    let Some(module) = &board.flash_config else {
        return Vec::new();
    };
    CONFS
        .iter()
        .filter(|c| c.parts.iter().any(|p| module.parts.contains(p)))
        .collect()
}

/// `power.nvpmodel`: a mode by id (`2`) or by name (`15W`, matched without
/// regard to case).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvpmodelMode {
    Id(u32),
    Name(String),
}

impl NvpmodelMode {
    /// True when `mode` is the one named.
    pub fn names(&self, mode: &NvpMode) -> bool {
        match self {
            NvpmodelMode::Id(id) => mode.id == *id,
            NvpmodelMode::Name(n) => mode.name.eq_ignore_ascii_case(n.trim()),
        }
    }
}

impl fmt::Display for NvpmodelMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvpmodelMode::Id(id) => write!(f, "{id}"),
            NvpmodelMode::Name(n) => f.write_str(n),
        }
    }
}

impl Serialize for NvpmodelMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            NvpmodelMode::Id(id) => s.serialize_u32(*id),
            NvpmodelMode::Name(n) => s.serialize_str(n),
        }
    }
}

impl<'de> Deserialize<'de> for NvpmodelMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = NvpmodelMode;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an nvpmodel mode by name or id, like `15W`, `MAXN` or `2`")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<NvpmodelMode, E> {
                u32::try_from(v)
                    .map(NvpmodelMode::Id)
                    .map_err(|_| E::custom(format!("mode id {v} is out of range")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<NvpmodelMode, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!(
                        "mode id {v} is negative (expected a mode by name or id, like `15W` or `2`)"
                    ))),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<NvpmodelMode, E> {
                let t = v.trim();
                if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
                    t.parse()
                        .map(NvpmodelMode::Id)
                        .map_err(|_| E::custom(format!("mode id {t} is out of range")))
                } else {
                    Ok(NvpmodelMode::Name(v.to_string()))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A mode found in a configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub conf: &'static NvpConf,
    pub mode: &'static NvpMode,
}

impl Resolved {
    /// `15W (id 2) of nvpmodel_p3767_0000_super.conf, L4T R36`.
    pub fn describe(&self) -> String {
        format!(
            "`{}` (id {}) of {}, L4T {}",
            self.mode.name,
            self.mode.id,
            self.conf.file_name(),
            self.conf.release
        )
    }
}

/// Why `power.nvpmodel` names no mode of the board.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeResolveError {
    #[error("board `{board}` has no nvpmodel power modes (nvpmodel is NVIDIA Jetson's power-mode tool); remove `power.nvpmodel`")]
    NoTable { board: String },
    #[error("`{conf}` is not an nvpmodel configuration of board `{board}` (expected one of: {expected})")]
    UnknownConf {
        conf: String,
        board: String,
        expected: String,
    },
    #[error("unknown nvpmodel mode `{mode}` for board `{board}` (expected one of: {expected})")]
    UnknownMode {
        mode: String,
        board: String,
        expected: String,
    },
    #[error("nvpmodel mode `{mode}` is not the same in the configurations board `{board}`'s modules use ({found}); set `power.nvpmodel_conf` to the module's: {confs}")]
    Ambiguous {
        mode: String,
        board: String,
        found: String,
        confs: String,
    },
}

/// Finds the mode `mode` names in the configuration `conf` names, or, with
/// no `conf`, in every configuration of the board's modules, where it must
/// mean the same mode (same id, name, CPUs and clock cap) in each that has
/// it.
pub fn resolve(
    board: &Board,
    conf: Option<&str>,
    mode: &NvpmodelMode,
) -> Result<Resolved, ModeResolveError> {
    let confs = confs_for(board);
    if confs.is_empty() {
        return Err(ModeResolveError::NoTable {
            board: board.model.into(),
        });
    }
    let names = || confs.iter().map(|c| c.name).collect::<Vec<_>>().join(", ");
    let candidates: Vec<&'static NvpConf> = match conf {
        Some(name) => match find_conf(name).filter(|c| confs.contains(c)) {
            Some(c) => vec![c],
            None => {
                return Err(ModeResolveError::UnknownConf {
                    conf: name.chars().take(60).collect(),
                    board: board.model.into(),
                    expected: names(),
                })
            }
        },
        None => confs.clone(),
    };
    let found: Vec<Resolved> = candidates
        .iter()
        .filter_map(|c| c.find(mode).map(|m| Resolved { conf: c, mode: m }))
        .collect();
    let Some(first) = found.first().copied() else {
        let expected = candidates
            .iter()
            .map(|c| format!("{} in {}", c.mode_list(), c.file_name()))
            .collect::<Vec<_>>()
            .join("; ");
        return Err(ModeResolveError::UnknownMode {
            mode: mode.to_string().chars().take(60).collect(),
            board: board.model.into(),
            expected,
        });
    };
    if found.iter().all(|r| r.mode == first.mode) {
        return Ok(first);
    }
    Err(ModeResolveError::Ambiguous {
        mode: mode.to_string(),
        board: board.model.into(),
        found: found
            .iter()
            .map(|r| {
                format!(
                    "{}: id {} `{}`, CPUs {} up to {}",
                    r.conf.name,
                    r.mode.id,
                    r.mode.name,
                    r.mode.online,
                    r.mode.cap()
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        confs: found
            .iter()
            .map(|r| format!("{} (L4T {})", r.conf.name, r.conf.release))
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// What a mode switches off of the CPUs a plan uses, as a message, or
/// `None` when it keeps them all online. `uses` names each CPU set and
/// where it comes from (`cpus.isolated`, `processes[0] imu`).
pub fn offline_in_use(r: &Resolved, uses: &[(String, CpuSet)]) -> Option<String> {
    let online = r.mode.online_cpus();
    let all_used = uses
        .iter()
        .fold(CpuSet::new(), |acc, (_, set)| acc.union(set));
    let off = all_used.difference(&online);
    if off.is_empty() {
        return None;
    }
    let users: Vec<String> = uses
        .iter()
        .filter(|(_, set)| !set.is_disjoint(&off))
        .map(|(what, set)| format!("{what} {set}"))
        .collect();
    let fitting: Vec<String> = r
        .conf
        .modes
        .iter()
        .filter(|m| all_used.is_subset(&m.online_cpus()))
        .map(NvpMode::label)
        .collect();
    let instead = if fitting.is_empty() {
        format!("no mode of {} keeps them all online", r.conf.file_name())
    } else {
        format!(
            "choose a mode that keeps them online: {}",
            fitting.join(", ")
        )
    };
    Some(format!(
        "nvpmodel mode {} keeps only CPUs {online} online; the plan uses CPUs {all_used} ({}): CPUs {off} would be offline ({instead})",
        r.describe(),
        users.join(", ")
    ))
}

/// Where nvpmodel records the mode it set (`pmode:0002`), which it applies
/// again at boot.
pub const STATUS_FILE: &str = "/var/lib/nvpmodel/status";

/// The mode id in the text of nvpmodel's status file: the `pmode:NNNN`
/// word.
pub fn parse_status(text: &str) -> Option<u32> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("pmode:"))
        .and_then(|n| n.parse().ok())
}

/// The mode `nvpmodel -q` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveMode {
    pub id: u32,
    /// Empty when only the id was read (from the status file).
    pub name: String,
}

impl fmt::Display for LiveMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.is_empty() {
            write!(f, "{}", self.id)
        } else {
            write!(f, "{} {}", self.id, self.name)
        }
    }
}

/// The mode in `nvpmodel -q` output: `NV Power Mode: 15W` followed by a
/// line holding the id (other lines, like `NVPM WARN: ...`, are skipped).
pub fn parse_query(text: &str) -> Option<LiveMode> {
    let mut name = None;
    let mut id = None;
    for line in text.lines().map(str::trim) {
        if let Some(n) = line.strip_prefix("NV Power Mode:") {
            name = Some(n.trim().to_string());
        } else if name.is_some() && id.is_none() && !line.is_empty() {
            id = line.parse().ok();
        }
    }
    Some(LiveMode {
        id: id?,
        name: name?,
    })
}

/// True when nvpmodel's output asks for a reboot (`Reboot required for
/// changing to this power mode`, `DO YOU WANT TO REBOOT NOW?`).
pub fn asks_for_reboot(output: &str) -> bool {
    output.to_ascii_lowercase().contains("reboot")
}

/// The `nvpmodel` binary and how long a call of it may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvpmodelTool {
    pub path: PathBuf,
    pub timeout: Duration,
}

/// What one nvpmodel call did.
#[derive(Debug, Clone)]
pub struct ToolRun {
    /// `nvpmodel -m 2`, for messages.
    pub command: String,
    /// The exit code; `None` when it was stopped (timeout) or killed by a
    /// signal.
    pub code: Option<i32>,
    /// It did not finish within the timeout and was killed.
    pub timed_out: bool,
    /// Standard output and error, one after the other.
    pub output: String,
}

impl ToolRun {
    /// The output on one line, cut to a readable length.
    pub fn output_line(&self) -> String {
        let joined = self
            .output
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" / ");
        if joined.chars().count() > 300 {
            let cut: String = joined.chars().take(300).collect();
            format!("{cut}...")
        } else {
            joined
        }
    }

    pub fn succeeded(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }
}

/// Why nvpmodel could not be run or read.
#[derive(Debug, thiserror::Error)]
pub enum NvpmodelRunError {
    #[error("cannot run {}", path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed: {why}")]
    Query { command: String, why: String },
}

/// Where the tool is looked for on a live system, after `PATH`.
pub const TOOL_DIRS: &[&str] = &["/usr/sbin", "/usr/bin"];

impl NvpmodelTool {
    /// How long one call may take: setting a mode writes a few dozen sysfs
    /// files and can take seconds on a loaded board.
    pub const TIMEOUT: Duration = Duration::from_secs(20);

    pub fn at(path: impl Into<PathBuf>) -> Self {
        NvpmodelTool {
            path: path.into(),
            timeout: Self::TIMEOUT,
        }
    }

    /// The nvpmodel binary for a sysroot: on the live system (`/`) the first
    /// executable `nvpmodel` in `PATH`, `/usr/sbin` or `/usr/bin`; under any
    /// other sysroot (a fake tree) only `<sysroot>/usr/sbin/nvpmodel` or
    /// `<sysroot>/usr/bin/nvpmodel`, never the host's.
    pub fn find(sysroot: &Path) -> Option<Self> {
        let live = sysroot
            .canonicalize()
            .map(|p| p == Path::new("/"))
            .unwrap_or(false);
        let mut dirs: Vec<PathBuf> = Vec::new();
        if live {
            if let Some(path) = std::env::var_os("PATH") {
                dirs.extend(std::env::split_paths(&path).filter(|d| d.is_absolute()));
            }
            dirs.extend(TOOL_DIRS.iter().map(PathBuf::from));
        } else {
            dirs.extend(
                TOOL_DIRS
                    .iter()
                    .map(|d| sysroot.join(d.trim_start_matches('/'))),
            );
        }
        dirs.into_iter()
            .map(|d| d.join("nvpmodel"))
            .find(|p| is_executable(p))
            .map(Self::at)
    }

    /// Runs nvpmodel with `args`: standard input from /dev/null, output
    /// captured, in a process group of its own (never the terminal's
    /// foreground group, so it cannot read the terminal either: a read
    /// stops it), and killed with its group when it outlives the timeout.
    /// A mode that changes the online CPUs makes nvpmodel ask on standard
    /// input whether to reboot now: here it reads end-of-file.
    pub fn run(&self, args: &[&str]) -> Result<ToolRun, NvpmodelRunError> {
        use std::os::unix::process::CommandExt;
        let command = std::iter::once("nvpmodel")
            .chain(args.iter().copied())
            .collect::<Vec<_>>()
            .join(" ");
        let mut child = Command::new(&self.path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|source| NvpmodelRunError::Spawn {
                path: self.path.clone(),
                source,
            })?;
        // Readers on their own threads, so a full pipe never stalls the
        // child and a pipe held open by a grandchild never stalls us.
        let (tx, rx) = mpsc::channel();
        let mut readers = 0;
        for (i, pipe) in [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .enumerate()
        {
            let Some(mut pipe) = pipe else { continue };
            let tx = tx.clone();
            readers += 1;
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                // Up to 64 KiB: nvpmodel prints a few lines.
                let _ = pipe.by_ref().take(64 * 1024).read_to_end(&mut buf);
                let _ = tx.send((i, String::from_utf8_lossy(&buf).into_owned()));
            });
        }
        drop(tx);
        let deadline = Instant::now() + self.timeout;
        let mut timed_out = false;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() >= deadline => {
                    timed_out = true;
                    signal::kill_group(child.id());
                    let _ = child.kill();
                    break child.wait().ok();
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(_) => break None,
            }
        };
        let mut parts = [String::new(), String::new()];
        let grace = Instant::now() + Duration::from_secs(1);
        for _ in 0..readers {
            let left = grace.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((i, text)) => parts[i] = text,
                Err(_) => break,
            }
        }
        Ok(ToolRun {
            command,
            code: if timed_out {
                None
            } else {
                status.and_then(|s| s.code())
            },
            timed_out,
            output: format!("{}{}", parts[0], parts[1]),
        })
    }

    /// The mode the board is in, from `nvpmodel -q`.
    pub fn query(&self) -> Result<LiveMode, NvpmodelRunError> {
        let run = self.run(&["-q"])?;
        match parse_query(&run.output) {
            Some(m) if !run.timed_out => Ok(m),
            _ => Err(NvpmodelRunError::Query {
                command: run.command.clone(),
                why: if run.timed_out {
                    format!(
                        "no answer within {} s: {}",
                        self.timeout.as_secs(),
                        run.output_line()
                    )
                } else {
                    format!(
                        "no `NV Power Mode:` in its output (exit code {}): {}",
                        run.code.map_or("none".into(), |c| c.to_string()),
                        run.output_line()
                    )
                },
            }),
        }
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Signals to a process group, which std does not offer.
mod signal {
    #![allow(unsafe_code)]

    /// Kills every process of the group `pgid` (the group a child was put in
    /// with `process_group(0)`, whose id is the child's pid), so a
    /// grandchild holding its pipes goes too.
    pub fn kill_group(pgid: u32) {
        let Ok(pgid) = libc::pid_t::try_from(pgid) else {
            return;
        };
        if pgid <= 1 {
            return;
        }
        // SAFETY: kill(2) takes two integers and touches no memory of ours;
        // `pgid` is above 1, so `-pgid` names one process group (the child's,
        // which it leads) and never "every process" (-1).
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for c in CONFS {
            assert!(c.mode(c.default_id).is_some(), "{}: default", c.name);
            assert!(!c.parts.is_empty(), "{}", c.name);
            for (i, m) in c.modes.iter().enumerate() {
                let online = m.online_cpus();
                assert!(online.contains(0), "{} {}: CPU 0 offline", c.name, m.name);
                assert!(
                    c.modes[..i]
                        .iter()
                        .all(|o| o.id != m.id && o.name != m.name),
                    "{} {}: duplicate",
                    c.name,
                    m.name
                );
            }
            assert_eq!(find_conf(&c.file_name()), Some(c));
        }
        for b in crate::board::BOARDS {
            let confs = confs_for(b);
            match &b.flash_config {
                None => assert!(confs.is_empty(), "{}", b.model),
                Some(_) => assert!(!confs.is_empty(), "{}: no nvpmodel table", b.model),
            }
            for c in confs {
                let most = c
                    .modes
                    .iter()
                    .map(|m| m.online_cpus())
                    .fold(CpuSet::new(), |a, s| a.union(&s));
                assert_eq!(
                    Some(most),
                    b.cpus.map(CpuSet::first),
                    "{} {}",
                    b.model,
                    c.name
                );
            }
        }
    }

    #[test]
    fn modes_by_name_or_id() {
        let m: NvpmodelMode = serde_json::from_str("2").unwrap();
        assert_eq!(m, NvpmodelMode::Id(2));
        let m: NvpmodelMode = serde_json::from_str("\"3\"").unwrap();
        assert_eq!(m, NvpmodelMode::Id(3));
        let m: NvpmodelMode = serde_json::from_str("\"maxn\"").unwrap();
        assert_eq!(m, NvpmodelMode::Name("maxn".into()));
        assert!(serde_json::from_str::<NvpmodelMode>("-1")
            .unwrap_err()
            .to_string()
            .contains("negative"));
        let nx = crate::board::find("jetson-orin-nx-16").unwrap();
        let r = resolve(nx, Some("p3767_0000_super"), &m).unwrap_err();
        assert!(
            r.to_string().contains("unknown nvpmodel mode `maxn`"),
            "{r}"
        );
        let r = resolve(
            nx,
            Some("nvpmodel_p3767_0000_super.conf"),
            &NvpmodelMode::Name("maxn_super".into()),
        )
        .unwrap();
        assert_eq!((r.mode.id, r.mode.name), (0, "MAXN_SUPER"));
    }

    #[test]
    fn status_and_query_output() {
        assert_eq!(parse_status("pmode:0002\n"), Some(2));
        assert_eq!(parse_status("pmode:0000 fmode:quiet\n"), Some(0));
        assert_eq!(parse_status("garbage"), None);
        let q = "NVPM WARN: fan mode is not set!\nNV Power Mode: 15W\n2\n";
        assert_eq!(
            parse_query(q),
            Some(LiveMode {
                id: 2,
                name: "15W".into()
            })
        );
        assert_eq!(parse_query("NV Power Mode: 15W\n"), None);
        assert!(asks_for_reboot(
            "NVPM WARN: Reboot required for changing to this power mode: 1\nNVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:"
        ));
        assert!(!asks_for_reboot("NV Power Mode: 15W"));
    }
}
