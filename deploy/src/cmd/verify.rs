//! `deploy verify`: proves the live system matches the CPU isolation plan
//! (PREEMPT_RT, command line and its effect, IRQ placement and activity,
//! IRQ-thread scheduling, foreign tasks on isolated CPUs, sysctls,
//! workqueues, cgroup partitions, governors).
//!
//! Exit: 0 in sync, 1 drift, 2 error.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use cpusets::apply_state::ApplyState;
use cpusets::verify::{self, VerifyOptions};

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// How long to watch /proc/interrupts for device interrupts on the
    /// isolated CPUs.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub window_ms: u64,

    /// Take the second /proc/interrupts sample from FILE instead of waiting
    /// (replays a captured pair).
    #[arg(long, value_name = "FILE", hide = true)]
    pub interrupts_after: Option<PathBuf>,
}

pub fn run(ctx: &Ctx, args: VerifyArgs) -> anyhow::Result<Exit> {
    let loaded = super::load_robot(ctx)?;
    let r = &loaded.robot;
    let plan = r.cpu_plan(&ctx.sysroot)?;
    for w in &plan.warnings {
        ctx.note(format!("warning: {w}"));
    }
    // The robot's own processes belong on the isolated CPUs (comm is cut
    // at 15 bytes).
    let allow_tasks = r
        .processes
        .iter()
        .filter(|p| !r.process_cpus(p).is_disjoint(&r.cpus.isolated))
        .map(|p| p.name.chars().take(15).collect())
        .collect();
    let unmovable_irqs = match ApplyState::read(
        &releases::Layout::new(&ctx.prefix).cpusets_apply_state(),
    ) {
        Ok(state) => state.unwrap_or_default().unmovable_irqs,
        Err(e) => {
            ctx.note(format!(
                "warning: {:#} (every interrupt that is not where the plan puts it counts as drift)",
                anyhow::Error::new(e)
            ));
            Vec::new()
        }
    };
    let opts = VerifyOptions {
        sample_window: Duration::from_millis(args.window_ms),
        interrupts_after: args.interrupts_after,
        allow_tasks,
        unmovable_irqs,
        declared_kernel: r.kernel.declared(),
        kernel_offers: Some(services::robot::kernel_offers),
    };
    let report = verify::verify(&plan, &ctx.sysroot, &opts)?;
    if ctx.json {
        ctx.print_json(&report)?;
    } else {
        crate::ctx::write_stdout(&report.render(ctx.verbose > 0))?;
    }
    Ok(if report.in_sync() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}
