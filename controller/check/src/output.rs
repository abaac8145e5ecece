//! The report's file outputs: cyclictest's histogram file format (so the
//! plotting scripts people already have for cyclictest work unchanged) and
//! an SVG picture of the latency histograms with the budget lines.

use std::fmt::Write as _;

use crate::hist::{log_bucket, log_bucket_high, log_bucket_low};
use crate::report::{fmt_ns, CheckReport, Measurement};

/// Fewest lines the histogram file has (so short runs still plot).
const MIN_HISTOGRAM_LINES: usize = 100;

/// The histogram file as cyclictest's `--histogram`/`--histfile` writes it:
/// `# Histogram`, one line per microsecond with one tab-separated count
/// column per measurement (cyclictest's "threads"), then the `# Total:`,
/// `# Min Latencies:`, `# Avg Latencies:`, `# Max Latencies:` and
/// `# Histogram Overflows:` lines with one figure per column (in whole
/// microseconds). A last comment line names the columns.
pub fn cyclictest_histogram(measurements: &[&Measurement]) -> String {
    let mut o = String::new();
    let last = measurements
        .iter()
        .filter_map(|m| m.summary.linear.iter().rposition(|&n| n > 0))
        .max()
        .map_or(0, |i| i + 1);
    let len = last.clamp(MIN_HISTOGRAM_LINES, crate::hist::LINEAR_US);
    o.push_str("# Histogram\n");
    for us in 0..len {
        let _ = write!(o, "{us:06}");
        for (i, m) in measurements.iter().enumerate() {
            let sep = if i == 0 { ' ' } else { '\t' };
            let _ = write!(
                o,
                "{sep}{:06}",
                m.summary.linear.get(us).copied().unwrap_or(0)
            );
        }
        o.push('\n');
    }
    let in_range = |m: &Measurement| m.summary.linear[..len].iter().sum::<u64>();
    let line = |o: &mut String, title: &str, width: usize, f: &dyn Fn(&Measurement) -> u64| {
        let _ = write!(o, "# {title}:");
        for m in measurements {
            let _ = write!(o, " {:0width$}", f(m));
        }
        o.push('\n');
    };
    line(&mut o, "Total", 9, &|m| in_range(m));
    line(&mut o, "Min Latencies", 5, &|m| m.min_ns / 1000);
    line(&mut o, "Avg Latencies", 5, &|m| m.mean_ns / 1000);
    line(&mut o, "Max Latencies", 5, &|m| m.max_ns / 1000);
    line(&mut o, "Histogram Overflows", 5, &|m| m.count - in_range(m));
    let names: Vec<String> = measurements
        .iter()
        .map(|m| match m.mechanism {
            Some(x) => format!("{} ({})", m.name, x.short()),
            None => m.name.clone(),
        })
        .collect();
    let _ = writeln!(o, "# Columns: {}", names.join(", "));
    o
}

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// A measurement's histogram regrouped into plot bins of 4 log buckets:
/// `(low_ns, high_ns, count)`, in order.
fn plot_bins(m: &Measurement) -> Vec<(u64, u64, u64)> {
    let mut out: Vec<(u64, u64, u64)> = vec![];
    for b in &m.histogram {
        let key = log_bucket(b.low_ns) / 4;
        let (low, high) = (log_bucket_low(key * 4), log_bucket_high(key * 4 + 3));
        match out.last_mut() {
            Some(last) if last.0 == low => last.2 += b.count,
            _ => out.push((low, high, b.count)),
        }
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An SVG picture: samples per bucket (log scale) against latency (log
/// scale), one series per measurement, a dashed vertical line per budget.
pub fn svg_plot(report: &CheckReport) -> String {
    let series: Vec<&Measurement> = report.measurements.iter().filter(|m| m.count > 0).collect();
    let (w, h) = (960.0f64, 540.0f64);
    let (left, right, top, bottom) = (80.0, 250.0, 40.0, 60.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let mut lo = u64::MAX;
    let mut hi = 1u64;
    let mut cmax = 1u64;
    // Plot bins: 8 per power of two (4 histogram buckets each), so the
    // curves read as shapes rather than noise.
    let binned: Vec<Vec<(u64, u64, u64)>> = series.iter().map(|m| plot_bins(m)).collect();
    for bins in &binned {
        for &(low, high, count) in bins {
            lo = lo.min(low.max(1));
            hi = hi.max(high.saturating_add(1));
            cmax = cmax.max(count);
        }
    }
    for b in &report.budgets {
        hi = hi.max(b.limit_ns);
        lo = lo.min(b.limit_ns);
    }
    if lo == u64::MAX {
        lo = 1_000;
    }
    let x_lo = 10f64.powf((lo as f64).log10().floor()).max(1.0);
    let x_hi = 10f64.powf((hi as f64).log10().ceil()).max(x_lo * 10.0);
    let y_hi = 10f64.powf((cmax as f64).log10().ceil()).max(10.0);
    let x = |ns: f64| {
        left + pw * ((ns.max(x_lo)).log10() - x_lo.log10()) / (x_hi.log10() - x_lo.log10())
    };
    // Counts of 0 are not drawn; 1 sits on the axis.
    let y = |c: f64| top + ph - ph * (c.max(1.0)).log10() / y_hi.log10();
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        o,
        r#"<rect x="0" y="0" width="{w}" height="{h}" fill="white"/>"#
    );
    let title = format!(
        "{}: latency histogram, {} {}",
        report.scenario.robot,
        report.host.kernel_release,
        if report.host.preempt_rt {
            "PREEMPT_RT"
        } else {
            "(not PREEMPT_RT)"
        }
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="24" font-size="15" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        esc(&title)
    );
    // Grid and ticks.
    let mut t = x_lo;
    while t <= x_hi * 1.0001 {
        let px = x(t);
        let _ = writeln!(
            o,
            r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            top + ph
        );
        let _ = writeln!(
            o,
            r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            top + ph + 18.0,
            fmt_ns(t as u64)
        );
        t *= 10.0;
    }
    let mut c = 1.0;
    while c <= y_hi * 1.0001 {
        let py = y(c);
        let _ = writeln!(
            o,
            r##"<line x1="{left}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/>"##,
            left + pw
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 6.0,
            py + 4.0,
            c as u64
        );
        c *= 10.0;
    }
    let _ = writeln!(
        o,
        r#"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">latency (log scale)</text>"#,
        left + pw / 2.0,
        h - 16.0
    );
    let _ = writeln!(
        o,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">samples per bucket (log scale)</text>"#,
        top + ph / 2.0,
        top + ph / 2.0
    );
    // Series: a step line over the plot bins; it drops to the axis only
    // where bins are empty.
    for (i, (m, bins)) in series.iter().zip(&binned).enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let base = y(1.0);
        let mut d = String::new();
        let mut last_high: Option<u64> = None;
        for &(low, high, count) in bins {
            let (x0, x1) = (x(low.max(1) as f64), x(high.saturating_add(1) as f64));
            let py = y(count as f64);
            match last_high {
                Some(h) if h + 1 == low => {
                    let _ = write!(d, " L{x0:.1},{py:.1}");
                }
                Some(h) => {
                    let xh = x(h.saturating_add(1) as f64);
                    let _ = write!(d, " L{xh:.1},{base:.1} M{x0:.1},{base:.1} L{x0:.1},{py:.1}");
                }
                None => {
                    let _ = write!(d, "M{x0:.1},{base:.1} L{x0:.1},{py:.1}");
                }
            }
            let _ = write!(d, " L{x1:.1},{py:.1}");
            last_high = Some(high);
        }
        if let Some(h) = last_high {
            let _ = write!(d, " L{:.1},{base:.1}", x(h.saturating_add(1) as f64));
        }
        let _ = writeln!(
            o,
            r#"<path class="series" fill="none" stroke="{colour}" stroke-width="1.5" d="{d}"><title>{}</title></path>"#,
            esc(&m.name)
        );
        let ly = top + 14.0 + 18.0 * i as f64;
        let lx = left + pw + 16.0;
        let label = match m.mechanism {
            Some(x) => format!("{} ({})", m.name, x.short()),
            None => m.name.clone(),
        };
        let _ = writeln!(
            o,
            r#"<line x1="{lx}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="3"/>"#,
            ly - 4.0,
            lx + 18.0,
            ly - 4.0
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{ly:.1}">{}</text>"#,
            lx + 24.0,
            esc(&label)
        );
    }
    // Budget lines: one per distinct limit, naming every budget at it.
    let mut limits: Vec<(u64, Vec<String>, bool)> = vec![];
    for b in report.budgets.iter().filter(|b| !b.informational) {
        match limits.iter_mut().find(|l| l.0 == b.limit_ns) {
            Some(l) => {
                if !l.1.contains(&b.name) {
                    l.1.push(b.name.clone());
                }
                l.2 &= b.pass;
            }
            None => limits.push((b.limit_ns, vec![b.name.clone()], b.pass)),
        }
    }
    for (limit, names, pass) in &limits {
        let px = x(*limit as f64);
        let colour = if *pass { "#2a2" } else { "#c00" };
        let _ = writeln!(
            o,
            r#"<line class="budget" x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{:.1}" stroke="{colour}" stroke-width="1.5" stroke-dasharray="6 4"/>"#,
            top + ph
        );
        let (tx, ty) = (px - 4.0, top + 6.0);
        let _ = writeln!(
            o,
            r#"<text x="{tx:.1}" y="{ty:.1}" fill="{colour}" font-size="11" text-anchor="end" transform="rotate(-90 {tx:.1} {ty:.1})">{} {} {}</text>"#,
            esc(&names.join(", ")),
            fmt_ns(*limit),
            if *pass { "PASS" } else { "FAIL" }
        );
    }
    o.push_str("</svg>\n");
    o
}
