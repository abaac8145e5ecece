//! `deploy top`: the robot's timing live, refreshed every `--interval`
//! (default 1 s): per process its state, scheduling, backend, wakeup
//! median, p99 and longest of the latest report and p99 and longest since
//! its loop started, against its budget (misses highlighted), handler time
//! and restarts; per channel its rate and losses; per CPU whether it is
//! online, its frequency and the cap it is held under (power mode or
//! throttling), utilisation and interrupts per second (any on an isolated
//! CPU highlighted); the Jetson power mode where there is one, and each
//! thermal zone's temperature (one at or past a passive trip point, where
//! the kernel throttles, highlighted). Keys: `q` quit, `p`/space pause,
//! `s` next sort, `/` filter by process name (Enter applies, Esc clears).
//!
//! The supervisor is asked on a thread of its own, so a supervisor that
//! is gone, slow or answers in a layout this build does not know is a
//! message on the screen, and `top` keeps running and asking. A terminal
//! smaller than [`MIN_COLS`]x[`MIN_ROWS`] says so until it grows.
//!
//! `--once` prints one frame (two CPU samples `--interval` apart) and
//! exits: as a table, or with `--json` as JSON. Exit codes: 0; 2 when
//! `--once` found no supervisor (the frame says why), or the terminal
//! could not be set up.

use std::io::Write as _;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::{execute, terminal};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use services::control::{self, Request};
use services::status::SupervisorStatus;
use services::top::{self, CpuSample, Frame, SortKey};
use units::duration::Dur;

use crate::ctx::{Ctx, Exit};

/// The smallest terminal drawn.
pub const MIN_COLS: u16 = 60;
pub const MIN_ROWS: u16 = 12;

/// The longest error shown (a bad reply quotes the reply).
const MAX_ERROR: usize = 300;

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Print one frame and exit (a table; with --json, JSON).
    #[arg(long)]
    pub once: bool,
    /// Time between refreshes (and between the two CPU samples of --once).
    #[arg(long, value_name = "D", default_value = "1s", value_parser = parse_interval)]
    pub interval: Dur,
    /// Order of the processes: config, name, p99, max, misses, restarts.
    #[arg(long, value_name = "KEY", default_value = "config", value_parser = parse_sort)]
    pub sort: SortKey,
    /// Only processes whose name contains TEXT.
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
}

fn parse_interval(s: &str) -> Result<Dur, String> {
    let d = Dur::parse(s).map_err(|e| e.to_string())?;
    if d.0 < Duration::from_millis(100) {
        return Err(format!("{s} (expected 100ms or longer)"));
    }
    Ok(d)
}

fn parse_sort(s: &str) -> Result<SortKey, String> {
    SortKey::parse(s).ok_or_else(|| {
        let names: Vec<&str> = SortKey::ALL.iter().map(|k| k.name()).collect();
        format!("unknown sort `{s}` (expected one of {})", names.join(", "))
    })
}

