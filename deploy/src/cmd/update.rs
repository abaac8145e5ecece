//! `deploy update (--host H[,H..] | --hosts-file F) BUNDLE`: sends a bundle
//! to robots over the user's own OpenSSH and installs it there.
//!
//! For each robot, `ssh` (from PATH, so ~/.ssh/config, agents and jump
//! hosts apply) runs `deploy [--prefix DIR] serve-update` on the robot,
//! every word quoted for the remote shell. The robot verifies the signed
//! manifest first and asks only for the blobs it lacks; those cross
//! zstd-compressed (`releases::bundle::wire`). A connection that breaks is
//! retried, and the robot resumes from the bytes it already has (also on a
//! later run); the sending, the retries and the resume are
//! `releases::fleet`. Here: the robots from the arguments, one progress
//! bar per robot, then a summary table.
//! Exit: 0 every robot updated, 1 any robot failed, 2 error.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use releases::fleet::{update_fleet, Event, FleetOptions, Host};

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Args)]
pub struct UpdateArgs {
    /// Robots to update (ssh destinations), comma-separated.
    #[arg(
        long,
        value_name = "H[,H..]",
        value_delimiter = ',',
        required_unless_present = "hosts_file",
        conflicts_with = "hosts_file"
    )]
    pub host: Vec<String>,
    /// A file naming one robot per line: `DESTINATION [REMOTE_PREFIX]`
    /// (`#` starts a comment).
    #[arg(long, value_name = "F")]
    pub hosts_file: Option<PathBuf>,
    /// The bundle from `deploy bundle`.
    pub bundle: PathBuf,
    /// Robots updated at the same time.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub jobs: usize,
    /// The `deploy` program on the robots.
    #[arg(long, value_name = "PATH", default_value = "deploy")]
    pub remote_deploy: String,
    /// `--prefix` for `deploy` on the robots (a hosts file line may give
    /// its own).
    #[arg(long, value_name = "DIR")]
    pub remote_prefix: Option<String>,
    /// Passed to ssh as `-o OPT` (repeatable), e.g. `Port=2222`.
    #[arg(long = "ssh-option", value_name = "OPT")]
    pub ssh_options: Vec<String>,
    /// The ssh program.
    #[arg(long, value_name = "PATH", default_value = "ssh")]
    pub ssh: PathBuf,
    /// Reconnect this many times after a broken connection (the robot
    /// keeps what it received).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub retries: u32,
    /// Reboot each robot whose release needs it (a system update: a new
    /// kernel command line or CPU plan, judged after the reboot) by running
    /// `deploy reboot` there once the install is done. Without it such a
    /// robot keeps running the old release until someone reboots it.
    #[arg(long)]
    pub reboot: bool,
}

/// The largest hosts file read: a line per robot, a fleet of thousands.
const MAX_HOSTS_FILE: u64 = 4 << 20;

/// The robots from `--host` or `--hosts-file`.
fn targets(args: &UpdateArgs) -> anyhow::Result<Vec<Host>> {
    let mut out = Vec::new();
    if let Some(f) = &args.hosts_file {
        // units::bounded: at most MAX_HOSTS_FILE, a FIFO refused.
        let text = units::bounded::Bound::regular(MAX_HOSTS_FILE)
            .following_links()
            .read_text(f)
            .map_err(|e| e.into_io())
            .with_context(|| format!("hosts file {}", f.display()))?;
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut w = line.split_whitespace();
            let dest = w.next().expect("non-empty line").to_string();
            let prefix = w
                .next()
                .map(str::to_string)
                .or_else(|| args.remote_prefix.clone());
            if w.next().is_some() {
                bail!(
                    "{}:{}: `{line}` (expected `DESTINATION [REMOTE_PREFIX]`)",
                    f.display(),
                    i + 1
                );
            }
            out.push(Host { dest, prefix });
        }
    } else {
        for h in &args.host {
            let h = h.trim();
            if !h.is_empty() {
                out.push(Host {
                    dest: h.to_string(),
                    prefix: args.remote_prefix.clone(),
                });
            }
        }
    }
    for t in &out {
        if t.dest.starts_with('-') {
            bail!("robot `{}` looks like an ssh option (expected a destination like `robot1` or `user@10.0.0.5`)", t.dest);
        }
    }
    if out.is_empty() {
        bail!("no robots given (expected --host H[,H..] or a --hosts-file with at least one line)");
    }
    Ok(out)
}

