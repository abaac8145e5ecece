//! `deploy plan`: what the board will look like, from robot.yaml alone.

use std::fmt::Write as _;

use clap::Args;
use cpusets::board::BootLoader;
use cpusets::cmdline::{self, Token};
use cpusets::config::{IrqOverride, ThreadRule};
use serde::{Deserialize, Serialize};
use units::cpu::CpuSet;

use cpusets::plan::{Inventory, RuntimePlan};

use crate::ctx::{Ctx, Exit};
use services::robot::Robot;

#[derive(Debug, Args)]
pub struct PlanArgs {}

#[derive(Debug, Serialize, Deserialize)]
pub struct Plan {
    pub robot: String,
    pub board: BoardPlan,
    pub kernel: KernelPlan,
    pub cpus: CpuPlan,
    pub cmdline: CmdlinePlan,
    pub irqs: IrqPlan,
    pub processes: Vec<ProcessPlan>,
    pub channels: Vec<ChannelPlan>,
    /// What `deploy apply` writes on the robot, planned without the live
    /// IRQ and thread lists (those resolve on the robot): sysctls,
    /// workqueue cpumask, cgroups, cpufreq, cpu_dma_latency.
    pub runtime: RuntimePlan,
    /// What the bridge forwards where (robot.yaml `bridge:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<BridgePlanView>,
}