fn cut(s: String) -> String {
    if s.len() <= MAX_ERROR {
        return s;
    }
    let mut end = MAX_ERROR;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// One status request: the status, or why there is none.
fn fetch(ctx: &Ctx) -> Result<SupervisorStatus, String> {
    let sock = control::socket_path(&ctx.prefix);
    match control::request(&sock, &Request::Status) {
        Ok(r) if r.ok => r
            .status
            .ok_or_else(|| "the supervisor answered without a status".to_string()),
        Ok(r) => Err(format!(
            "the supervisor refused: {}",
            r.error.unwrap_or_default()
        )),
        Err(e @ control::ControlRequestError::BadReply { .. }) => Err(cut(format!(
            "a status this deploy cannot read (another supervisor version?): {}",
            units::error::Chain(&e)
        ))),
        Err(e) => Err(cut(units::error::Chain(&e).to_string())),
    }
}

/// The isolated CPUs of robot.yaml, or a note why they are unknown.
struct Isolated {
    cpus: Vec<u32>,
    note: Option<String>,
}

fn isolated(ctx: &Ctx) -> Isolated {
    match services::robot::load(&ctx.config_path) {
        Ok(l) => Isolated {
            cpus: l.robot.cpus.isolated.iter().collect(),
            note: None,
        },
        Err(e) => Isolated {
            cpus: Vec::new(),
            note: Some(format!(
                "isolated CPUs unknown ({}): {e}",
                ctx.config_path.display()
            )),
        },
    }
}

pub fn run(ctx: &Ctx, args: TopArgs) -> anyhow::Result<Exit> {
    let iso = isolated(ctx);
    if args.once {
        return once(ctx, &args, &iso);
    }
    interactive(ctx, &args, &iso)
}

fn build(
    status: &Result<SupervisorStatus, String>,
    prev: &CpuSample,
    cur: &CpuSample,
    secs: f64,
    iso: &Isolated,
    sort: SortKey,
    filter: Option<&str>,
) -> Frame {
    let mut notes = cur.notes.clone();
    notes.extend(iso.note.clone());
    let mut f = top::frame(
        status.as_ref().map_err(String::as_str),
        top::cpu_rows(prev, cur, secs, &iso.cpus),
        &notes,
        sort,
        filter,
    );
    f.power_mode = cur.power_mode;
    f.thermal = cur.thermal.clone();
    f
}

fn once(ctx: &Ctx, args: &TopArgs, iso: &Isolated) -> anyhow::Result<Exit> {
    let t0 = Instant::now();
    let prev = CpuSample::read(&ctx.sysroot);
    std::thread::sleep(args.interval.0);
    let cur = CpuSample::read(&ctx.sysroot);
    let secs = t0.elapsed().as_secs_f64();
    let status = fetch(ctx);
    let frame = build(
        &status,
        &prev,
        &cur,
        secs,
        iso,
        args.sort,
        args.filter.as_deref(),
    );
    if ctx.json {
        ctx.print_json(&frame)?;
    } else {
        // The same view as the terminal's, 100 columns wide, as tall as it
        // needs, without colours.
        let height = 8
            + frame.processes.len()
            + frame.channels.len()
            + frame.cpus.len()
            + frame.notes.len()
            + THERMAL_LINES;
        let area = Rect::new(0, 0, 100, height.min(1000) as u16);
        let mut buf = ratatui::buffer::Buffer::empty(area);
        let view = View {
            interval: args.interval.0,
            ..Default::default()
        };
        draw_frame(&frame, &view, area, &mut buf);
        let mut out = String::new();
        for y in 0..area.height {
            let line: String = (0..area.width)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect();
            out.push_str(line.trim_end());
            out.push('\n');
        }
        crate::ctx::write_stdout(out.trim_end_matches('\n'))?;
        crate::ctx::write_stdout("\n")?;
    }
    Ok(if status.is_err() {
        Exit::Error
    } else {
        Exit::Ok
    })
}

/// What the keys changed.
#[derive(Debug, Default)]
struct View {
    paused: bool,
    /// Typing a filter: what is typed so far.
    editing: Option<String>,
    interval: Duration,
}

/// Restores the terminal however `top` ends.
struct TermGuard;

impl Drop for TermGuard {
    fn drop(&mut self) {
        let _ = terminal::disable_raw_mode();
        let _ = execute!(
            std::io::stdout(),
            terminal::LeaveAlternateScreen,
            ratatui::crossterm::cursor::Show
        );
    }
}

fn interactive(ctx: &Ctx, args: &TopArgs, iso: &Isolated) -> anyhow::Result<Exit> {
    terminal::enable_raw_mode()
        .context("cannot put the terminal in raw mode (is stdout a terminal?)")?;
    let _guard = TermGuard;
    execute!(std::io::stdout(), terminal::EnterAlternateScreen)
        .context("cannot switch to the alternate screen")?;
    let mut term =
        ratatui::Terminal::new(ratatui::backend::CrosstermBackend::new(std::io::stdout()))
            .context("cannot set up the terminal")?;
    term.clear().context("cannot clear the terminal")?;

    // The supervisor is asked on its own thread: a hung one stalls no key.
    let (tx, rx) = mpsc::channel::<Result<SupervisorStatus, String>>();
    let fetch_ctx = ctx.clone();
    let every = args.interval.0;
    std::thread::spawn(move || loop {
        if tx.send(fetch(&fetch_ctx)).is_err() {
            return;
        }
        std::thread::sleep(every);
    });

    let mut view = View {
        interval: every,
        ..Default::default()
    };
    let mut sort = args.sort;
    let mut filter = args.filter.clone();
    let mut status: Result<SupervisorStatus, String> = Err("asking the supervisor...".into());
    let mut prev = CpuSample::read(&ctx.sysroot);
    let mut prev_at = Instant::now();
    let mut cur = prev.clone();
    let mut secs = 0.0;
    let mut next_sample = prev_at + every;
    let mut frame = build(&status, &prev, &cur, secs, iso, sort, filter.as_deref());
    loop {
        // The newest status, unless paused.
        let mut fresh = false;
        while let Ok(s) = rx.try_recv() {
            if !view.paused {
                status = s;
                fresh = true;
            }
        }
        let now = Instant::now();
        if now >= next_sample && !view.paused {
            prev = std::mem::replace(&mut cur, CpuSample::read(&ctx.sysroot));
            secs = now.duration_since(prev_at).as_secs_f64();
            prev_at = now;
            next_sample = now + every;
            fresh = true;
        }
        if fresh || !view.paused {
            frame = build(&status, &prev, &cur, secs, iso, sort, filter.as_deref());
        }
        term.draw(|f| {
            let area = f.area();
            draw(&frame, &view, area, f.buffer_mut());
        })
        .context("cannot draw")?;
        if !event::poll(Duration::from_millis(100)).context("cannot read the terminal")? {
            continue;
        }
        let Event::Key(k) = event::read().context("cannot read the terminal")? else {
            continue; // a resize redraws on the next turn
        };
        if k.kind != KeyEventKind::Press {
            continue;
        }
        if let Some(text) = view.editing.as_mut() {
            match k.code {
                KeyCode::Enter => {
                    let t = view.editing.take().unwrap_or_default();
                    filter = (!t.is_empty()).then_some(t);
                }
                KeyCode::Esc => {
                    view.editing = None;
                    filter = None;
                }
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) if text.len() < 64 && !c.is_control() => text.push(c),
                _ => {}
            }
            frame = build(&status, &prev, &cur, secs, iso, sort, filter.as_deref());
            continue;
        }
        match k.code {
            KeyCode::Char('q') | KeyCode::Esc => break,
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => break,
            KeyCode::Char('p') | KeyCode::Char(' ') => view.paused = !view.paused,
            KeyCode::Char('s') => sort = sort.next(),
            KeyCode::Char('/') => view.editing = Some(String::new()),
            _ => {}
        }
        frame = build(&status, &prev, &cur, secs, iso, sort, filter.as_deref());
    }
    drop(term);
    let _ = std::io::stdout().flush();
    Ok(Exit::Ok)
}

