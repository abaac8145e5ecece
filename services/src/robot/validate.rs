//! Parses `robot.yaml` section by section and checks it, reporting every
//! problem at once with its line, column and field path.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;
use units::cpu::CpuSet;

use super::de::from_node;
use super::echo;
use super::yaml::{self, Kind, Node, Pos};
use super::Robot;

/// The most diagnostics reported for one file; the rest are counted in a
/// last one. A file of a hundred thousand bad list elements would
/// otherwise print (and hold) a hundred thousand messages.
pub const MAX_DIAGNOSTICS: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One problem in `robot.yaml`.
#[derive(Debug, Clone, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    /// The field path, like `processes[2].priority`.
    pub field: String,
    pub message: String,
}

impl Diagnostic {
    /// A diagnostic whose field and message are escaped and cut to a
    /// readable length (they may quote the file).
    pub fn new(severity: Severity, file: &Path, pos: Pos, field: &str, message: &str) -> Self {
        Diagnostic {
            severity,
            file: file.to_path_buf(),
            line: pos.line,
            column: pos.col,
            field: echo::message(field),
            message: echo::message(message),
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(
            f,
            "{}:{}:{}: {sev}: ",
            self.file.display(),
            self.line,
            self.column
        )?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// The top-level sections, in the order they are documented.
pub const SECTIONS: &[&str] = &[
    "robot",
    "board",
    "cpus",
    "kernel",
    "irqs",
    "sysctl",
    "power",
    "channels",
    "processes",
    "check",
    "boot_check",
    "update",
    "metrics",
    "log",
    "watchdog",
    "bridge",
];

/// Channel names under this prefix are the runtime's own.
pub const RESERVED_CHANNEL_PREFIX: &str = "/rtdeploy/";

struct Checker<'a> {
    file: &'a Path,
    root: &'a Node,
    out: Vec<Diagnostic>,
    /// Problems found past [`MAX_DIAGNOSTICS`]: how many, whether one is
    /// an error, and where the first is.
    omitted: usize,
    omitted_error: bool,
    omitted_from: Pos,
}

impl<'a> Checker<'a> {
    fn new(file: &'a Path, root: &'a Node) -> Self {
        Checker {
            file,
            root,
            out: Vec::new(),
            omitted: 0,
            omitted_error: false,
            omitted_from: Pos::default(),
        }
    }

    fn push(&mut self, severity: Severity, pos: Pos, field: &str, message: String) {
        if self.out.len() >= MAX_DIAGNOSTICS {
            self.omit(severity, pos);
            return;
        }
        self.out
            .push(Diagnostic::new(severity, self.file, pos, field, &message));
    }

    /// Counts a problem past [`MAX_DIAGNOSTICS`].
    fn omit(&mut self, severity: Severity, pos: Pos) {
        if self.omitted == 0 {
            self.omitted_from = pos;
        }
        self.omitted += 1;
        self.omitted_error |= severity == Severity::Error;
    }

    /// A problem at the node its field path names.
    fn at(&mut self, severity: Severity, field: &str, message: String) {
        if self.out.len() >= MAX_DIAGNOSTICS && self.omitted > 0 {
            // Only counted: its place is not needed.
            self.omit(severity, Pos::default());
            return;
        }
        let pos = self.root.locate(field).pos;
        self.push(severity, pos, field, message);
    }

    /// The diagnostics, with one for those past [`MAX_DIAGNOSTICS`].
    fn finish(mut self) -> Vec<Diagnostic> {
        if self.omitted > 0 {
            let severity = if self.omitted_error {
                Severity::Error
            } else {
                Severity::Warning
            };
            let message = format!(
                "{} more problem{}, the first here, not listed (at most {MAX_DIAGNOSTICS} are reported)",
                self.omitted,
                if self.omitted == 1 { "" } else { "s" }
            );
            self.out.push(Diagnostic::new(
                severity,
                self.file,
                self.omitted_from,
                "",
                &message,
            ));
        }
        self.out
    }

    fn error(&mut self, field: &str, message: String) {
        self.at(Severity::Error, field, message);
    }

    fn warn(&mut self, field: &str, message: String) {
        self.at(Severity::Warning, field, message);
    }

    fn problems(&mut self, problems: Vec<(String, String)>) {
        for (field, message) in problems {
            self.error(&field, message);
        }
    }

    fn de<T: DeserializeOwned>(&mut self, node: &Node, path: &str) -> Option<T> {
        match from_node(node, path) {
            Ok(v) => Some(v),
            Err(e) => {
                let pos = e.pos.unwrap_or(node.pos);
                let field = if e.path.is_empty() {
                    path.to_string()
                } else {
                    e.path.clone()
                };
                self.push(Severity::Error, pos, &field, e.message);
                None
            }
        }
    }

    /// A section: deserialised when present, else its default (or an
    /// error when it is required).
    fn section<T: DeserializeOwned + Default>(&mut self, name: &str) -> Option<T> {
        match self.root.get(name) {
            Some(node) => self.de(node, name),
            None => Some(T::default()),
        }
    }

    fn required<T: DeserializeOwned>(&mut self, name: &str, example: &str) -> Option<T> {
        match self.root.get(name) {
            Some(node) => self.de(node, name),
            None => {
                self.push(
                    Severity::Error,
                    self.root.pos,
                    name,
                    format!("missing section `{name}` (expected, for example, `{example}`)"),
                );
                None
            }
        }
    }

    /// A list section, each element on its own so that every bad element
    /// is reported; the elements that parsed with their index in the file,
    /// and whether all did.
    fn list<T: DeserializeOwned>(&mut self, name: &str) -> (Vec<(usize, T)>, bool) {
        let Some(node) = self.root.get(name) else {
            return (Vec::new(), true);
        };
        let items = match &node.kind {
            Kind::Seq(items) => items,
            Kind::Scalar { text, plain: true }
                if text.is_empty() || text == "~" || text == "null" =>
            {
                return (Vec::new(), true)
            }
            _ => {
                self.push(
                    Severity::Error,
                    node.pos,
                    name,
                    format!("`{name}` must be a list (`- name: ...` entries)"),
                );
                return (Vec::new(), false);
            }
        };
        let mut ok = true;
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match self.de(item, &format!("{name}[{i}]")) {
                Some(v) => out.push((i, v)),
                None => ok = false,
            }
        }
        (out, ok)
    }
}

/// Parses and checks `text`; the robot is returned when every section
/// parsed (it may still have errors in the diagnostics).
pub fn parse_and_validate(file: &Path, text: &str) -> (Option<Robot>, Vec<Diagnostic>) {
    let root = match yaml::parse(text) {
        Ok(root) => root,
        Err(e) => {
            return (
                None,
                vec![Diagnostic::new(
                    Severity::Error,
                    file,
                    e.pos,
                    "",
                    &e.message,
                )],
            );
        }
    };
    let mut c = Checker::new(file, &root);
    let robot = check_sections(&mut c);
    (robot, c.finish())
}

/// Deserialises and checks every section, then the rules across them.
fn check_sections(c: &mut Checker) -> Option<Robot> {
    let root = c.root;
    let Kind::Map(entries) = &root.kind else {
        c.push(
            Severity::Error,
            root.pos,
            "",
            "the file must be a mapping of sections (`robot:`, `board:`, `cpus:`, ...)".into(),
        );
        return None;
    };
    for (key, _) in entries.iter() {
        let name = key.as_str().unwrap_or("");
        if !SECTIONS.contains(&name) {
            c.push(
                Severity::Error,
                key.pos,
                name,
                format!(
                    "unknown section `{}` (expected one of: {})",
                    echo::value(name),
                    SECTIONS.join(", ")
                ),
            );
        }
    }

    let robot: Option<crate::config::RobotSection> = c.required("robot", "robot: {name: arm-1}");
    let board: Option<cpusets::config::BoardSection> =
        c.required("board", "board: {model: jetson-orin-nano}");
    let cpus: Option<cpusets::config::CpusSection> = c.required("cpus", "cpus: {isolated: 4-5}");
    let kernel: Option<cpusets::config::KernelSection> = c.section("kernel");
    let irqs: Option<cpusets::config::IrqsSection> = c.section("irqs");
    let sysctl: Option<cpusets::config::SysctlSection> = c.section("sysctl");
    let power: Option<cpusets::config::PowerSection> = c.section("power");
    let (channels, channels_ok) = c.list::<controller::config::ChannelConfig>("channels");
    let (processes, processes_ok) = c.list::<crate::config::ProcessConfig>("processes");
    let check: Option<check::config::CheckSection> = c.section("check");
    let boot_check: Option<check::config::BootCheckSection> = c.section("boot_check");
    let update: Option<crate::config::UpdateSection> = c.section("update");
    let metrics: Option<crate::config::MetricsSection> = c.section("metrics");
    // Absent: no logger. Present (even empty): the logger with defaults.
    let log: Option<Option<logbook::LogSection>> = if c.root.get("log").is_some() {
        c.section("log").map(Some)
    } else {
        Some(None)
    };
    let watchdog: Option<Option<crate::config::WatchdogSection>> =
        if c.root.get("watchdog").is_some() {
            c.section("watchdog").map(Some)
        } else {
            Some(None)
        };
    let bridge: Option<Option<crate::bridge::BridgeSection>> = match c.root.get("bridge") {
        Some(node) => c.de(node, "bridge").map(Some),
        None => Some(None),
    };

    // Each section's own rules, on every section that parsed.
    let mut p = Vec::new();
    if let Some(robot) = &robot {
        robot.validate(&mut p);
    }
    if let Some(board) = &board {
        board.validate(&mut p);
        if let Some(cpus) = &cpus {
            cpus.validate(board, &mut p);
        }
    }
    if let Some(kernel) = &kernel {
        kernel.validate(&mut p);
        if let Some(board) = &board {
            kernel.validate_board(board, &mut p);
        }
        if let Some(cpus) = &cpus {
            kernel.validate_cpus(cpus, &mut p);
        }
    }
    let all = board.as_ref().and_then(|b| b.all_cpus());
    if let Some(irqs) = &irqs {
        irqs.validate(all.as_ref(), &mut p);
    }
    if let Some(sysctl) = &sysctl {
        cpusets::config::validate_sysctl(sysctl, &mut p);
    }
    if let Some(power) = &power {
        power.validate(&mut p);
    }
    // List elements keep their index in the file even when an earlier
    // one did not parse.
    for (i, ch) in &channels {
        ch.validate(&format!("channels[{i}]"), &mut p);
    }
    for (i, pr) in &processes {
        pr.validate(&format!("processes[{i}]"), &mut p);
    }
    if let Some(check) = &check {
        check.validate("check", &mut p);
    }
    if let Some(boot_check) = &boot_check {
        boot_check.validate(&mut p);
    }
    if let Some(update) = &update {
        update.validate(&mut p);
    }
    if let Some(metrics) = &metrics {
        metrics.validate(&mut p);
    }
    if let Some(Some(w)) = &watchdog {
        w.validate(&mut p);
    }
    let names: Vec<(&str, u64)> = channels
        .iter()
        .map(|(_, c)| (c.name.as_str(), c.max_size.0))
        .collect();
    if let Some(Some(log)) = &log {
        log.validate(&names, &mut p);
    }
    if let Some(Some(b)) = &bridge {
        let none = Default::default();
        let types = match &log {
            Some(Some(l)) => &l.types,
            _ => &none,
        };
        b.validate(&names, types, &mut p);
    }
    c.problems(p);

    // The rules across sections need every section whole.
    let parsed = (|| {
        Some(Robot {
            robot: robot?,
            board: board?,
            cpus: cpus?,
            kernel: kernel?,
            irqs: irqs?,
            sysctl: sysctl?,
            power: power?,
            channels: whole(channels_ok, channels)?,
            processes: whole(processes_ok, processes)?,
            check: check?,
            boot_check: boot_check?,
            update: update?,
            metrics: metrics?,
            log: log?,
            watchdog: watchdog?,
            bridge: bridge?,
        })
    })();
    let mut r = parsed?;
    // The bridge is a process of the supervisor's table: on the
    // housekeeping CPUs, SCHED_OTHER, a publisher of the channels it
    // brings in. robot.yaml may not name a process so.
    if let Some(b) = &r.bridge {
        if let Some(i) = r
            .processes
            .iter()
            .position(|p| p.name == crate::bridge::PROCESS)
        {
            c.error(
                &format!("processes[{i}].name"),
                format!(
                    "`{}` is the bridge's own process (choose another name)",
                    crate::bridge::PROCESS
                ),
            );
        }
        let channels: Vec<(&str, u64)> = r
            .channels
            .iter()
            .map(|c| (c.name.as_str(), c.max_size.0))
            .collect();
        let types = r.log.as_ref().map(|l| l.types.clone()).unwrap_or_default();
        let plan = b.plan(&r.robot.name, &channels, &types);
        let plan_len = serde_json::to_string(&plan).map_or(0, |t| t.len());
        if plan_len > crate::bridge::MAX_PLAN {
            c.error(
                "bridge.forward",
                format!(
                    "the bridge's plan takes {plan_len} bytes, more than the {} its environment carries (forward fewer channels)",
                    crate::bridge::MAX_PLAN
                ),
            );
        }
        let process = serde_json::json!({
            "name": crate::bridge::PROCESS,
            "exec": b.exec,
            "policy": "other",
            "publishes": b.inbound(&channels),
            "restart": {"policy": "always"},
            "env": {crate::bridge::PLAN_ENV: serde_json::to_string(&plan).unwrap_or_default()},
        });
        match serde_json::from_value::<crate::config::ProcessConfig>(process) {
            Ok(p) => r.processes.push(p),
            Err(e) => c.error("bridge", format!("cannot make the bridge's process: {e}")),
        }
    }
    cross_check(c, &r);
    Some(r)
}

/// The elements of a list section, when every one of them parsed.
fn whole<T>(all_parsed: bool, items: Vec<(usize, T)>) -> Option<Vec<T>> {
    all_parsed.then(|| items.into_iter().map(|(_, v)| v).collect())
}

/// Adds `name`, element `i` of the list `list` (whose elements are each a
/// `kind`), to `index`, refusing it when an earlier element has the same
/// name.
fn index_name<'r>(
    c: &mut Checker,
    index: &mut HashMap<&'r str, usize>,
    (list, kind): (&str, &str),
    i: usize,
    name: &'r str,
) {
    if let Some(first) = index.insert(name, i) {
        c.error(
            &format!("{list}[{i}].name"),
            format!(
                "{kind} `{}` is already defined at {list}[{first}] (names must be unique)",
                echo::value(name)
            ),
        );
    }
}