/// The bridge's links as `deploy plan` shows them.
#[derive(Debug, Serialize, Deserialize)]
pub struct BridgePlanView {
    pub mode: String,
    pub connect: Vec<String>,
    pub listen: Vec<String>,
    pub cpus: String,
    pub links: Vec<BridgeLinkView>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct BridgeLinkView {
    pub channel: String,
    /// `out` or `in`.
    pub direction: String,
    pub key: String,
    pub ros2: bool,
    pub reliable: bool,
    pub priority: u8,
    pub ttl_ns: Option<u64>,
    pub rate: Option<u32>,
    /// Inbound: the channel's cross-class bound, within which a real-time
    /// subscriber sees what the (best-effort) bridge brings in.
    pub cross_class_latency_ns: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct BoardPlan {
    pub model: String,
    pub arch: String,
    pub cpus: u32,
}

/// The board's kernel as robot.yaml declares it, and the wake backend the
/// event loops will get on it.
#[derive(Debug, Serialize, Deserialize)]
pub struct KernelPlan {
    /// `major.minor.patch`, when `kernel.version` or `kernel.l4t` says.
    pub version: Option<String>,
    /// Where the version comes from (`kernel.version`, or the L4T
    /// release and its JetPack).
    pub source: Option<String>,
    /// What that version offers the runtime and the CPU plan.
    pub capabilities: Option<controller::kernel::Capabilities>,
    /// The backend the event loops pick on that kernel (`io_uring-futex`,
    /// `futex_waitv`, `doorbell`), or none when the kernel is not declared
    /// (the loops probe at start).
    pub backend: Option<String>,
    /// Why that backend, in words.
    pub reason: String,
}

impl KernelPlan {
    fn new(r: &Robot) -> KernelPlan {
        use units::kernel::needs::{self, show};
        let Some(k) = r.kernel.declared() else {
            return KernelPlan {
                version: None,
                source: None,
                capabilities: None,
                backend: None,
                reason: "robot.yaml names no kernel (`kernel.version` or `kernel.l4t`): each event loop probes at start (io_uring-futex on 6.7+, futex_waitv on 5.16+, doorbell on any)".into(),
            };
        };
        let v = k.version;
        let caps = controller::kernel::Capabilities::of(v);
        let backend = controller::event_loop::Backend::expected_on(v);
        let reason = if caps.io_uring_futex {
            format!(
                "io_uring futex waits ({}+), unless io_uring is switched off or filtered on the board",
                show(needs::IO_URING_FUTEX)
            )
        } else if caps.futex_waitv {
            format!(
                "futex_waitv ({}+); no io_uring futex wait (needs {})",
                show(needs::FUTEX_WAITV),
                show(needs::IO_URING_FUTEX)
            )
        } else {
            format!(
                "no io_uring futex wait (needs {}) nor futex_waitv (needs {}): one futex per loop, rung by the publishers",
                show(needs::IO_URING_FUTEX),
                show(needs::FUTEX_WAITV)
            )
        };
        KernelPlan {
            version: Some(v.to_string()),
            source: Some(k.source),
            capabilities: Some(caps),
            backend: Some(backend.name().into()),
            reason,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CpuPlan {
    pub housekeeping: CpuSet,
    pub isolated: CpuSet,
    pub nohz_full: bool,
    pub clusters: Vec<ClusterPlan>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ClusterPlan {
    pub cpus: CpuSet,
    pub housekeeping: CpuSet,
    pub isolated: CpuSet,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CmdlinePlan {
    /// Where the line goes: `extlinux` (APPEND of the default label) or
    /// `external` (given by whoever starts the kernel).
    pub boot: BootLoader,
    pub line: String,
    pub tokens: Vec<Token>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct IrqPlan {
    pub default_affinity: CpuSet,
    pub overrides: Vec<IrqOverride>,
    pub threads: Vec<ThreadRule>,
    pub kthreads: Vec<ThreadRule>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ProcessPlan {
    pub name: String,
    pub start: usize,
    pub exec: String,
    pub policy: String,
    pub priority: Option<u32>,
    pub cpus: CpuSet,
    pub memlock: Option<String>,
    pub restart: services::config::Restart,
    pub stop_timeout: String,
    pub publishes: Vec<String>,
    pub subscribes: Vec<String>,
    /// The backend `RTDEPLOY_BACKEND` in the process's `env` forces, if
    /// any (otherwise the kernel's, see [`KernelPlan`], or the doorbell
    /// for a real-time process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Whose futex words it arms and wakes (see `controller::wake`), and
    /// why.
    pub wake_class: controller::WakeClass,
    pub wake_class_reason: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ChannelPlan {
    pub name: String,
    pub max_size: u64,
    pub rate: u32,
    pub retention: String,
    pub queue_len: u64,
    pub slot_bytes: u64,
    pub publishers: usize,
    pub subscribers: usize,
    /// Messages each subscribing process may hold in place at once.
    pub holds_per_subscriber: u32,
    /// What stays readable once read: `newest` or `unread` (see
    /// `controller::channel::Keep`).
    pub keep: String,
    /// Slots of the file: ring, a scratch per publisher entry, a reserve
    /// per hold.
    pub slots: u64,
    pub shm_bytes: u64,
    /// Bytes of slots messages cycle through (see
    /// `ChannelGeometry::working_set_bytes`).
    pub working_set_bytes: u64,
    /// Publishers and subscribers by wake class.
    pub classes: services::wake_class::ChannelClasses,
    /// How late a message may reach a subscriber of the other class.
    pub cross_class_latency: units::duration::Dur,
    /// Whether some publisher and subscriber are of different classes.
    pub crosses_classes: bool,
}

/// The plan of a valid robot.
pub fn plan(r: &Robot) -> anyhow::Result<Plan> {
    let runtime = cpusets::plan::plan(&r.isolation(), &Inventory::default())?;
    let all = r.all_cpus();
    let board = r.board.board().expect("validated board");
    let housekeeping = r.housekeeping();
    // The runtime plan holds the command line already: one computation.
    let tokens = runtime.cmdline.clone();
    let clusters = board
        .cluster_sets(all.len() as u32)
        .into_iter()
        .map(|c| ClusterPlan {
            housekeeping: c.intersection(&housekeeping),
            isolated: c.intersection(&r.cpus.isolated),
            cpus: c,
        })
        .collect();
    let order = services::config::start_order(&r.processes)
        .unwrap_or_else(|| (0..r.processes.len()).collect());
    let classes = r.wake_classes();
    let processes = order
        .iter()
        .enumerate()
        .map(|(n, &i)| {
            let p = &r.processes[i];
            ProcessPlan {
                name: p.name.clone(),
                start: n + 1,
                exec: p.exec.clone(),
                policy: p.policy.to_string(),
                priority: p.priority,
                cpus: r.process_cpus(p),
                memlock: p.memlock.map(|m| match m {
                    services::config::Memlock::Bytes(b) => b.to_string(),
                    services::config::Memlock::Unlimited => "unlimited".into(),
                }),
                restart: p.restart.clone(),
                stop_timeout: p.stop_timeout.to_string(),
                publishes: p.publishes.clone(),
                subscribes: p.subscribes.clone(),
                backend: p.env.get(units::env::BACKEND).cloned(),
                wake_class: classes[i].class,
                wake_class_reason: classes[i].reason.clone(),
            }
        })
        .collect();
    let channels = r
        .channels
        .iter()
        .map(|c| {
            let publishers = r.publishers_of(&c.name);
            let users = services::config::ChannelUsers::of(&r.processes, &c.name);
            let geom =
                controller::ChannelGeometry::from_config(c, users.publishers, users.subscribers);
            let on = services::wake_class::ChannelClasses::of(&c.name, &r.processes, &classes);
            ChannelPlan {
                name: c.name.clone(),
                max_size: c.max_size.0,
                rate: c.rate,
                retention: c.keeps(),
                queue_len: c.queue_len(),
                slot_bytes: c.slot_bytes(),
                publishers,
                subscribers: users.subscribers as usize,
                holds_per_subscriber: c.holds_per_subscriber(),
                keep: c.keep().to_string(),
                slots: geom.slots(),
                shm_bytes: geom.total_bytes(),
                working_set_bytes: geom.working_set_bytes(),
                crosses_classes: on.crosses(),
                classes: on,
                cross_class_latency: units::duration::Dur(c.cross_class_latency()),
            }
        })
        .collect();
    Ok(Plan {
        robot: r.robot.name.clone(),
        board: BoardPlan {
            model: board.model.to_string(),
            arch: board.arch.to_string(),
            cpus: all.len() as u32,
        },
        kernel: KernelPlan::new(r),
        cpus: CpuPlan {
            housekeeping,
            isolated: r.cpus.isolated.clone(),
            nohz_full: r.cpus.nohz_full,
            clusters,
        },
        cmdline: CmdlinePlan {
            boot: board.boot,
            line: cmdline::render(&tokens),
            tokens,
        },
        irqs: IrqPlan {
            default_affinity: runtime.irq_default.clone(),
            overrides: r.irqs.overrides.clone(),
            threads: r.irqs.threads.clone(),
            kthreads: r.irqs.kthreads.clone(),
        },
        processes,
        channels,
        runtime,
        bridge: bridge_view(r),
    })
}

/// The bridge's links, keys and the cross-class bounds of what comes in.
fn bridge_view(r: &Robot) -> Option<BridgePlanView> {
    let b = r.bridge.as_ref()?;
    let channels: Vec<(&str, u64)> = r
        .channels
        .iter()
        .map(|c| (c.name.as_str(), c.max_size.0))
        .collect();
    let types = r.log.as_ref().map(|l| l.types.clone()).unwrap_or_default();
    let plan = b.plan(&r.robot.name, &channels, &types);
    let cpus = r
        .processes
        .iter()
        .find(|p| p.name == services::bridge::PROCESS)
        .map(|p| r.process_cpus(p).to_string())
        .unwrap_or_default();
    let mut links = Vec::new();
    for l in &plan.links {
        for (out, dir) in [(true, "out"), (false, "in")] {
            let wanted = if out {
                l.direction.outbound()
            } else {
                l.direction.inbound()
            };
            if !wanted {
                continue;
            }
            links.push(BridgeLinkView {
                channel: l.channel.clone(),
                direction: dir.into(),
                key: l.key(&plan.robot, plan.domain_id, out),
                ros2: l.ros2.is_some(),
                reliable: l.reliable,
                priority: l.priority,
                ttl_ns: l.ttl_ns,
                rate: l.rate,
                cross_class_latency_ns: (!out)
                    .then(|| r.channels.iter().find(|c| c.name == l.channel))
                    .flatten()
                    .map(|c| c.cross_class_latency().as_nanos() as u64),
            });
        }
    }
    Some(BridgePlanView {
        mode: format!("{:?}", plan.mode).to_lowercase(),
        connect: plan.connect,
        listen: plan.listen,
        cpus,
        links,
    })
}

fn bridge_lines(o: &mut String, b: &BridgePlanView) {
    let list = |v: &[String]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(" ")
        }
    };
    let _ = writeln!(
        o,
        "bridge ({}, SCHED_OTHER on CPUs {}, never real-time; Zenoh {}, connect {}, listen {})",
        services::bridge::PROCESS,
        b.cpus,
        b.mode,
        list(&b.connect),
        list(&b.listen)
    );
    for l in &b.links {
        let arrow = if l.direction == "out" { "->" } else { "<-" };
        let mut notes = vec![
            if l.ros2 { "ROS 2" } else { "rtdeploy" }.to_string(),
            if l.reliable {
                "reliable"
            } else {
                "best effort"
            }
            .to_string(),
            format!("priority {}", l.priority),
        ];
        if let Some(t) = l.ttl_ns {
            notes.push(format!("ttl {}ms", t / 1_000_000));
        }
        if let Some(r) = l.rate {
            notes.push(format!("at most {r}/s"));
        }
        if let Some(x) = l.cross_class_latency_ns {
            notes.push(format!(
                "real-time subscribers see it within {}us (cross_class_latency)",
                x / 1000
            ));
        }
        let _ = writeln!(
            o,
            "  {:<3} {} {arrow} {}  ({})",
            l.direction,
            l.channel,
            l.key,
            notes.join(", ")
        );
    }
    o.push('\n');
}

pub fn run(ctx: &Ctx, _args: PlanArgs) -> anyhow::Result<Exit> {
    let loaded = super::load_robot(ctx)?;
    let plan = plan(&loaded.robot)?;
    if ctx.json {
        ctx.print_json(&plan)?;
    } else {
        crate::ctx::write_stdout(&render(&plan))?;
    }
    Ok(Exit::Ok)
}

fn rule_line(out: &mut String, r: &ThreadRule) {
    let prio = r.priority.map(|p| format!(" {p}")).unwrap_or_default();
    let cpus = r
        .cpus
        .as_ref()
        .map(|c| format!("cpus {c}"))
        .unwrap_or_else(|| "cpus unchanged".into());
    let _ = writeln!(out, "  {:<28} {}{prio:<4} {cpus}", r.describe(), r.policy);
}

/// The human form: a few aligned tables.
pub fn render(p: &Plan) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "robot {} on {} ({} CPUs, {})\n",
        p.robot, p.board.model, p.board.cpus, p.board.arch
    );
    match (&p.kernel.version, &p.kernel.backend) {
        (Some(v), Some(b)) => {
            let _ = writeln!(
                o,
                "kernel {v} ({}): wake backend {b}: {}\n",
                p.kernel.source.as_deref().unwrap_or("declared"),
                p.kernel.reason
            );
        }
        _ => {
            let _ = writeln!(o, "kernel: {}\n", p.kernel.reason);
        }
    }
    let _ = writeln!(o, "CPU map (H housekeeping, I isolated, - unused)");
    for c in &p.cpus.clusters {
        let cells: Vec<String> = c
            .cpus
            .iter()
            .map(|cpu| {
                let role = if c.isolated.contains(cpu) {
                    "I"
                } else if c.housekeeping.contains(cpu) {
                    "H"
                } else {
                    "-"
                };
                format!("{cpu}:{role}")
            })
            .collect();
        let _ = writeln!(o, "  cluster {:<8} {}", c.cpus.to_string(), cells.join(" "));
    }
    let _ = writeln!(
        o,
        "  housekeeping {}   isolated {}   nohz_full {}\n",
        p.cpus.housekeeping,
        p.cpus.isolated,
        if p.cpus.nohz_full { "on" } else { "off" }
    );
    let place = match p.cmdline.boot {
        BootLoader::Extlinux => "APPEND of the default label in /boot/extlinux/extlinux.conf",
        BootLoader::External => {
            "given by the boot loader or QEMU -append; also /etc/rtdeploy/cmdline"
        }
    };
    let _ = writeln!(o, "kernel command line ({place})");
    let _ = writeln!(o, "  {}", p.cmdline.line);
    let width = p
        .cmdline
        .tokens
        .iter()
        .map(|t| t.token.len())
        .max()
        .unwrap_or(0);
    for t in &p.cmdline.tokens {
        let _ = writeln!(o, "    {:<width$}  {}", t.token, t.reason);
    }
    let _ = writeln!(
        o,
        "\ninterrupts: default affinity {}",
        p.irqs.default_affinity
    );
    for ov in &p.irqs.overrides {
        let what = match (&ov.irq, &ov.name, &ov.interface) {
            (Some(n), _, _) => format!("irq {n}"),
            (None, Some(g), _) => format!("irqs named `{g}`"),
            (None, None, Some(i)) => format!("interface `{i}`"),
            (None, None, None) => String::new(),
        };
        let _ = writeln!(o, "  {what:<28} cpus {}", ov.cpus);
    }
    if !p.irqs.threads.is_empty() {
        let _ = writeln!(o, "IRQ threads");
        for r in &p.irqs.threads {
            rule_line(&mut o, r);
        }
    }
    if !p.irqs.kthreads.is_empty() {
        let _ = writeln!(o, "kernel threads");
        for r in &p.irqs.kthreads {
            rule_line(&mut o, r);
        }
    }
    let rt = &p.runtime;
    let _ = writeln!(o, "\nsysctl");
    for s in &rt.sysctls {
        let _ = writeln!(o, "  {} = {}  ({})", s.key, s.value, s.reason);
    }
    let _ = writeln!(o, "unbound workqueues on {}", rt.workqueue_cpumask);
    let g = &rt.cgroups;
    let _ = writeln!(
        o,
        "cgroups: rtdeploy/rt {} ({}), rtdeploy/housekeeping {}",
        g.rt,
        g.partition_value().unwrap_or("no partition"),
        g.housekeeping
    );
    if let Some(m) = &rt.power.nvpmodel {
        let _ = writeln!(
            o,
            "nvpmodel: mode {} ({}, {}): CPUs {} online, CPU clock cap {}",
            m.label(),
            m.conf,
            m.release,
            m.online,
            m.cpu_max_khz
                .map_or("none".to_string(), |k| format!("{k} kHz"))
        );
    }
    match &rt.cpufreq.governor {
        Some(gov) => {
            let _ = writeln!(o, "cpufreq: governor {gov} on every CPU");
        }
        None => {
            let _ = writeln!(o, "cpufreq: governor left alone");
        }
    }
    if !rt.cpufreq.lock_cpus.is_empty() {
        let _ = writeln!(
            o,
            "cpufreq: min = max frequency on {}",
            rt.cpufreq.lock_cpus
        );
    }
    match rt.cpu_dma_latency_us {
        Some(us) => {
            let _ = writeln!(o, "cpu_dma_latency: {us}us, held by the supervisor");
        }
        None => {
            let _ = writeln!(o, "cpu_dma_latency: not held");
        }
    }
    let _ = writeln!(o, "\nprocesses (in start order)");
    for pr in &p.processes {
        let prio = pr.priority.map(|p| format!(" {p}")).unwrap_or_default();
        let mut line = format!(
            "  {:>2} {:<16} {:<9} cpus {:<6}",
            pr.start,
            pr.name,
            format!("{}{prio}", pr.policy),
            pr.cpus.to_string()
        );
        if let Some(m) = &pr.memlock {
            let _ = write!(line, " memlock {m}");
        }
        if !pr.publishes.is_empty() {
            let _ = write!(line, " pub {}", pr.publishes.join(","));
        }
        if !pr.subscribes.is_empty() {
            let _ = write!(line, " sub {}", pr.subscribes.join(","));
        }
        if let Some(b) = &pr.backend {
            let _ = write!(line, " backend {b} ({})", units::env::BACKEND);
        }
        let _ = writeln!(o, "{}", line.trim_end());
        let _ = writeln!(o, "       {}: {}", pr.wake_class, pr.wake_class_reason);
    }
    let _ = writeln!(o, "\nchannels");
    for c in &p.channels {
        let _ = writeln!(
            o,
            "  {:<24} {:>6}/s x {:<6} -> {:>5} slots x {:>7} = {:>9}  ({} pub, {} sub)",
            c.name,
            c.rate,
            c.retention,
            c.queue_len,
            units::size::human(c.slot_bytes),
            units::size::human(c.shm_bytes),
            c.publishers,
            c.subscribers
        );
        let holds = c.slots - c.queue_len - c.publishers.max(1) as u64;
        let _ = writeln!(
            o,
            "    {} slots: {} ring + {} scratch + {holds} hold ({} per subscriber); keep {}; working set {}{}",
            c.slots,
            c.queue_len,
            c.publishers.max(1),
            c.holds_per_subscriber,
            c.keep,
            units::size::human(c.working_set_bytes),
            if c.keep == "unread" {
                " (1 slot: the newest written again once every subscriber has read it)"
            } else {
                ""
            }
        );
        let side = |m: &std::collections::BTreeMap<controller::WakeClass, Vec<String>>| {
            let parts: Vec<String> = m
                .iter()
                .map(|(class, names)| format!("{class} {}", names.join(",")))
                .collect();
            if parts.is_empty() {
                "none".to_string()
            } else {
                parts.join("; ")
            }
        };
        let _ = writeln!(
            o,
            "    pub {} -> sub {}",
            side(&c.classes.publishers),
            side(&c.classes.subscribers)
        );
        if c.crosses_classes {
            let _ = writeln!(
                o,
                "    across classes within {}: subscribers look every {} while the other class publishes",
                c.cross_class_latency,
                units::duration::Dur(c.cross_class_latency.0 / 2)
            );
        }
    }
    if let Some(b) = &p.bridge {
        bridge_lines(&mut o, b);
    }
    o
}