/// `text` in lines of at most `width` characters, broken at spaces (a
/// longer word is cut).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in text.split(' ') {
        let mut word: String = word.to_string();
        while word.chars().count() > width {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            let head: String = word.chars().take(width).collect();
            word = word.chars().skip(width).collect();
            out.push(head);
        }
        let need = cur.chars().count() + usize::from(!cur.is_empty()) + word.chars().count();
        if need > width && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(&word);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Microseconds in at most 4 columns: `12.3`, `1234`, `12ms`, `1.2s`,
/// `123s`, then `>1ks` (no wakeup takes that long; garbage might).
fn us(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v < 99.95 => format!("{v:.1}"),
        Some(v) if v < 9_999.5 => format!("{v:.0}"),
        Some(v) if v < 99_500.0 => format!("{:.0}ms", v / 1e3),
        Some(v) if v < 9_950_000.0 => format!("{:.1}s", v / 1e6),
        Some(v) if v < 999_500_000.0 => format!("{:.0}s", v / 1e6),
        Some(_) => ">1ks".into(),
    }
}

/// The most lines the thermal zones take on screen (all are in the JSON).
const THERMAL_LINES: usize = 2;

/// A zone's name without the `-thermal` every Jetson zone ends with.
fn zone_name(name: &str) -> &str {
    ["-thermal", "_thermal", "-therm"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .filter(|n| !n.is_empty())
        .unwrap_or(name)
}

/// The thermal zones as at most `max_lines` lines of `width`: those the
/// kernel throttles first (with their passive trip point), then the rest
/// in zone order; what does not fit is counted.
fn thermal_lines(
    zones: &[services::thermal::ThermalZone],
    width: usize,
    max_lines: usize,
) -> Vec<Vec<(String, bool)>> {
    if zones.is_empty() || max_lines == 0 {
        return Vec::new();
    }
    let mut order: Vec<&services::thermal::ThermalZone> = zones.iter().collect();
    order.sort_by_key(|z| (!z.throttling, z.zone));
    let items: Vec<(String, bool)> = order
        .iter()
        .map(|z| {
            let temp = z.temp_c.map_or("-".into(), |t| format!("{t:.1}C"));
            let text = match (z.throttling, z.passive_c) {
                (true, Some(p)) => format!("{} {temp}>={p:.1} THROTTLED", zone_name(&z.name)),
                _ => format!("{} {temp}", zone_name(&z.name)),
            };
            (text, z.throttling)
        })
        .collect();
    let label = "thermal:";
    let mut lines: Vec<Vec<(String, bool)>> = vec![vec![(label.into(), false)]];
    let mut used = label.len();
    let mut i = 0;
    while let Some((text, hot)) = items.get(i) {
        let left = items.len() - i;
        // On the last line, room is kept to say how many did not fit.
        let more = format!(" +{left} more");
        let last = lines.len() == max_lines;
        let reserve = if last && left > 1 { more.len() } else { 0 };
        let sep = usize::from(used > 0);
        if used + sep + text.chars().count() + reserve > width {
            if last || used == 0 {
                lines.last_mut().unwrap().push((more, false));
                return lines;
            }
            lines.push(Vec::new());
            used = 0;
            continue;
        }
        let t = if sep == 1 {
            format!(" {text}")
        } else {
            text.clone()
        };
        used += t.chars().count();
        lines.last_mut().unwrap().push((t, *hot));
        i += 1;
    }
    lines
}

fn backend(b: Option<&str>) -> String {
    match b {
        None => "-".into(),
        Some("io_uring-futex") => "uring".into(),
        Some("futex_waitv") => "waitv".into(),
        Some("doorbell") => "bell".into(),
        Some(o) => o.chars().take(5).collect(),
    }
}

fn draw(frame: &Frame, view: &View, area: Rect, buf: &mut ratatui::buffer::Buffer) {
    if area.width < MIN_COLS || area.height < MIN_ROWS {
        let msg = format!(
            "terminal {}x{} is too small for deploy top: it needs {MIN_COLS}x{MIN_ROWS} (80x24 shows it all); q quits",
            area.width, area.height
        );
        ratatui::widgets::Widget::render(
            Paragraph::new(msg).wrap(ratatui::widgets::Wrap { trim: true }),
            area,
            buf,
        );
        return;
    }
    draw_frame(frame, view, area, buf);
}

fn draw_frame(frame: &Frame, view: &View, area: Rect, buf: &mut ratatui::buffer::Buffer) {
    use ratatui::widgets::Widget as _;
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let alarm = Style::default().fg(Color::Red).add_modifier(Modifier::BOLD);
    let warn = Style::default().fg(Color::Yellow);

    let mut head = vec![Span::styled("rtdeploy top", bold)];
    if let Some(r) = &frame.robot {
        head.push(Span::raw(format!("  robot {r}")));
    }
    if let Some(u) = frame.supervisor_uptime_s {
        head.push(Span::raw(format!("  up {u:.0}s")));
    }
    if let Some(b) = &frame.boot_check {
        // Its verdict word (`passed`, `failed`, `skipped`): the reason is
        // in `deploy status`, and a cut one would end mid-word.
        let verdict = b.split([':', ' ', '(']).next().unwrap_or(b);
        head.push(Span::raw(format!("  boot check {verdict}")));
    }
    if let Some(m) = frame.power_mode {
        head.push(Span::raw(format!("  power mode {m}")));
    }
    if view.paused {
        head.push(Span::styled("  PAUSED", alarm));
    }
    let mut lines = vec![Line::from(head)];
    if let Some(e) = &frame.error {
        lines.push(Line::styled(
            "no supervisor status (still asking every refresh):",
            alarm,
        ));
        // Wrapped by hand: the header's height is its line count.
        for l in wrap(e, area.width.max(8) as usize).into_iter().take(4) {
            lines.push(Line::styled(l, alarm));
        }
    }
    for l in thermal_lines(&frame.thermal, area.width as usize, THERMAL_LINES) {
        lines.push(Line::from(
            l.into_iter()
                .map(|(t, hot)| {
                    if hot {
                        Span::styled(t, alarm)
                    } else {
                        Span::raw(t)
                    }
                })
                .collect::<Vec<_>>(),
        ));
    }
    for n in &frame.notes {
        lines.push(Line::styled(format!("note: {n}"), warn));
    }
    let head_h = (lines.len() as u16).min(area.height / 3).max(1);

    let n_ch = frame.channels.len() as u16;
    let n_cpu = frame.cpus.len() as u16;
    let rest = area.height.saturating_sub(head_h + 1);
    let ch_h = if n_ch == 0 {
        0
    } else {
        (n_ch + 1).min(rest / 4).max(2)
    };
    let cpu_h = if n_cpu == 0 {
        0
    } else {
        (n_cpu + 1).min(rest / 3).max(2)
    };
    let [head_a, proc_a, ch_a, cpu_a, foot_a] = Layout::vertical([
        Constraint::Length(head_h),
        Constraint::Min(2),
        Constraint::Length(ch_h),
        Constraint::Length(cpu_h),
        Constraint::Length(1),
    ])
    .areas(area);
    Paragraph::new(lines).render(head_a, buf);

    // Wakeups of the latest report (P50, P99, MAX) and since the loop
    // started (SP99, SMAX), the longest handler run, the budget: in
    // microseconds unless a unit is given.
    let header = Row::new([
        "NAME", "STATE", "SCHED", "CPUS", "BKND", "P50", "P99", "MAX", "SP99", "SMAX", "HMAX",
        "BUDG", "MISS", "RST",
    ])
    .style(bold);
    let rows = frame.processes.iter().map(|p| {
        let over = |v: Option<f64>, b: Option<f64>| matches!((v, b), (Some(v), Some(b)) if v > b);
        let max_style = if over(p.wakeup_max_us, p.wakeup_budget_us) {
            alarm
        } else {
            Style::default()
        };
        let h_style = if over(p.handler_max_us, p.handler_budget_us) {
            alarm
        } else {
            Style::default()
        };
        let row = Row::new([
            Cell::from(p.name.clone()),
            Cell::from(p.state.clone()),
            Cell::from(p.sched.clone().unwrap_or_else(|| "-".into())),
            Cell::from(p.cpus.clone().unwrap_or_else(|| "-".into())),
            Cell::from(backend(p.backend.as_deref())),
            Cell::from(us(p.wakeup_p50_us)),
            Cell::from(us(p.wakeup_p99_us)),
            Cell::from(us(p.wakeup_max_us)).style(max_style),
            Cell::from(us(p.since_start_wakeup_p99_us)),
            Cell::from(us(p.since_start_wakeup_max_us)),
            Cell::from(us(p.handler_max_us)).style(h_style),
            Cell::from(us(p.wakeup_budget_us)),
            Cell::from(p.over_budget_reports.to_string()),
            Cell::from(p.restarts.to_string()),
        ]);
        if p.miss {
            row.style(alarm)
        } else if p.state != "running" {
            row.style(warn)
        } else {
            row
        }
    });
    Table::new(
        rows,
        // 80 columns with the spaces between them.
        [
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(7),
            Constraint::Length(4),
            Constraint::Length(5),
            Constraint::Length(4),
            Constraint::Length(4),
            Constraint::Length(4),
            Constraint::Length(4),
            Constraint::Length(4),
            Constraint::Length(4),
            Constraint::Length(4),
            Constraint::Length(4),
            Constraint::Length(3),
        ],
    )
    .header(header)
    .column_spacing(1)
    .render(proc_a, buf);

    if ch_h > 0 {
        let rows = frame.channels.iter().map(|c| {
            let r = Row::new([
                c.name.clone(),
                c.publishers.to_string(),
                c.subscribers.to_string(),
                format!("{:.0}", c.rate_hz),
                c.lost.to_string(),
                c.lost_total.to_string(),
            ]);
            if c.lost > 0 {
                r.style(warn)
            } else {
                r
            }
        });
        Table::new(
            rows,
            [
                Constraint::Length(24),
                Constraint::Length(4),
                Constraint::Length(4),
                Constraint::Length(9),
                Constraint::Length(8),
                Constraint::Length(10),
            ],
        )
        .header(Row::new(["CHANNEL", "PUB", "SUB", "RATE/s", "LOST/s", "LOST"]).style(bold))
        .render(ch_a, buf);
    }

    if cpu_h > 0 {
        let rows = frame.cpus.iter().map(|c| {
            let r = Row::new([
                format!("cpu{}", c.cpu),
                if c.online { "online" } else { "offline" }.to_string(),
                if c.isolated { "isolated" } else { "-" }.to_string(),
                c.freq_mhz.map_or("-".into(), |m| m.to_string()),
                c.capped_mhz.map_or("-".into(), |m| m.to_string()),
                c.util_pct.map_or("-".into(), |u| format!("{u:.0}%")),
                c.irqs_per_s.map_or("-".into(), |r| format!("{r:.0}")),
            ]);
            if c.alarm {
                r.style(alarm)
            } else if !c.online {
                r.style(warn)
            } else {
                r
            }
        });
        Table::new(
            rows,
            [
                Constraint::Length(7),
                Constraint::Length(8),
                Constraint::Length(9),
                Constraint::Length(6),
                Constraint::Length(6),
                Constraint::Length(6),
                Constraint::Length(9),
            ],
        )
        .header(Row::new(["CPU", "STATE", "ROLE", "MHZ", "CAPMHZ", "UTIL", "IRQ/s"]).style(bold))
        .render(cpu_a, buf);
    }

    let foot = match &view.editing {
        Some(t) => format!("filter: {t}_   (Enter applies, Esc clears)"),
        None => format!(
            "q quit  p pause  s sort: {}  / filter: {}  every {:.1}s  us; S: since start",
            frame.sort.name(),
            frame.filter.as_deref().unwrap_or("-"),
            view.interval.as_secs_f64()
        ),
    };
    Paragraph::new(foot)
        .style(Style::default().add_modifier(Modifier::REVERSED))
        .render(foot_a, buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_wrap_at_spaces_within_the_width() {
        assert_eq!(
            wrap("cannot connect to /run/x: refused", 12),
            ["cannot", "connect to", "/run/x:", "refused"]
        );
        assert_eq!(wrap("abcdefghij", 4), ["abcd", "efgh", "ij"]);
        assert!(wrap("", 5).is_empty());
    }

    #[test]
    fn microseconds_fit_four_columns() {
        for (v, s) in [
            (1.0, "1.0"),
            (12.34, "12.3"),
            (99.96, "100"),
            (1234.0, "1234"),
            (9_999.6, "10ms"),
            (12_345.0, "12ms"),
            (99_499.0, "99ms"),
            (99_500.0, "0.1s"),
            (250_000.0, "0.2s"),
            (9_949_999.0, "9.9s"),
            (9_950_000.0, "10s"),
            (999_499_999.0, "999s"),
            (999_500_000.0, ">1ks"),
            (u64::MAX as f64 / 1000.0, ">1ks"),
        ] {
            assert_eq!(us(Some(v)), s, "{v}");
            assert!(s.len() <= 4);
        }
        assert_eq!(us(None), "-");
    }

    fn zone(n: u32, name: &str, temp: f64, throttling: bool) -> services::thermal::ThermalZone {
        services::thermal::ThermalZone {
            zone: n,
            name: name.into(),
            temp_c: Some(temp),
            passive_c: Some(95.5),
            critical_c: None,
            enabled: true,
            throttling,
        }
    }

    #[test]
    fn thermal_zones_fit_their_lines_throttled_first() {
        let text = |lines: &[Vec<(String, bool)>]| -> Vec<String> {
            lines
                .iter()
                .map(|l| l.iter().map(|(t, _)| t.as_str()).collect())
                .collect()
        };
        let zones = [
            zone(0, "cpu-thermal", 48.25, false),
            zone(1, "gpu-thermal", 96.0, true),
            zone(2, "PMIC-Die", 40.0, false),
        ];
        let l = thermal_lines(&zones, 80, 2);
        assert_eq!(
            text(&l),
            ["thermal: gpu 96.0C>=95.5 THROTTLED cpu 48.2C PMIC-Die 40.0C"]
        );
        assert!(l[0][1].1 && !l[0][2].1, "only the throttled zone is hot");
        // Narrow: two lines, then a count of what did not fit.
        let many: Vec<_> = (0..20)
            .map(|n| zone(n, "soc-thermal", 50.0, false))
            .collect();
        let l = text(&thermal_lines(&many, 40, 2));
        assert_eq!(l.len(), 2);
        assert!(l.iter().all(|x| x.chars().count() <= 40), "{l:?}");
        assert!(l[1].ends_with("more"), "{l:?}");
        assert!(thermal_lines(&[], 80, 2).is_empty());
        assert_eq!(zone_name("-thermal"), "-thermal");
        assert_eq!(zone_name("tj-thermal"), "tj");
    }
}