/// The rules that span sections.
fn cross_check(c: &mut Checker, r: &Robot) {
    channel_memory(c, r);
    // Boot attempts are counted by a U-Boot script: a board that boots
    // extlinux.conf through U-Boot.
    if r.update.boot_attempts.is_some() {
        if let Some(board) = r.board.board() {
            let why = if board.flash_config.is_some() {
                Some("Jetson boards boot through UEFI (L4TLauncher), which runs no U-Boot script; their boot attempts are the rootfs A/B slots' retry count, which rtdeploy does not manage yet (remove it)")
            } else if board.boot != cpusets::board::BootLoader::Extlinux {
                Some("this board's boot loader is not one rtdeploy writes extlinux.conf for, so a system update has no label to count (remove it)")
            } else {
                None
            };
            if let Some(why) = why {
                c.error(
                    "update.boot_attempts",
                    format!("board `{}`: {why}", board.model),
                );
            }
        }
        if !r.kernel.cmdline.iter().any(|t| t.starts_with("panic=")) {
            c.warn(
                "update.boot_attempts",
                "a kernel panic does not reboot without `panic=N` on the command line, so a panicking boot counts no attempt until a watchdog resets the board (add `panic=10` to kernel.cmdline, unless the base's command line has one)".into(),
            );
        }
    }
    // Command line tokens of another architecture: the kernel ignores them.
    if let Some(board) = r.board.board() {
        for (i, tok) in r.kernel.cmdline.iter().enumerate() {
            if let Some(arch) = cpusets::cmdline::foreign_arch(tok, board.arch) {
                c.warn(
                    &format!("kernel.cmdline[{i}]"),
                    format!(
                        "`{}` is a {arch} parameter; board `{}` is {} and its kernel ignores it (remove it)",
                        echo::value(tok),
                        board.model,
                        board.arch
                    ),
                );
            }
        }
    }
    // Unknown when `board:` was refused: that error is reported, not one
    // more for each CPU set measured against no CPUs.
    let board_cpus = r.board.all_cpus();
    let all = board_cpus.clone().unwrap_or_default();
    let isolated = &r.cpus.isolated;
    let housekeeping = r.housekeeping();

    // Names are unique.
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, ch) in r.channels.iter().enumerate() {
        index_name(c, &mut seen, ("channels", "channel"), i, &ch.name);
        if ch.name.starts_with(RESERVED_CHANNEL_PREFIX) {
            c.error(
                &format!("channels[{i}].name"),
                format!("`{}` is under `{RESERVED_CHANNEL_PREFIX}`, which the runtime keeps for its timing reports (choose another name)", echo::value(&ch.name)),
            );
        }
        let publishers = r.publishers_of(&ch.name);
        if ch.keep() == controller::channel::Keep::Unread && publishers > 1 {
            c.error(
                &format!("channels[{i}].keep"),
                format!("keep: unread on `{}`, which {publishers} processes publish (a publisher writes into the newest slot again only when it is the channel's one publisher: one process, or keep: newest)", echo::value(&ch.name)),
            );
        }
    }
    let channel_names: HashSet<&str> = r.channels.iter().map(|c| c.name.as_str()).collect();
    let mut procs: HashMap<&str, usize> = HashMap::new();
    for (i, p) in r.processes.iter().enumerate() {
        index_name(c, &mut procs, ("processes", "process"), i, &p.name);
    }

    let mut published: HashSet<&str> = HashSet::new();
    for (i, p) in r.processes.iter().enumerate() {
        let base = format!("processes[{i}]");
        // The wake class is robot.yaml's placement, set by the supervisor.
        for var in [units::env::WAKE_CLASS, units::env::SCHED] {
            if p.env.contains_key(var) {
                c.error(
                    &format!("{base}.env.{var}"),
                    format!(
                        "`{var}` is set by the supervisor from the process's placement (its wake class follows its policy, priority and CPUs); remove it from `env`"
                    ),
                );
            }
        }
        // A forced wake backend: known, and one the declared kernel has.
        if let Some(name) = p.env.get(units::env::BACKEND) {
            let field = format!("{base}.env.{}", units::env::BACKEND);
            match controller::event_loop::Backend::from_name(name) {
                None => c.error(
                    &field,
                    format!(
                        "unknown wake backend `{}` (expected one of: {})",
                        echo::value(name),
                        controller::event_loop::Backend::ALL
                            .map(|b| b.name())
                            .join(", ")
                    ),
                ),
                Some(b) => {
                    if let Some(k) = r.kernel.declared() {
                        let caps = controller::kernel::Capabilities::of(k.version);
                        use controller::event_loop::Backend;
                        use units::kernel::needs;
                        let need = match b {
                            Backend::IoUringFutex if !caps.io_uring_futex => {
                                Some(needs::IO_URING_FUTEX)
                            }
                            Backend::FutexWaitv if !caps.futex_waitv => Some(needs::FUTEX_WAITV),
                            _ => None,
                        };
                        if let Some(need) = need {
                            c.error(
                                &field,
                                format!(
                                    "backend `{b}` needs Linux {} or later; the board runs {}.{} ({}); remove it (the loop picks the best the kernel has) or force `doorbell`",
                                    units::kernel::needs::show(need),
                                    k.version.major,
                                    k.version.minor,
                                    k.source
                                ),
                            );
                        }
                    }
                }
            }
        }
        // Placement.
        let cpus = r.process_cpus(p);
        let beyond = match &board_cpus {
            Some(all) => cpus.difference(all),
            None => CpuSet::new(),
        };
        if !beyond.is_empty() {
            c.error(
                &format!("{base}.cpus"),
                format!(
                    "CPUs {beyond} do not exist on board `{}` (expected CPUs within {all})",
                    r.board.model
                ),
            );
        } else if p.policy.is_realtime() {
            let outside = cpus.difference(isolated);
            if !outside.is_empty() && !p.allow_housekeeping {
                c.error(
                    &format!("{base}.cpus"),
                    format!(
                        "real-time process `{}` ({} {}) would run on non-isolated CPUs {outside} (expected CPUs within the isolated set {isolated}, or `allow_housekeeping: true` to allow it)",
                        echo::value(&p.name),
                        p.policy,
                        p.priority.unwrap_or(0)
                    ),
                );
            }
            if p.memlock.is_none() {
                c.warn(
                    &base,
                    format!(
                        "real-time process `{}` has no `memlock`: mlockall fails beyond the default RLIMIT_MEMLOCK (set e.g. `memlock: 256MiB` or `unlimited`)",
                        echo::value(&p.name)
                    ),
                );
            }
            if p.priority == Some(99) {
                c.warn(
                    &format!("{base}.priority"),
                    "priority 99 leaves no room above it for the kernel threads that must preempt (watchdog, migration); 98 or below is usual".into(),
                );
            }
        } else {
            let on_isolated = cpus.intersection(isolated);
            if !on_isolated.is_empty() {
                c.warn(
                    &format!("{base}.cpus"),
                    format!(
                        "non-real-time process `{}` runs on isolated CPUs {on_isolated}, where it competes with the real-time processes",
                        echo::value(&p.name)
                    ),
                );
            }
            if p.allow_housekeeping {
                c.warn(
                    &format!("{base}.allow_housekeeping"),
                    format!("has no effect for policy `{}`", p.policy),
                );
            }
        }
        // Channels.
        for (field, list) in [("publishes", &p.publishes), ("subscribes", &p.subscribes)] {
            for (j, name) in list.iter().enumerate() {
                if !channel_names.contains(name.as_str()) {
                    c.error(
                        &format!("{base}.{field}[{j}]"),
                        format!(
                            "no channel `{}` (expected one of the names under `channels:`: {})",
                            echo::value(name),
                            channel_list(&r.channels)
                        ),
                    );
                }
            }
        }
        published.extend(p.publishes.iter().map(String::as_str));
        // Start order.
        for (j, dep) in p.after.iter().enumerate() {
            if dep == &p.name {
                c.error(
                    &format!("{base}.after[{j}]"),
                    format!("process `{}` cannot start after itself", echo::value(dep)),
                );
            } else if !procs.contains_key(dep.as_str()) {
                c.error(
                    &format!("{base}.after[{j}]"),
                    format!(
                        "no process `{}` (expected a name under `processes:`)",
                        echo::value(dep)
                    ),
                );
            }
        }
    }
    for (i, p) in r.processes.iter().enumerate() {
        for (j, name) in p.subscribes.iter().enumerate() {
            if channel_names.contains(name.as_str()) && !published.contains(name.as_str()) {
                c.warn(
                    &format!("processes[{i}].subscribes[{j}]"),
                    format!("no process publishes on `{}`", echo::value(name)),
                );
            }
        }
    }
    if let Some(cycle) = start_order_cycle(r) {
        let i = procs[cycle[0].as_str()];
        c.error(
            &format!("processes[{i}].after"),
            format!(
                "start order has a cycle: {} (expected `after:` to form no loop)",
                cycle
                    .iter()
                    .map(|n| echo::value(n))
                    .collect::<Vec<_>>()
                    .join(" -> ")
            ),
        );
    }

    // Messages that cross wake classes arrive up to the channel's
    // cross-class bound late: say where that exceeds a real-time
    // subscriber's budget.
    let classes = r.wake_classes();
    for (ci, ch) in r.channels.iter().enumerate() {
        let on = crate::wake_class::ChannelClasses::of(&ch.name, &r.processes, &classes);
        let Some(be_pubs) = on.publishers.get(&controller::WakeClass::BestEffort) else {
            continue;
        };
        let bound = ch.cross_class_latency();
        for (i, p) in r.processes.iter().enumerate() {
            if classes[i].class != controller::WakeClass::RealTime
                || !p.subscribes.iter().any(|n| n == &ch.name)
            {
                continue;
            }
            let budget = [p.budgets.wakeup, ch.budget].into_iter().flatten().min();
            if let Some(b) = budget.filter(|b| b.0 < bound) {
                c.warn(
                    &format!("channels[{ci}].cross_class_latency"),
                    format!(
                        "real-time process `{}` subscribes to `{}`, where best-effort {} `{}` publish{}: those messages reach it up to {} late (the cross-class bound), beyond its budget {b} (lower `cross_class_latency`, or place the publisher where it is real-time)",
                        echo::value(&p.name),
                        echo::value(&ch.name),
                        if be_pubs.len() == 1 { "process" } else { "processes" },
                        be_pubs.iter().map(|n| echo::value(n)).collect::<Vec<_>>().join("`, `"),
                        if be_pubs.len() == 1 { "es" } else { "" },
                        units::duration::Dur(bound)
                    ),
                );
            }
        }
    }

    // IRQ threads and the processes they feed.
    for (i, rule) in r.irqs.threads.iter().chain(&r.irqs.kthreads).enumerate() {
        let field = if i < r.irqs.threads.len() {
            format!("irqs.threads[{i}]")
        } else {
            format!("irqs.kthreads[{}]", i - r.irqs.threads.len())
        };
        for (j, fed) in rule.feeds.iter().enumerate() {
            let Some(&pi) = procs.get(fed.as_str()) else {
                c.error(
                    &format!("{field}.feeds[{j}]"),
                    format!(
                        "no process `{}` (expected a name under `processes:`)",
                        echo::value(fed)
                    ),
                );
                continue;
            };
            let p = &r.processes[pi];
            let (Some(pp), Some(rp)) = (p.priority, rule.priority) else {
                continue;
            };
            let rule_cpus = rule.cpus.clone().unwrap_or_else(|| all.clone());
            let shared = rule_cpus.intersection(&r.process_cpus(p));
            if p.policy.is_realtime() && rule.policy.is_realtime() && pp > rp && !shared.is_empty()
            {
                c.warn(
                    &format!("{field}.priority"),
                    format!(
                        "process `{}` ({} {pp}) runs above the IRQ threads {} ({} {rp}) that feed it on CPUs {shared}: while it runs, its own input waits",
                        echo::value(&p.name),
                        p.policy,
                        echo::value(&rule.describe()),
                        rule.policy
                    ),
                );
            }
        }
    }

    // CPUs.
    let neither = all.difference(&housekeeping).difference(isolated);
    if !neither.is_empty() {
        c.warn(
            "cpus.housekeeping",
            format!(
                "CPUs {neither} are neither housekeeping nor isolated; nothing is placed on them"
            ),
        );
    }
    if let Some(aff) = &r.irqs.default_affinity {
        let on_isolated = aff.intersection(isolated);
        if !on_isolated.is_empty() {
            c.warn(
                "irqs.default_affinity",
                format!("interrupts would land on isolated CPUs {on_isolated}"),
            );
        }
    }

    // The power mode: one of the board's nvpmodel modes, and one that keeps
    // online every CPU the robot puts work on.
    if r.power.nvpmodel.is_some() {
        let mut uses: Vec<(String, CpuSet)> = vec![("cpus.isolated".into(), isolated.clone())];
        for (i, p) in r.processes.iter().enumerate() {
            uses.push((
                format!("processes[{i}] `{}`", echo::value(&p.name)),
                r.process_cpus(p),
            ));
        }
        for (field, rules) in [("threads", &r.irqs.threads), ("kthreads", &r.irqs.kthreads)] {
            for (i, rule) in rules.iter().enumerate() {
                if let Some(set) = &rule.cpus {
                    uses.push((format!("irqs.{field}[{i}].cpus"), set.clone()));
                }
            }
        }
        for (i, o) in r.irqs.overrides.iter().enumerate() {
            uses.push((format!("irqs.overrides[{i}].cpus"), o.cpus.clone()));
        }
        if let Some(aff) = &r.irqs.default_affinity {
            uses.push(("irqs.default_affinity".into(), aff.clone()));
        }
        let mut p = Vec::new();
        r.power.validate_board(&r.board, &uses, &mut p);
        c.problems(p);
    }
}

