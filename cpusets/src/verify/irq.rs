//! Interrupts: each one's affinity, and the device interrupts that fired on
//! the isolated CPUs during the sample window.

use std::collections::BTreeMap;

use units::cpu::CpuSet;

use super::{check, Check, Status, VerifyOptions, HINT_APPLY};
use crate::model::{Interrupts, Irq};

/// One interrupt: `fired` is how many times it fired during the window
/// (on any CPU), `effective_after` its effective affinity read after it.
pub(super) fn check_irq(
    irq: &Irq,
    want: &CpuSet,
    unmovable: bool,
    fired: u64,
    effective_after: Option<&CpuSet>,
) -> Check {
    let id = format!("irq.{}", irq.irq);
    let name = if irq.actions.is_empty() {
        "(no handler)".to_string()
    } else {
        irq.name()
    };
    let aff = irq.affinity.as_ref();
    let eff = irq.effective.as_ref();
    let aff_inside = aff.is_none_or(|a| a.is_subset(want));
    let eff_inside = eff.is_none_or(|e| e.is_subset(want));
    let after_inside = effective_after.is_none_or(|e| e.is_subset(want));
    let show = |s: Option<&CpuSet>| s.map(|s| s.to_string()).unwrap_or_else(|| "-".into());
    let detail = format!(
        "{name}: affinity {} effective {}, planned {want}",
        show(aff),
        show(eff)
    );
    if aff_inside && eff_inside {
        check(id, Status::Ok, detail, None)
    } else if aff_inside && after_inside && !unmovable {
        check(
            id,
            Status::Ok,
            format!(
                "{name}: affinity {} effective {} after it fired, planned {want} (moved during the window)",
                show(aff),
                show(effective_after)
            ),
            None,
        )
    } else if aff_inside && fired == 0 && !unmovable {
        check(
            id,
            Status::Pending,
            format!("{detail} (move pending: it did not fire in the window, and the kernel moves it at its next interrupt)"),
            Some("nothing to do: it moves by itself when it next fires (run verify again after it has)"),
        )
    } else if unmovable {
        check(
            id,
            Status::Unmovable,
            detail,
            Some("per-CPU or kernel-managed interrupt: it cannot move (isolcpus=managed_irq keeps managed ones off isolated CPUs from boot)"),
        )
    } else {
        check(id, Status::Drift, detail, Some(HINT_APPLY))
    }
}

