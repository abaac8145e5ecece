//! `deploy update (--host H[,H..] | --hosts-file F) BUNDLE`: sends a bundle
//! to robots over the user's own OpenSSH and installs it there.
//!
//! For each robot, `ssh` (from PATH, so ~/.ssh/config, agents and jump
//! hosts apply) runs `deploy [--prefix DIR] serve-update` on the robot,
//! every word quoted for the remote shell. The robot verifies the signed
//! manifest first and asks only for the blobs it lacks; those cross
//! zstd-compressed (`image::bundle::wire`). A connection that breaks is
//! retried, and the robot resumes from the bytes it already has (also on a
//! later run). One progress bar per robot, then a summary table.
//! Exit: 0 every robot updated, 1 any robot failed, 2 error.

use std::collections::VecDeque;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use image::bundle::wire::{send_bundle, Progress, SendOptions, SendReport, WireError};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

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
}

/// Quotes one word for a POSIX shell: left alone if it holds only
/// characters no shell treats specially, else in single quotes with each
/// `'` written as `'\''`.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./:=@%+,".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// The remote command line: every word quoted.
pub fn remote_command(deploy: &str, prefix: Option<&str>) -> String {
    let mut words = vec![deploy];
    if let Some(p) = prefix {
        words.extend(["--prefix", p]);
    }
    words.push("serve-update");
    words
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Debug, Clone)]
struct Target {
    dest: String,
    prefix: Option<String>,
}