/// The channel names a reference may use, for a message: the first few,
/// each cut short, and how many more there are.
/// Holds the channels' shared memory against each process's `memlock`
/// (a process that locks its memory locks every channel it maps, and with
/// `MCL_FUTURE` a mapping past the limit fails) and against the board's
/// memory (channel files live in /dev/shm, a tmpfs of half the memory
/// unless mounted otherwise).
fn channel_memory(c: &mut Checker, r: &Robot) {
    use controller::config::{MAX_CHANNEL_BYTES, MAX_MESSAGE_SIZE, MAX_QUEUE_LEN};
    let bytes: BTreeMap<&str, u64> = r
        .channels
        .iter()
        .filter(|ch| {
            ch.max_size.0 <= MAX_MESSAGE_SIZE
                && ch.checked_queue_len().is_some_and(|l| l <= MAX_QUEUE_LEN)
        })
        .map(|ch| {
            let users = crate::config::ChannelUsers::of(&r.processes, &ch.name);
            let b = ch.shm_bytes(users.publishers.into(), users.subscribers.into());
            (ch.name.as_str(), b.min(MAX_CHANNEL_BYTES))
        })
        .collect();
    for (i, p) in r.processes.iter().enumerate() {
        let Some(crate::config::Memlock::Bytes(limit)) = p.memlock else {
            continue;
        };
        let mapped: BTreeSet<&str> = p
            .publishes
            .iter()
            .chain(&p.subscribes)
            .map(String::as_str)
            .filter(|n| bytes.contains_key(n))
            .collect();
        let total: u64 = mapped.iter().map(|n| bytes[n]).sum();
        if total > limit.0 {
            let each: Vec<String> = mapped
                .iter()
                .map(|n| format!("{} {}", echo::value(n), units::size::human(bytes[n])))
                .collect();
            c.error(
                &format!("processes[{i}].memlock"),
                format!(
                    "process `{}` maps {} of channels ({}), more than its memlock {limit}: once it locks its memory, mapping them fails (raise `memlock`, or lower the channels' `max_size`, `depth`/`retention` or `holds`)",
                    echo::value(&p.name),
                    units::size::human(total),
                    each.join(", ")
                ),
            );
        }
    }
    if let Some(memory) = r.board.memory() {
        let total: u64 = bytes.values().sum();
        let mib = units::size::human;
        if total > memory {
            c.error(
                "channels",
                format!(
                    "the channels take {} of shared memory, more than the board's {} (lower `max_size`, `depth`/`retention` or `holds`; `board.memory` if the module has more)",
                    mib(total),
                    mib(memory)
                ),
            );
        } else if total > memory / 2 {
            c.warn(
                "channels",
                format!(
                    "the channels take {} of shared memory, more than half the board's {}: /dev/shm is a tmpfs of half the memory unless mounted larger",
                    mib(total),
                    mib(memory)
                ),
            );
        }
    }
}

