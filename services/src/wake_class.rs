//! Each process's wake class, decided from robot.yaml alone (see
//! [`controller::wake`] for what a class means at run time).
//!
//! A process is real-time for its channels only when robot.yaml places it
//! where nothing can preempt it while it wakes a subscriber: a fifo/rr
//! policy, every CPU it may run on isolated, and on each of them a
//! priority above every kernel thread that may run there (threaded IRQ
//! handlers the plan puts there, `ktimers/N` and `rcuc/N` at the kernel's
//! SCHED_FIFO 1 unless `irqs.kthreads` sets them) and no lower than every
//! other process there (threads of equal SCHED_FIFO priority do not
//! preempt each other). The check's burst threads run on the housekeeping
//! CPUs and so never count. Everything else, a FIFO 30 thread on a
//! housekeeping CPU included, is best-effort: that thread is exactly the
//! lower-priority holder of the background letter, preempted by an IRQ
//! thread while it holds a lock a real-time wake needs.
//!
//! The class is a property of the placement, not of the policy a thread
//! runs with: the supervisor passes it to the process
//! ([`units::env::WAKE_CLASS`], with the policy it was decided from in
//! [`units::env::SCHED`]), and the runtime only checks the attaching
//! thread against that policy.

use std::collections::BTreeMap;

use controller::wake::WakeClass;
use cpusets::config::IrqsSection;
use serde::Serialize;
use units::cpu::CpuSet;
use units::env::{ProcessEnv, SchedSpec};

use crate::config::ProcessConfig;

/// The priority the kernel gives the interrupt threads it creates
/// (`irq/N-name`, SCHED_FIFO 50) when no `irqs.threads` rule sets one.
pub const KERNEL_IRQ_THREAD_PRIORITY: u32 = 50;
/// The priority of the per-CPU `ktimers/N` and `rcuc/N` threads on
/// PREEMPT_RT (SCHED_FIFO 1) when no `irqs.kthreads` rule sets one.
pub const KERNEL_PER_CPU_PRIORITY: u32 = 1;

/// One process's class and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessClass {
    pub process: String,
    pub class: WakeClass,
    /// A sentence: what placed it in its class.
    pub reason: String,
}

/// The placement facts the decision needs, as plain values.
pub struct Placement<'a> {
    pub processes: &'a [ProcessConfig],
    /// The CPUs each process runs on (same order as `processes`).
    pub cpus: &'a [CpuSet],
    pub isolated: &'a CpuSet,
    pub irqs: &'a IrqsSection,
}

/// A thread that may run on a CPU, above which a real-time process must
/// be.
struct Competitor {
    what: String,
    priority: u32,
}

