//! `deploy log ls|info|cat|export` and `deploy replay`: the logger's MCAP
//! files (robot.yaml `log:`), or any MCAP file.
//!
//! Times on the command line (`--from`, `--to`) are offsets from the
//! file's first message (`2s`, `150ms`); printed times are UTC. A file cut
//! short (a power cut while the logger wrote it) is read up to its last
//! complete chunk and the output says so. Exit: 0 done, 2 error.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use logbook::read::{scan_file, Filter, Flow, Summary};
use units::duration::Dur;

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Subcommand)]
pub enum LogCommand {
    /// The log files with their time ranges, sizes and message counts.
    Ls(LsArgs),
    /// One file: per-channel counts, rates, lost messages, its clock
    /// mapping, whether it was finished or cut short.
    Info(FileArgs),
    /// Print messages, decoded where the file says how (ros2msg/cdr,
    /// json, timing reports), else as hex.
    Cat(CatArgs),
    /// Write a time window or a channel subset to a new MCAP file.
    Export(ExportArgs),
    /// Where two logs first differ: channel, message, log time and field
    /// (timing reports and the logger's own records left out unless
    /// --channels names them; exit 0 the same, 1 they differ, 2 error).
    Diff(DiffArgs),
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The first log (A).
    pub a: PathBuf,
    /// The second log (B).
    pub b: PathBuf,
    /// Channels to compare, as globs (repeatable) [default: every channel
    /// but /rtdeploy/timing/*, /rtdeploy/events, /rtdeploy/log/* and
    /// /original/*].
    #[arg(long = "channels", value_name = "GLOB", num_args = 1..)]
    pub channels: Vec<String>,
    /// Compare payloads only, not log times (a run recorded on the wall
    /// clock against its replay in `deploy sim`, on a virtual one).
    #[arg(long)]
    pub payloads: bool,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// The directory (default: robot.yaml's `log.dir`, else
    /// /var/log/rtdeploy/mcap under the prefix).
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct FileArgs {
    /// A log file (`deploy log ls` lists them), or any MCAP file.
    pub file: PathBuf,
}

#[derive(Debug, Args, Clone)]
pub struct Window {
    /// Channels to take, as globs (repeatable; default all).
    #[arg(long = "channels", value_name = "GLOB", num_args = 1..)]
    pub channels: Vec<String>,
    /// From this offset after the file's first message (e.g. `2s`).
    #[arg(long, value_parser = parse_dur)]
    pub from: Option<Dur>,
    /// Up to this offset after the file's first message.
    #[arg(long, value_parser = parse_dur)]
    pub to: Option<Dur>,
}

#[derive(Debug, Args)]
pub struct CatArgs {
    /// A log file (`deploy log ls` lists them), or any MCAP file.
    pub file: PathBuf,
    #[command(flatten)]
    pub window: Window,
    /// Print at most this many messages.
    #[arg(long)]
    pub limit: Option<u64>,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A log file (`deploy log ls` lists them), or any MCAP file.
    pub file: PathBuf,
    /// The new file (must not exist).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub window: Window,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A log file (`deploy log ls`).
    pub file: PathBuf,
    #[command(flatten)]
    pub window: Window,
    /// Replay speed: 1 as recorded, 2 twice as fast.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Replay even though a supervisor runs on this robot (its processes
    /// see the replayed messages beside the real ones).
    #[arg(long)]
    pub force: bool,
}

fn parse_dur(s: &str) -> Result<Dur, String> {
    Dur::parse(s).map_err(|e| e.to_string())
}

/// The logger's directory from robot.yaml, else the default.
fn log_dir(ctx: &Ctx) -> PathBuf {
    let configured = services::robot::load(&ctx.config_path)
        .ok()
        .and_then(|l| l.robot.log)
        .and_then(|l| l.dir);
    match configured {
        Some(d) => units::path::join_under(&ctx.prefix, &d)
            .unwrap_or_else(|_| ctx.root("/var/log/rtdeploy/mcap")),
        None => ctx.root("/var/log/rtdeploy/mcap"),
    }
}

/// The filter of a window, in the file's log times.
fn filter(w: &Window, first: Option<u64>) -> Filter {
    let at = |d: Option<Dur>| d.map(|d| first.unwrap_or(0).saturating_add(d.as_nanos()));
    Filter {
        channels: w.channels.clone(),
        from: at(w.from),
        to: at(w.to),
    }
}

fn read_summary(path: &Path) -> anyhow::Result<Summary> {
    Ok(scan_file(path, |_| Flow::Go)?)
}

/// `YYYY-mm-ddTHH:MM:SS.nnnnnnnnnZ`.
pub fn utc(ns: u64) -> String {
    let s = logbook::recorder::utc_stamp(ns);
    format!(
        "{}-{}-{}T{}:{}:{}.{:09}Z",
        &s[0..4],
        &s[4..6],
        &s[6..8],
        &s[9..11],
        &s[11..13],
        &s[13..15],
        ns % 1_000_000_000
    )
}

fn state(sum: &Summary) -> String {
    if sum.stopped && sum.truncated.is_none() {
        return "read up to --limit".into();
    }
    match (&sum.truncated, sum.finished) {
        (Some(t), _) => format!("cut short: {t}"),
        (None, true) => "finished".into(),
        (None, false) => format!(
            "not finished ({} complete chunks; the logger is writing it, or stopped without finishing it)",
            sum.chunks
        ),
    }
}

pub fn run(ctx: &Ctx, c: LogCommand) -> anyhow::Result<Exit> {
    match c {
        LogCommand::Ls(a) => ls(ctx, a),
        LogCommand::Info(a) => info(ctx, &a.file),
        LogCommand::Cat(a) => cat(ctx, a),
        LogCommand::Export(a) => export(ctx, a),
        LogCommand::Diff(a) => diff(ctx, a),
    }
}

fn diff(ctx: &Ctx, a: DiffArgs) -> anyhow::Result<Exit> {
    let opts = logbook::diff::DiffOptions {
        channels: a.channels,
        payloads_only: a.payloads,
        ..Default::default()
    };
    let r = logbook::diff::diff(&a.a, &a.b, &opts)?;
    let exit = if r.first.is_some() {
        Exit::Failed
    } else {
        Exit::Ok
    };
    if ctx.json {
        ctx.print_json(&serde_json::json!({"schema_version": 1, "diff": r}))?;
        return Ok(exit);
    }
    let total: u64 = r.compared.values().sum();
    let mut out = format!(
        "compared {total} messages on {} channel{} ({})\n",
        r.compared.len(),
        if r.compared.len() == 1 { "" } else { "s" },
        r.compared
            .iter()
            .map(|(c, n)| format!("{c}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if opts.payloads_only {
        out.push_str("payloads only: log times not compared (--payloads)\n");
    }
    for (g, why) in &r.left_out {
        out.push_str(&format!(
            "left out: {g} ({why}; --channels to compare them)\n"
        ));
    }
    match &r.first {
        None => out.push_str("the logs are the same on the channels compared\n"),
        Some(d) => {
            let t =
                |t: Option<u64>| t.map_or("-".to_string(), |t| format!("{:.9}", t as f64 / 1e9));
            let v = |v: &Option<serde_json::Value>| {
                v.as_ref().map_or("-".to_string(), |v| v.to_string())
            };
            out.push_str(&format!(
                "first difference: {} message {} (log time {} in A, {} in B): {}",
                d.channel,
                d.message,
                t(d.log_time_a),
                t(d.log_time_b),
                d.what
            ));
            if d.a.is_some() || d.b.is_some() {
                out.push_str(&format!(": {} in A, {} in B", v(&d.a), v(&d.b)));
            }
            out.push('\n');
        }
    }
    crate::ctx::write_stdout(&out)?;
    Ok(exit)
}

fn ls(ctx: &Ctx, a: LsArgs) -> anyhow::Result<Exit> {
    let dir = a.dir.unwrap_or_else(|| log_dir(ctx));
    if !dir.is_dir() {
        anyhow::bail!(
            "{}: no such directory (is `log:` set in robot.yaml?)",
            dir.display()
        );
    }
    let mut rows = Vec::new();
    for (path, size) in logbook::recorder::list_files(&dir) {
        let r = read_summary(&path);
        rows.push(match r {
            Ok(s) => serde_json::json!({
                "file": path.display().to_string(),
                "bytes": size,
                "messages": s.messages,
                "lost": s.gaps(),
                "first": s.first_log_time.map(utc),
                "last": s.last_log_time.map(utc),
                "state": state(&s),
            }),
            Err(e) => serde_json::json!({
                "file": path.display().to_string(),
                "bytes": size,
                "error": format!("{e:#}"),
            }),
        });
    }
    if ctx.json {
        ctx.print_json(&serde_json::json!({"schema_version": 1, "dir": dir, "files": rows}))?;
        return Ok(Exit::Ok);
    }
    // Plain values: a JSON value ignores the width it is printed with.
    let name = |r: &serde_json::Value| {
        Path::new(r["file"].as_str().unwrap_or(""))
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let num = |v: &serde_json::Value| v.as_u64().map_or("-".to_string(), |n| n.to_string());
    let w = rows.iter().map(|r| name(r).len()).max().unwrap_or(0).max(4);
    let mut out = format!(
        "{:<w$} {:>10} {:>9} {:>6}  {:<30}  {}\n",
        "FILE", "BYTES", "MESSAGES", "LOST", "FIRST", "LAST"
    );
    for r in &rows {
        let name = name(r);
        if let Some(e) = r["error"].as_str() {
            out.push_str(&format!(
                "{name:<w$} {:>10} unreadable: {e}\n",
                num(&r["bytes"])
            ));
            continue;
        }
        out.push_str(&format!(
            "{name:<w$} {:>10} {:>9} {:>6}  {:<30}  {}{}\n",
            num(&r["bytes"]),
            num(&r["messages"]),
            num(&r["lost"]),
            r["first"].as_str().unwrap_or("-"),
            r["last"].as_str().unwrap_or("-"),
            if r["state"] == "finished" {
                String::new()
            } else {
                format!("  ({})", r["state"].as_str().unwrap_or(""))
            }
        ));
    }
    crate::ctx::write_stdout(&out)?;
    Ok(Exit::Ok)
}

fn info(ctx: &Ctx, file: &Path) -> anyhow::Result<Exit> {
    let sum = read_summary(file)?;
    if ctx.json {
        ctx.print_json(
            &serde_json::json!({"schema_version": 1, "file": sum, "state": state(&sum)}),
        )?;
        return Ok(Exit::Ok);
    }
    // The file's length (the reader stops at the data section's end).
    let len = std::fs::metadata(file).map_or(sum.size, |m| m.len().max(sum.size));
    let mut out = format!("{}: {len} bytes, {}\n", file.display(), state(&sum));
    if !sum.library.is_empty() {
        out.push_str(&format!("written by: {}\n", sum.library));
    }
    if let (Some(a), Some(b)) = (sum.first_log_time, sum.last_log_time) {
        out.push_str(&format!(
            "time: {} .. {} ({:.3}s)\n",
            utc(a),
            utc(b),
            (b - a) as f64 / 1e9
        ));
    }
    if sum.decompressed > 0 {
        out.push_str(&format!(
            "chunks: {} read, {} bytes of records decompressed ({:.1} times the {} bytes read)\n",
            sum.chunks,
            sum.decompressed,
            sum.decompressed as f64 / sum.size.max(1) as f64,
            sum.size
        ));
    }
    if let Some(c) = sum.clock() {
        out.push_str(&format!(
            "clock: CLOCK_MONOTONIC {} ns = {} (log times are monotonic send times moved by this one offset)\n",
            c.monotonic_ns,
            utc(c.realtime_ns)
        ));
    }
    out.push_str(&format!(
        "{:<32} {:>9} {:>7} {:>10} {:>10}  {}\n",
        "CHANNEL", "MESSAGES", "LOST", "RATE/s", "BYTES", "ENCODING"
    ));
    for c in &sum.channels {
        let span = match (c.first_log_time, c.last_log_time) {
            (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e9,
            _ => 0.0,
        };
        let rate = if span > 0.0 {
            format!("{:.1}", (c.messages.saturating_sub(1)) as f64 / span)
        } else {
            "-".into()
        };
        out.push_str(&format!(
            "{:<32} {:>9} {:>7} {:>10} {:>10}  {}{}\n",
            c.topic,
            c.messages,
            c.gaps,
            rate,
            c.bytes,
            c.message_encoding,
            c.schema_name
                .as_ref()
                .map(|s| format!(" ({s})"))
                .unwrap_or_default()
        ));
    }
    for (topic, n) in &sum.lost {
        if sum.channel(topic).is_none() {
            out.push_str(&format!(
                "{topic:<32} {:>9} {n:>7}  (none of its messages are in this file)\n",
                0
            ));
        }
    }
    crate::ctx::write_stdout(&out)?;
    Ok(Exit::Ok)
}

fn cat(ctx: &Ctx, a: CatArgs) -> anyhow::Result<Exit> {
    let first = logbook::read::first_log_time_file(&a.file)?;
    let f = filter(&a.window, first);
    let limit = a.limit.unwrap_or(u64::MAX);
    let mut n = 0u64;
    let mut unwrap = logbook::read::Unwrap::default();
    let mut senders = logbook::read::Senders::default();
    // Each message is written as it is read: nothing is held but the
    // chunk being read and the output buffer.
    let mut out = Out::new();
    if ctx.json {
        out.put(b"{\"schema_version\":1,\"messages\":[");
    }
    let sum = scan_file(&a.file, |m| {
        senders.note(m);
        if n >= limit {
            return Flow::Stop;
        }
        if !f.takes(m) {
            return Flow::Go;
        }
        let index = unwrap.index(&m.channel.topic, m.sequence);
        let value = m.channel.decode(m.data);
        let sender = senders.sender(&m.channel.topic, index);
        if ctx.json {
            let doc = serde_json::json!({
                "time": utc(m.log_time),
                "log_time": m.log_time,
                "channel": m.channel.topic,
                "sequence": m.sequence,
                "sender_pid": sender,
                "value": value,
                "bytes": if value.is_none() { Some(hex(m.channel.payload(m.data))) } else { None },
            });
            if n > 0 {
                out.put(b",");
            }
            out.put(&serde_json::to_vec(&doc).unwrap_or_default());
        } else {
            let line = format!(
                "{} {} #{}{} {}\n",
                utc(m.log_time),
                m.channel.topic,
                m.sequence,
                sender.map(|p| format!(" pid {p}")).unwrap_or_default(),
                match value {
                    Some(v) => v.to_string(),
                    None => hex(m.channel.payload(m.data)),
                }
            );
            out.put(line.as_bytes());
        }
        n += 1;
        if out.failed() {
            Flow::Stop
        } else {
            Flow::Go
        }
    })?;
    if ctx.json {
        out.put(b"],\"state\":");
        out.put(&serde_json::to_vec(&state(&sum)).unwrap_or_default());
        out.put(b"}\n");
    }
    out.finish()?;
    if !ctx.json && sum.truncated.is_some() {
        ctx.note(format!("{}: {}", a.file.display(), state(&sum)));
    }
    if senders.dropped() > 0 {
        ctx.note(format!(
            "{}: {} sender records past the {} kept: their messages show no sender",
            a.file.display(),
            senders.dropped(),
            logbook::read::MAX_SENDERS
        ));
    }
    Ok(Exit::Ok)
}

/// Standard output, buffered: a write error is kept and ends the command
/// (a reader that went away ends it quietly, as [`crate::ctx::write_stdout`]
/// does).
struct Out {
    w: std::io::BufWriter<std::io::Stdout>,
    err: Option<std::io::Error>,
}

impl Out {
    fn new() -> Out {
        Out {
            w: std::io::BufWriter::with_capacity(64 << 10, std::io::stdout()),
            err: None,
        }
    }

    fn put(&mut self, b: &[u8]) {
        use std::io::Write;
        if self.err.is_none() {
            if let Err(e) = self.w.write_all(b) {
                self.err = Some(e);
            }
        }
    }

    fn failed(&self) -> bool {
        self.err.is_some()
    }

    fn finish(mut self) -> anyhow::Result<()> {
        use std::io::Write;
        let r = match self.err.take() {
            Some(e) => Err(e),
            None => self.w.flush(),
        };
        match r {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
            r => Ok(r?),
        }
    }
}

fn hex(b: &[u8]) -> String {
    const MAX: usize = 256;
    let mut s: String = b.iter().take(MAX).map(|x| format!("{x:02x}")).collect();
    if b.len() > MAX {
        s.push_str(&format!("... ({} bytes)", b.len()));
    }
    s
}

fn export(ctx: &Ctx, a: ExportArgs) -> anyhow::Result<Exit> {
    let f = filter(&a.window, first_log_time(&a.file)?);
    let rep = logbook::read::export(&a.file, &a.out, &f)
        .with_context(|| format!("exporting {}", a.file.display()))?;
    if ctx.json {
        ctx.print_json(&serde_json::json!({"schema_version": 1, "export": rep}))?;
    } else {
        let mut out = format!("{}: {} messages\n", a.out.display(), rep.messages);
        for (c, n) in &rep.channels {
            out.push_str(&format!("  {c}: {n}\n"));
        }
        crate::ctx::write_stdout(&out)?;
    }
    if let Some(t) = &rep.truncated_input {
        ctx.note(format!("{}: cut short: {t}", a.file.display()));
    }
    Ok(Exit::Ok)
}

/// The file's earliest log time, from its chunk headers (the windows are
/// relative to it); the file is decompressed once, by the command itself.
fn first_log_time(path: &std::path::Path) -> anyhow::Result<Option<u64>> {
    Ok(logbook::read::first_log_time_file(path)?)
}

/// `deploy replay FILE`.
pub fn run_replay(ctx: &Ctx, a: ReplayArgs) -> anyhow::Result<Exit> {
    let sock = services::control::socket_path(&ctx.prefix);
    if !a.force
        && services::control::request(&sock, &services::control::Request::Status)
            .is_ok_and(|r| r.ok)
    {
        anyhow::bail!(
            "a supervisor runs on this robot ({} answers): its processes would see replayed messages beside real ones; stop it, or replay with --force",
            sock.display()
        );
    }
    let opts = logbook::replay::ReplayOptions {
        filter: filter(&a.window, first_log_time(&a.file)?),
        speed: a.speed,
        shm_dir: releases::Layout::new(&ctx.prefix).shm_dir(),
        proc_root: ctx.sys("/proc"),
    };
    let rep = logbook::replay::replay(&a.file, &opts)?;
    if ctx.json {
        ctx.print_json(&serde_json::json!({"schema_version": 1, "replay": rep}))?;
    } else {
        let mut out = format!(
            "replayed {} messages of {} at speed {}: {:.3}s recorded, {:.3}s replayed (scaled back); drift p50 {:.1}us, p99 {:.1}us, max {:.1}us\n",
            rep.published,
            a.file.display(),
            rep.speed,
            rep.recorded_span_ns as f64 / 1e9,
            rep.replayed_span_ns as f64 / 1e9,
            rep.drift_p50_ns as f64 / 1e3,
            rep.drift_p99_ns as f64 / 1e3,
            rep.drift_max_ns as f64 / 1e3,
        );
        for (c, r) in &rep.channels {
            out.push_str(&format!(
                "  {c}: {} published, {} refused, {} lost in the recording\n",
                r.published, r.refused, r.gaps_in_log
            ));
        }
        if rep.out_of_order > 0 {
            out.push_str(&format!(
                "  {} message(s) published after a later one (the file's order strayed further than the {} messages held to sort it)\n",
                rep.out_of_order,
                logbook::replay::REORDER_MESSAGES
            ));
        }
        crate::ctx::write_stdout(&out)?;
    }
    Ok(Exit::Ok)
}