/// Device interrupts on isolated CPUs during the window; those of the
/// interrupts in `moved` (whose effective affinity came inside the plan
/// during the window) were their move, and are listed apart.
#[allow(clippy::too_many_arguments)]
pub(super) fn check_irq_activity<'p>(
    before: &Interrupts,
    after: &Interrupts,
    irqs: &[Irq],
    isolated: &CpuSet,
    want: &dyn Fn(u32) -> &'p CpuSet,
    unmovable: &dyn Fn(&Irq) -> bool,
    moved: &[u32],
    opts: &VerifyOptions,
) -> Vec<Check> {
    let by_num: BTreeMap<u32, &Irq> = irqs.iter().map(|i| (i.irq, i)).collect();
    let mut drift = Vec::new();
    let mut pinned = Vec::new();
    let mut moving = Vec::new();
    for (id, cpu, n) in before.deltas(after) {
        let Ok(num) = id.parse::<u32>() else {
            // Named rows (LOC, RES, IPIs) are per-CPU by nature.
            continue;
        };
        if !isolated.contains(cpu) || want(num).contains(cpu) {
            continue;
        }
        let name = by_num.get(&num).map(|i| i.name()).unwrap_or_default();
        let line = format!("irq {num} {name} fired {n} times on CPU {cpu}");
        match by_num.get(&num) {
            Some(i) if unmovable(i) => pinned.push(line),
            _ if moved.contains(&num) => moving.push(format!("{line}, then moved")),
            _ => drift.push(line),
        }
    }
    let window = match &opts.interrupts_after {
        Some(p) => format!("between /proc/interrupts and {}", p.display()),
        None => format!("in {} ms", opts.sample_window.as_millis()),
    };
    let mut out = Vec::new();
    let mut c = if drift.is_empty() && !moving.is_empty() {
        let mut c = check(
            "irq.activity",
            Status::Ok,
            format!("no device interrupt on isolated CPUs {isolated} {window} but the moves of interrupts whose affinity had been set"),
            None,
        );
        c.items = std::mem::take(&mut moving);
        c
    } else if drift.is_empty() {
        check(
            "irq.activity",
            Status::Ok,
            format!("no device interrupt on isolated CPUs {isolated} {window}"),
            None,
        )
    } else {
        check(
            "irq.activity",
            Status::Drift,
            format!(
                "{} device interrupts fired on isolated CPUs {window}",
                drift.len()
            ),
            Some(HINT_APPLY),
        )
    };
    if c.items.is_empty() {
        c.items = drift;
        c.items.extend(moving);
    }
    out.push(c);
    if !pinned.is_empty() {
        let mut c = check(
            "irq.activity.unmovable",
            Status::Unmovable,
            format!("unmovable interrupts fired on isolated CPUs {window}"),
            Some("per-CPU or kernel-managed interrupts cannot move: nohz_full keeps timer ticks rare, isolcpus=managed_irq keeps managed ones off isolated CPUs from boot"),
        );
        c.items = pinned;
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn irq(affinity: &str, effective: &str) -> Irq {
        Irq {
            irq: 31,
            actions: vec!["virtio0-stats".into()],
            chip: "PCI-MSIX-0000:00:03.0".into(),
            hwirq: Some(1),
            affinity: Some(CpuSet::parse_list(affinity).unwrap()),
            effective: Some(CpuSet::parse_list(effective).unwrap()),
            interfaces: Vec::new(),
        }
    }

    fn interrupts(cpu0: u64, cpu1: u64) -> Interrupts {
        let text = format!(
            "           CPU0       CPU1\n 31: {cpu0} {cpu1} PCI-MSIX-0000:00:03.0 1-edge virtio0-stats\n"
        );
        Interrupts::parse(&text, Path::new("/proc/interrupts")).unwrap()
    }

    #[test]
    fn a_move_waiting_for_the_next_interrupt_is_pending_then_ok_or_drift() {
        let want = CpuSet::parse_list("0").unwrap();
        let i = irq("0", "1");
        let after = |e: &str| CpuSet::parse_list(e).unwrap();
        // Silent during the window, still on CPU 1: pending.
        let c = check_irq(&i, &want, false, 0, Some(&after("1")));
        assert_eq!(c.status, Status::Pending, "{c:?}");
        // Fired, and moved by the time the window ended: ok.
        let c = check_irq(&i, &want, false, 1, Some(&after("0")));
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.ends_with("(moved during the window)"), "{c:?}");
        // Fired, and still on CPU 1: drift.
        let c = check_irq(&i, &want, false, 4, Some(&after("1")));
        assert_eq!(c.status, Status::Drift, "{c:?}");
        // Its affinity itself is wrong: drift however quiet it was.
        let c = check_irq(&irq("1", "1"), &want, false, 0, Some(&after("1")));
        assert_eq!(c.status, Status::Drift, "{c:?}");
    }

    #[test]
    fn the_interrupt_that_moved_it_is_not_activity_on_the_isolated_cpu() {
        let isolated = CpuSet::parse_list("1").unwrap();
        let want = CpuSet::parse_list("0").unwrap();
        let irqs = [irq("0", "1")];
        let (before, after) = (interrupts(10, 5), interrupts(10, 6));
        let opts = VerifyOptions::default();
        let run = |moved: &[u32]| {
            check_irq_activity(
                &before,
                &after,
                &irqs,
                &isolated,
                &|_| &want,
                &|_| false,
                moved,
                &opts,
            )
        };
        let c = &run(&[31])[0];
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert_eq!(
            c.items,
            ["irq 31 virtio0-stats fired 1 times on CPU 1, then moved"]
        );
        let c = &run(&[])[0];
        assert_eq!(c.status, Status::Drift, "{c:?}");
        assert_eq!(c.items, ["irq 31 virtio0-stats fired 1 times on CPU 1"]);
    }
}