fn targets(args: &UpdateArgs) -> anyhow::Result<Vec<Target>> {
    let mut out = Vec::new();
    if let Some(f) = &args.hosts_file {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("hosts file {}", f.display()))?;
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
            out.push(Target { dest, prefix });
        }
    } else {
        for h in &args.host {
            let h = h.trim();
            if !h.is_empty() {
                out.push(Target {
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

/// One robot's result.
#[derive(Debug, Serialize)]
struct Outcome {
    host: String,
    prefix: Option<String>,
    ok: bool,
    release: Option<String>,
    state: Option<String>,
    blobs_sent: usize,
    blobs_skipped: usize,
    resumed_bytes: u64,
    bytes_on_wire: u64,
    attempts: u32,
    seconds: f64,
    error: Option<String>,
}

fn attempt(
    args: &UpdateArgs,
    t: &Target,
    opts: &SendOptions,
    bar: &ProgressBar,
) -> Result<SendReport, Box<AttemptFailure>> {
    let mut cmd = Command::new(&args.ssh);
    for o in &args.ssh_options {
        cmd.arg("-o").arg(o);
    }
    // After the user's options: for ssh the first value given wins.
    cmd.args(["-o", "BatchMode=yes", "-T", "--", &t.dest]);
    cmd.arg(remote_command(&args.remote_deploy, t.prefix.as_deref()));
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| {
        Box::new(AttemptFailure {
            error: WireError::Io(e),
            stderr: format!("cannot run {}", args.ssh.display()),
            code: None,
        })
    })?;
    let stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut total = 0u64;
    let result = send_bundle(&args.bundle, stdout, stdin, opts, &mut |p| match p {
        Progress::Need { blobs, bytes } => {
            total = bytes;
            bar.set_length(bytes.max(1));
            bar.set_position(0);
            bar.set_message(format!("sending {blobs} blob(s)"));
        }
        Progress::Sent { bytes } => bar.set_position(bytes.min(total)),
        Progress::Installing => {
            bar.set_position(total);
            bar.set_message("installing");
        }
    });
    // stdin was moved into send_bundle and is closed now: the remote side
    // sees the end and exits.
    let code = child.wait().ok().and_then(|s| s.code());
    let stderr = err_thread.join().unwrap_or_default();
    result.map_err(|error| {
        Box::new(AttemptFailure {
            error,
            stderr,
            code,
        })
    })
}

/// Why one connection to a robot ended without an install: the protocol
/// error, what the remote side said on stderr, and ssh's exit code.
struct AttemptFailure {
    error: WireError,
    stderr: String,
    code: Option<i32>,
}

fn update_one(args: &UpdateArgs, t: &Target, bar: &ProgressBar, cut_after: Option<u64>) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome {
        host: t.dest.clone(),
        prefix: t.prefix.clone(),
        ok: false,
        release: None,
        state: None,
        blobs_sent: 0,
        blobs_skipped: 0,
        resumed_bytes: 0,
        bytes_on_wire: 0,
        attempts: 0,
        seconds: 0.0,
        error: None,
    };
    loop {
        out.attempts += 1;
        // The test hook cuts the first connection only, so a retry shows
        // the resume.
        let opts = SendOptions {
            cut_after: if out.attempts == 1 { cut_after } else { None },
        };
        bar.set_message(if out.attempts == 1 {
            "connecting".to_string()
        } else {
            format!("reconnecting (attempt {})", out.attempts)
        });
        match attempt(args, t, &opts, bar) {
            Ok(rep) => {
                out.ok = true;
                out.bytes_on_wire += rep.bytes_out + rep.bytes_in;
                out.blobs_sent += rep.blobs_sent;
                out.blobs_skipped = rep.blobs_skipped;
                if out.attempts == 1 || out.resumed_bytes == 0 {
                    out.resumed_bytes = rep.resumed_bytes;
                }
                out.release = Some(rep.release);
                out.state = rep
                    .result
                    .get("state")
                    .and_then(|s| s.as_str())
                    .map(str::to_string);
                bar.finish_with_message(format!(
                    "{} ({})",
                    out.state.as_deref().unwrap_or("done"),
                    out.release.as_deref().unwrap_or("")
                ));
                break;
            }
            Err(failure) => {
                let AttemptFailure {
                    error: e,
                    stderr,
                    code,
                } = *failure;
                // Reconnect when the connection broke (ssh exits 255 on its
                // own errors; a broken pipe or read error on our side), not
                // when the robot refused or `deploy` there failed to start.
                let broken = code == Some(255) || (matches!(e, WireError::Io(_)) && code.is_some());
                let retry = broken && out.attempts <= args.retries;
                let last = stderr
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim()
                    .to_string();
                let msg = if last.is_empty() || matches!(e, WireError::Remote(_)) {
                    e.to_string()
                } else {
                    format!("{e} ({last})")
                };
                if retry {
                    std::thread::sleep(Duration::from_millis(200 * out.attempts as u64));
                    continue;
                }
                bar.abandon_with_message(format!("FAILED: {msg}"));
                out.error = Some(msg);
                break;
            }
        }
    }
    out.seconds = start.elapsed().as_secs_f64();
    out
}

pub fn run(ctx: &Ctx, args: UpdateArgs) -> anyhow::Result<Exit> {
    let targets = targets(&args)?;
    std::fs::metadata(&args.bundle).with_context(|| format!("bundle {}", args.bundle.display()))?;
    // Test hook: break the first connection to each robot after this many
    // bytes.
    let cut_after = std::env::var("RTDEPLOY_TEST_CUT_AFTER")
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
    let queue = Mutex::new((0..targets.len()).collect::<VecDeque<_>>());
    let results = Mutex::new(
        (0..targets.len())
            .map(|_| None)
            .collect::<Vec<Option<Outcome>>>(),
    );
    std::thread::scope(|s| {
        for _ in 0..args.jobs.clamp(1, targets.len()) {
            s.spawn(|| loop {
                let Some(i) = queue.lock().expect("queue").pop_front() else {
                    break;
                };
                let o = update_one(&args, &targets[i], &bars[i], cut_after);
                results.lock().expect("results")[i] = Some(o);
            });
        }
    });
    let results: Vec<Outcome> = results
        .into_inner()
        .expect("results")
        .into_iter()
        .map(|o| o.expect("every robot ran"))
        .collect();
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
            }
        }
        crate::ctx::write_stdout(&t)?;
    }
    Ok(if failed == 0 { Exit::Ok } else { Exit::Failed })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NASTY: &[&str] = &[
        "plain",
        "",
        "with space",
        "it's",
        "'",
        "''",
        "\"double\"",
        "$(touch /tmp/rtdeploy-pwned)",
        "`id`",
        "a;b",
        "a && b || c",
        "back\\slash",
        "new\nline",
        "tab\there",
        "*",
        "~",
        "-n",
        "#comment",
        "$HOME",
        "!event",
        "{a,b}",
        "a|b>c<d",
        "ünïcödé",
    ];

    #[test]
    fn quoted_words_reach_the_program_unchanged() {
        let line = NASTY
            .iter()
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" ");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\0' {line}"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Vec<String> = out
            .stdout
            .split(|&b| b == 0)
            .filter(|_| true)
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
            .collect();
        // printf's output ends with a NUL, so the split leaves an empty tail
        assert_eq!(&got[..got.len() - 1], NASTY);
        assert!(!std::path::Path::new("/tmp/rtdeploy-pwned").exists());
    }

    #[test]
    fn plain_words_stay_readable() {
        assert_eq!(shell_quote("/usr/bin/deploy"), "/usr/bin/deploy");
        assert_eq!(
            remote_command("deploy", Some("/srv/robot a")),
            "deploy --prefix '/srv/robot a' serve-update"
        );
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