fn channel_list(channels: &[controller::config::ChannelConfig]) -> String {
    const SHOWN: usize = 8;
    if channels.is_empty() {
        return "none defined".into();
    }
    let mut list: Vec<String> = channels
        .iter()
        .take(SHOWN)
        .map(|c| echo::value(&c.name))
        .collect();
    if channels.len() > SHOWN {
        list.push(format!("and {} more", channels.len() - SHOWN));
    }
    list.join(", ")
}

/// A cycle in the `after:` graph, as a list of names ending where it began.
fn start_order_cycle(r: &Robot) -> Option<Vec<String>> {
    let deps: BTreeMap<&str, Vec<&str>> = r
        .processes
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.after.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Active,
        Done,
    }
    let mut marks: HashMap<&str, Mark> = deps.keys().map(|k| (*k, Mark::New)).collect();
    fn visit<'a>(
        n: &'a str,
        deps: &BTreeMap<&'a str, Vec<&'a str>>,
        marks: &mut HashMap<&'a str, Mark>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        match marks.get(n) {
            Some(Mark::Done) | None => return None,
            Some(Mark::Active) => {
                let start = stack.iter().position(|s| *s == n).unwrap_or(0);
                let mut cycle: Vec<String> = stack[start..].iter().map(|s| s.to_string()).collect();
                cycle.push(n.to_string());
                return Some(cycle);
            }
            Some(Mark::New) => {}
        }
        marks.insert(n, Mark::Active);
        stack.push(n);
        for d in deps.get(n).into_iter().flatten() {
            if *d != n {
                if let Some(c) = visit(d, deps, marks, stack) {
                    return Some(c);
                }
            }
        }
        stack.pop();
        marks.insert(n, Mark::Done);
        None
    }
    for k in deps.keys() {
        if let Some(c) = visit(k, &deps, &mut marks, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}