impl Placement<'_> {
    /// The kernel threads that may run on `cpu`, with their priorities.
    fn kernel_threads_on(&self, cpu: u32) -> Vec<Competitor> {
        let mut out = Vec::new();
        // Per-CPU threads exist on every CPU; a rule may raise them.
        for name in ["ktimers", "rcuc"] {
            let glob = format!("{name}/{cpu}");
            let rule = self.irqs.kthreads.iter().rev().find(|r| {
                r.pattern
                    .as_deref()
                    .is_some_and(|p| cpusets::model::glob_match(p, &glob))
                    && r.cpus.as_ref().is_none_or(|c| c.contains(cpu))
            });
            let priority = match rule {
                Some(r) if r.policy.is_realtime() => r.priority.unwrap_or(1),
                Some(_) => 0,
                None => KERNEL_PER_CPU_PRIORITY,
            };
            if priority > 0 {
                out.push(Competitor {
                    what: format!("{name}/{cpu} (fifo {priority})"),
                    priority,
                });
            }
        }
        // Interrupt threads the plan puts on this CPU.
        for r in &self.irqs.threads {
            if r.policy.is_realtime() && r.cpus.as_ref().is_some_and(|c| c.contains(cpu)) {
                let p = r.priority.unwrap_or(KERNEL_IRQ_THREAD_PRIORITY);
                out.push(Competitor {
                    what: format!("IRQ threads {} ({} {p})", r.describe(), r.policy),
                    priority: p,
                });
            }
        }
        // Interrupts moved here: their threads follow them, at the
        // priority a rule without CPUs gives them, or the kernel's.
        let moved = self.irqs.overrides.iter().any(|o| o.cpus.contains(cpu))
            || self
                .irqs
                .default_affinity
                .as_ref()
                .is_some_and(|a| a.contains(cpu));
        if moved {
            let p = self
                .irqs
                .threads
                .iter()
                .filter(|r| r.cpus.is_none() && r.policy.is_realtime())
                .filter_map(|r| r.priority)
                .max()
                .unwrap_or(KERNEL_IRQ_THREAD_PRIORITY);
            out.push(Competitor {
                what: format!("the IRQ threads of interrupts placed on CPU {cpu} (fifo {p})"),
                priority: p,
            });
        }
        out
    }

    /// The class of process `i`.
    fn classify(&self, i: usize) -> ProcessClass {
        let p = &self.processes[i];
        let cpus = &self.cpus[i];
        let be = |reason: String| ProcessClass {
            process: p.name.clone(),
            class: WakeClass::BestEffort,
            reason,
        };
        if !p.policy.is_realtime() {
            return be(format!("policy {}", p.policy));
        }
        let prio = p.priority.unwrap_or(1);
        let outside = cpus.difference(self.isolated);
        if !outside.is_empty() || cpus.is_empty() {
            return be(format!(
                "{} {prio} on CPUs {cpus}, not all isolated",
                p.policy
            ));
        }
        let mut highest_kernel = 0;
        for cpu in cpus.iter() {
            for c in self.kernel_threads_on(cpu) {
                highest_kernel = highest_kernel.max(c.priority);
                if c.priority >= prio {
                    return be(format!(
                        "{} {prio} on CPU {cpu}, not above {}",
                        p.policy, c.what
                    ));
                }
            }
            for (j, q) in self.processes.iter().enumerate() {
                let qp = q.priority.unwrap_or(1);
                if j != i && q.policy.is_realtime() && self.cpus[j].contains(cpu) && qp > prio {
                    return be(format!(
                        "{} {prio} on CPU {cpu}, below process `{}` ({} {qp})",
                        p.policy, q.name, q.policy
                    ));
                }
            }
        }
        ProcessClass {
            process: p.name.clone(),
            class: WakeClass::RealTime,
            reason: format!(
                "{} {prio} on isolated CPUs {cpus}, above every kernel thread there (highest fifo {highest_kernel}) and no other process above it"
            , p.policy),
        }
    }

    /// Every process's class, in robot.yaml's order.
    pub fn classes(&self) -> Vec<ProcessClass> {
        (0..self.processes.len())
            .map(|i| self.classify(i))
            .collect()
    }
}

/// What the supervisor passes process `p` of class `class`: the part of
/// its environment the runtime reads its class from
/// ([`controller::wake::Attach::of_env`]).
pub fn environment(p: &ProcessConfig, class: WakeClass) -> ProcessEnv {
    let priority = if p.policy.is_realtime() {
        p.priority.unwrap_or(1)
    } else {
        0
    };
    ProcessEnv {
        wake_class: Some(class),
        sched: Some(SchedSpec {
            policy: p.policy.sched(),
            priority,
        }),
        ..ProcessEnv::default()
    }
}

/// The classes of a channel's publishers and subscribers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ChannelClasses {
    /// Publisher processes by class.
    pub publishers: BTreeMap<WakeClass, Vec<String>>,
    pub subscribers: BTreeMap<WakeClass, Vec<String>>,
}

impl ChannelClasses {
    /// The classes on channel `name`, from the processes' `publishes` and
    /// `subscribes`.
    pub fn of(name: &str, processes: &[ProcessConfig], classes: &[ProcessClass]) -> Self {
        let mut out = ChannelClasses::default();
        for (p, c) in processes.iter().zip(classes) {
            if p.publishes.iter().any(|n| n == name) {
                out.publishers
                    .entry(c.class)
                    .or_default()
                    .push(p.name.clone());
            }
            if p.subscribes.iter().any(|n| n == name) {
                out.subscribers
                    .entry(c.class)
                    .or_default()
                    .push(p.name.clone());
            }
        }
        out
    }

    /// Whether some message on the channel crosses classes (a publisher
    /// of one class and a subscriber of the other).
    pub fn crosses(&self) -> bool {
        WakeClass::ALL
            .into_iter()
            .any(|c| self.publishers.contains_key(&c) && self.subscribers.contains_key(&c.other()))
    }
}
