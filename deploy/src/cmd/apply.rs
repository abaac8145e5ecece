//! `deploy apply [--dry-run]`: writes the CPU isolation plan to the live
//! system (IRQ affinities, IRQ-thread and kernel-thread scheduling,
//! sysctls, the workqueue cpumask, cgroup cpusets, cpufreq).
//!
//! Exit: 0 applied (or nothing to do), 1 the kernel reported a cgroup
//! partition invalid, 2 a write failed or the plan could not be made.

use anyhow::Context;
use clap::Args;
use cpusets::apply::{self, ApplyOptions, ApplyReport};
use cpusets::plan::RuntimePlan;
use serde::Serialize;

use crate::ctx::{Ctx, Exit};
use cpusets::apply_state::ApplyState;

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Print every write it would make (path, old -> new); change nothing.
    /// With -v, the runtime plan and the unchanged values too.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Serialize)]
struct Doc<'a> {
    plan: &'a RuntimePlan,
    apply: &'a ApplyReport,
}

pub fn run(ctx: &Ctx, args: ApplyArgs) -> anyhow::Result<Exit> {
    let loaded = super::load_robot(ctx)?;
    let plan = loaded.robot.cpu_plan(&ctx.sysroot)?;
    for w in &plan.warnings {
        ctx.note(format!("warning: {w}"));
    }
    let opts = ApplyOptions::for_sysroot(&ctx.sysroot, args.dry_run);
    let report = apply::apply(&plan, &ctx.sysroot, &opts).context("applying the CPU plan")?;
    if !args.dry_run {
        if let Err(e) = ApplyState::from_report(&report)
            .write(&releases::Layout::new(&ctx.prefix).cpusets_apply_state())
        {
            ctx.note(format!("note: {:#}", anyhow::Error::new(e)));
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