/// One robot's progress bar.
fn show(bar: &ProgressBar, event: Event) {
    match event {
        Event::Connecting { attempt: 1 } => bar.set_message("connecting"),
        Event::Connecting { attempt } => {
            bar.set_message(format!("reconnecting (attempt {attempt})"))
        }
        Event::Need { blobs, bytes } => {
            bar.set_length(bytes.max(1));
            bar.set_position(0);
            bar.set_message(format!("sending {blobs} blob(s)"));
        }
        Event::Sent { bytes, of } => bar.set_position(bytes.min(of)),
        Event::Installing => {
            bar.set_position(bar.length().unwrap_or(0));
            bar.set_message("installing");
        }
        Event::Updated {
            state,
            release,
            reboot,
        } => bar.finish_with_message(format!(
            "{}{} ({release})",
            state.as_deref().unwrap_or("done"),
            if reboot { ", reboot needed" } else { "" }
        )),
        Event::Rebooting => bar.finish_with_message("rebooting"),
        Event::Failed { error } => bar.abandon_with_message(format!("FAILED: {error}")),
    }
}

pub fn run(ctx: &Ctx, args: UpdateArgs) -> anyhow::Result<Exit> {
    let targets = targets(&args)?;
    std::fs::metadata(&args.bundle).with_context(|| format!("bundle {}", args.bundle.display()))?;
    // Test hook: break the first connection to each robot after this many
    // bytes.
    let cut_after = std::env::var(units::env::TEST_CUT_AFTER)
        .ok()
        .and_then(|v| v.parse().ok());
    let multi = MultiProgress::with_draw_target(if ctx.quiet || ctx.json {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    });
    let width = targets
        .iter()
        .map(|t| t.dest.len())
        .max()
        .unwrap_or(8)
        .min(32);
    let style = ProgressStyle::with_template(&format!(
        "{{prefix:{width}}} [{{bar:30}}] {{bytes:>10}}/{{total_bytes:<10}} {{msg}}"
    ))
    .expect("valid template")
    .progress_chars("=> ");
    let bars: Vec<ProgressBar> = targets
        .iter()
        .map(|t| {
            let b = multi.add(ProgressBar::new(1));
            b.set_style(style.clone());
            b.set_prefix(t.dest.clone());
            b.set_message("waiting");
            b
        })
        .collect();
    let opts = FleetOptions {
        ssh: args.ssh.clone(),
        ssh_options: args.ssh_options.clone(),
        remote_deploy: args.remote_deploy.clone(),
        retries: args.retries,
        jobs: args.jobs,
        cut_after,
        reboot: args.reboot,
    };
    let results = update_fleet(&args.bundle, &targets, &opts, &|i, event| {
        show(&bars[i], event)
    });
    let failed = results.iter().filter(|o| !o.ok).count();
    if ctx.json {
        ctx.print_json(
            &serde_json::json!({ "bundle": args.bundle, "robots": results, "failed": failed }),
        )?;
    } else {
        let mut t = format!(
            "{:<width$}  {:<6}  {:<24}  {:<15}  {:>5}  {:>5}  {:>12}  {:>10}  {:>7}\n",
            "ROBOT",
            "RESULT",
            "RELEASE",
            "STATE",
            "SENT",
            "KEPT",
            "WIRE BYTES",
            "RESUMED",
            "SECONDS"
        );
        for o in &results {
            t += &format!(
                "{:<width$}  {:<6}  {:<24}  {:<15}  {:>5}  {:>5}  {:>12}  {:>10}  {:>7.1}\n",
                o.host,
                if o.ok { "ok" } else { "FAILED" },
                o.release.as_deref().unwrap_or("-"),
                o.state.as_deref().unwrap_or("-"),
                o.blobs_sent,
                o.blobs_skipped,
                o.bytes_on_wire,
                o.resumed_bytes,
                o.seconds
            );
            if let Some(e) = &o.error {
                t += &format!("{:<width$}  error: {e}\n", "");
            } else if o.rebooted {
                t += &format!("{:<width$}  rebooting: its trial is judged after the reboot (deploy status there)\n", "");
            } else if o.reboot {
                t += &format!("{:<width$}  reboot needed: the release changes the system and runs after a reboot (--reboot asks for it)\n", "");
            }
        }
        crate::ctx::write_stdout(&t)?;
    }
    Ok(if failed == 0 { Exit::Ok } else { Exit::Failed })
}
