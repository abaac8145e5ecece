//! What a run's figures come to: measurements merged across rounds, the
//! notes on the tracer's and logger's cost, and every budget against its
//! figure.

use super::*;

/// One measurement's phases merged (a mechanism run in several rounds).
pub(super) struct Merged {
    pub(super) mech: Mechanism,
    pub(super) suffix: &'static str,
    pub(super) account: Option<DeliveryAccount>,
    pub(super) send: Summary,
    pub(super) delivery: Summary,
    pub(super) low: Summary,
}

impl Merged {
    /// Adds one phase's accounting: counts summed, the receiver reached
    /// the end only if it did in every phase, the missing ranges of each.
    pub(super) fn add_account(&mut self, a: DeliveryAccount) {
        match &mut self.account {
            None => self.account = Some(a),
            Some(m) => {
                m.sent += a.sent;
                m.delivered += a.delivered;
                m.lost += a.lost;
                m.receiver_reached_end &= a.receiver_reached_end;
                m.unaccounted += a.unaccounted;
                if !a.missing.is_empty() {
                    if !m.missing.is_empty() {
                        m.missing.push_str("; ");
                    }
                    m.missing.push_str(&a.missing);
                }
                m.beyond_range += a.beyond_range;
                m.found_without_wake += a.found_without_wake;
            }
        }
    }
}

/// The cost of tracing or of the logger in one line: the plain and the
/// traced (or logged) runs of the same mechanism side by side (p50, p99,
/// p99.9, longest; send and delivery).
pub(super) fn overhead_note(
    ms: &[Measurement],
    mech: Mechanism,
    (plain, variant): (&str, &str),
    what: &str,
) -> Option<String> {
    let find = |name: &str| {
        ms.iter()
            .find(|m| m.name == name && m.mechanism == Some(mech) && m.count > 0)
    };
    let ratio = |a: u64, b: u64| {
        if a == 0 {
            "-".to_string()
        } else {
            format!("{:.2}x", b as f64 / a as f64)
        }
    };
    let part = |name: &str, off: &Measurement, on: &Measurement| {
        format!(
            "{name} p50 {} -> {} ({}), p99 {} -> {} ({}), p99.9 {} -> {} ({}), longest {} -> {}",
            fmt_ns(off.p50_ns),
            fmt_ns(on.p50_ns),
            ratio(off.p50_ns, on.p50_ns),
            fmt_ns(off.p99_ns),
            fmt_ns(on.p99_ns),
            ratio(off.p99_ns, on.p99_ns),
            fmt_ns(off.p999_ns),
            fmt_ns(on.p999_ns),
            ratio(off.p999_ns, on.p999_ns),
            fmt_ns(off.max_ns),
            fmt_ns(on.max_ns),
        )
    };
    let (d0, d1) = (find("delivery")?, find(&format!("delivery ({variant})"))?);
    let mut line = format!(
        "{what} ({}, {plain} -> {variant} in this run): {}",
        mech.short(),
        part("delivery", d0, d1)
    );
    if let (Some(s0), Some(s1)) = (find("send"), find(&format!("send ({variant})"))) {
        line.push_str("; ");
        line.push_str(&part("send", s0, s1));
    }
    Some(line)
}

/// What the logger of a logged phase did and cost: messages, gaps, bytes
/// on disk per message, and its thread's CPU time per 100k messages.
pub(super) fn logger_cost(st: &LoggerFigures, dir: &Path) -> String {
    let (logged, gaps) = (st.logged, st.lost);
    let bytes: u64 = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    let per = |x: f64| if logged > 0 { x / logged as f64 } else { 0.0 };
    format!(
        "logger: {logged} messages logged, {gaps} lost, {bytes} bytes on disk ({:.1} bytes/message, zstd), CPU {:.1} ms ({:.1} ms per 100k messages); state {}",
        per(bytes as f64),
        st.cpu_ns as f64 / 1e6,
        per(st.cpu_ns as f64) * 1e5 / 1e6,
        st.state
    )
}

/// Every budget against its figure. Budgets on the scenario apply to each
/// mechanism; only the first mechanism's decide the verdict.
pub fn evaluate_budgets(
    inputs: &CheckInputs,
    mechanisms: &[Mechanism],
    ms: &[Measurement],
) -> Vec<BudgetResult> {
    let b = &inputs.check.budgets;
    let mut out = vec![];
    let mut add =
        |name: String, m: &Measurement, stat: Statistic, limit: u64, informational: bool| {
            let figure = (m.count > 0).then_some(match stat {
                Statistic::Max => m.max_ns,
                Statistic::P99 => m.p99_ns,
            });
            out.push(BudgetResult {
                name,
                measurement: m.name.clone(),
                mechanism: m.mechanism,
                statistic: stat,
                limit_ns: limit,
                figure_ns: figure,
                // Nothing measured is a failure: a budget cannot be met by
                // a measurement that never happened.
                pass: figure.is_some_and(|f| f <= limit),
                informational,
            });
        };
    for m in ms.iter().filter(|m| m.kind == MeasurementKind::Timer) {
        let suffix = m.cpu.map_or(String::new(), |c| format!(" (cpu{c})"));
        if let Some(d) = b.timer_max {
            add(
                format!("check.budgets.timer_max{suffix}"),
                m,
                Statistic::Max,
                d.as_nanos(),
                false,
            );
        }
        if let Some(d) = b.timer_p99 {
            add(
                format!("check.budgets.timer_p99{suffix}"),
                m,
                Statistic::P99,
                d.as_nanos(),
                false,
            );
        }
    }
    for (i, &mech) in mechanisms.iter().enumerate() {
        let info = i > 0;
        let find = |name: &str| {
            ms.iter()
                .find(|m| m.name == name && m.mechanism == Some(mech))
        };
        if let Some(m) = find("delivery") {
            if let Some(d) = b.delivery_max {
                add(
                    "check.budgets.delivery_max".into(),
                    m,
                    Statistic::Max,
                    d.as_nanos(),
                    info,
                );
            }
            if let Some(d) = b.delivery_p99 {
                add(
                    "check.budgets.delivery_p99".into(),
                    m,
                    Statistic::P99,
                    d.as_nanos(),
                    info,
                );
            }
            for nb in inputs.channel_budgets.iter().chain(&inputs.process_budgets) {
                add(
                    nb.name.clone(),
                    m,
                    Statistic::Max,
                    nb.limit.as_nanos(),
                    info,
                );
            }
        }
        if let (Some(m), Some(d)) = (find("send"), b.send_max) {
            add(
                "check.budgets.send_max".into(),
                m,
                Statistic::Max,
                d.as_nanos(),
                info,
            );
        }
    }
    out
}
