//! `deploy apply [--dry-run]`: writes the CPU isolation plan to the live
//! system (IRQ affinities, IRQ-thread and kernel-thread scheduling,
//! sysctls, the workqueue cpumask, cgroup cpusets, cpufreq).
//!
//! Exit: 0 applied (or nothing to do), 1 the kernel reported a cgroup
//! partition invalid, 2 a write failed or the plan could not be made.

use anyhow::Context;
use clap::Args;
use cpusets::apply::{self, ApplyOptions, ApplyReport};
use cpusets::model::live::Live;
use cpusets::plan::{self, Isolation, RuntimePlan};
use serde::Serialize;

use crate::config::Robot;
use crate::ctx::{Ctx, Exit};

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Print every write it would make (path, old -> new); change nothing.
    /// With -v, the runtime plan and the unchanged values too.
    #[arg(long)]
    pub dry_run: bool,
}

/// The robot.yaml sections the cpusets plan reads.
pub fn isolation(r: &Robot) -> Isolation<'_> {
    Isolation {
        board: &r.board,
        cpus: &r.cpus,
        kernel: &r.kernel,
        irqs: &r.irqs,
        sysctl: &r.sysctl,
        power: &r.power,
    }
}

/// Reads the live system under --sysroot and plans against it.
pub fn live_plan(ctx: &Ctx, r: &Robot) -> anyhow::Result<RuntimePlan> {
    let live = Live::read(&ctx.sysroot).context("reading the live system")?;
    Ok(plan::plan(&isolation(r), &live.inventory())?)
}

/// Where `apply` leaves the interrupts it could not move, for `verify`.
pub const STATE_FILE: &str = "/var/lib/rtdeploy/cpusets-apply.json";

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct ApplyState {
    pub unmovable_irqs: Vec<u32>,
}

#[derive(Serialize)]
struct Doc<'a> {
    plan: &'a RuntimePlan,
    apply: &'a ApplyReport,
}

pub fn run(ctx: &Ctx, args: ApplyArgs) -> anyhow::Result<Exit> {
    let loaded = super::load_robot(ctx)?;
    let plan = live_plan(ctx, &loaded.robot)?;
    for w in &plan.warnings {
        ctx.note(format!("warning: {w}"));
    }
    let opts = ApplyOptions::for_sysroot(&ctx.sysroot, args.dry_run);
    let report = apply::apply(&plan, &ctx.sysroot, &opts).context("applying the CPU plan")?;
    if !args.dry_run {
        let state = ApplyState {
            unmovable_irqs: report.unmovable_irqs(),
        };
        let path = ctx.root(STATE_FILE);
        let saved = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                std::fs::write(&path, serde_json::to_string(&state).unwrap_or_default())
            });
        if let Err(e) = saved {
            ctx.note(format!("note: cannot save {}: {e}", path.display()));
        }
    }
    if ctx.json {
        ctx.print_json(&Doc {
            plan: &plan,
            apply: &report,
        })?;
    } else {
        if ctx.verbose > 0 {
            crate::ctx::write_stdout(&format!("{plan}\n"))?;
        }
        crate::ctx::write_stdout(&report.render(ctx.verbose > 0))?;
    }
    let s = report.summary();
    Ok(if s.failed > 0 {
        Exit::Error
    } else if s.invalid > 0 {
        Exit::Failed
    } else {
        Exit::Ok
    })
}
