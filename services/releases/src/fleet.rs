//! The sender's end of `deploy update`: a bundle sent to many robots over
//! the user's own OpenSSH, a few at a time, each connection that breaks
//! retried (the robot resumes from the bytes it already has).
//!
//! For each robot, `ssh` (so ~/.ssh/config, agents and jump hosts apply)
//! runs `deploy [--prefix DIR] serve-update` on the robot, every word
//! quoted for the remote shell, and [`send_bundle`] speaks the update
//! protocol on its stdin and stdout. What happens is reported as
//! [`Event`]s (for progress bars) and, per robot, as an [`Outcome`].

use std::collections::VecDeque;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::bundle::wire::{send_bundle, Progress, SendOptions, SendReport, WireError};

/// One robot to update: where `deploy update` reaches it (the robot
/// itself, robot.yaml's model, is `services::robot::Robot`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The ssh destination (`robot1`, `user@10.0.0.5`).
    pub dest: String,
    /// `--prefix` for `deploy` on the robot.
    pub prefix: Option<String>,
}

/// How to reach the robots and how hard to try.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// The ssh program.
    pub ssh: PathBuf,
    /// Passed to ssh as `-o OPT`, before ours.
    pub ssh_options: Vec<String>,
    /// The `deploy` program on the robots.
    pub remote_deploy: String,
    /// Reconnections after a broken connection.
    pub retries: u32,
    /// Robots updated at the same time.
    pub jobs: usize,
    /// Test hook: the first connection to each robot breaks after this
    /// many bytes, so a retry shows the resume.
    pub cut_after: Option<u64>,
    /// Ask a robot whose release needs a reboot (a system update) to
    /// reboot: `deploy [--prefix P] reboot` over ssh once the install is
    /// done.
    pub reboot: bool,
}

/// What is happening to one robot, for a progress display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Connection attempt `attempt` (1 for the first) starts.
    Connecting { attempt: u32 },
    /// The robot needs this many blobs and bytes (after what it has).
    Need { blobs: usize, bytes: u64 },
    /// Blob bytes sent so far, of the `of` the robot needs.
    Sent { bytes: u64, of: u64 },
    /// Every blob is there; the robot is installing.
    Installing,
    /// Installed: the robot's state (`trial`, `committed`,
    /// `already-current`) and the release.
    Updated {
        state: Option<String>,
        release: String,
        reboot: bool,
    },
    /// The robot was asked to reboot (its release needs one).
    Rebooting,
    /// Given up on this robot.
    Failed { error: String },
}

/// One robot's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub host: String,
    pub prefix: Option<String>,
    pub ok: bool,
    pub release: Option<String>,
    pub state: Option<String>,
    /// The release needs a reboot to run (a system update in trial, judged
    /// after the reboot).
    pub reboot: bool,
    /// The robot accepted `deploy reboot` ([`FleetOptions::reboot`]).
    pub rebooted: bool,
    pub blobs_sent: usize,
    pub blobs_skipped: usize,
    pub resumed_bytes: u64,
    pub bytes_on_wire: u64,
    pub attempts: u32,
    pub seconds: f64,
    pub error: Option<String>,
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
    remote_words(deploy, prefix, "serve-update")
}

/// `deploy [--prefix P] COMMAND`, every word quoted.
fn remote_words(deploy: &str, prefix: Option<&str>, command: &str) -> String {
    let mut words = vec![deploy];
    if let Some(p) = prefix {
        words.extend(["--prefix", p]);
    }
    words.push(command);
    words
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last line that is not blank of what the robot said on stderr.
fn last_line(said: &str) -> &str {
    said.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
}

/// How long the robot may take to answer `deploy reboot`: it only starts
/// the reboot (`systemctl --no-block reboot`) and exits.
const REBOOT_ANSWER: Duration = Duration::from_secs(60);

/// Why a robot did not take `deploy reboot` ([`ask_reboot`]).
#[derive(Debug, thiserror::Error)]
enum RebootAskError {
    #[error("cannot run {}", ssh.display())]
    Spawn {
        ssh: PathBuf,
        source: std::io::Error,
    },
    #[error("`deploy reboot` exited {code}")]
    Exited { code: i32 },
    /// It exited non-zero, and the last line it wrote on stderr.
    #[error("`deploy reboot` exited {code}: {said}")]
    ExitedSaying { code: i32, said: String },
    #[error("`deploy reboot` ended by a signal ({said})")]
    Signal { said: String },
    #[error("no answer from `deploy reboot` within {} s", REBOOT_ANSWER.as_secs())]
    NoAnswer,
}

/// `deploy [--prefix P] reboot` on the robot, over the same ssh: `Ok` when
/// it exited 0 (the reboot is under way), else what it said. Bounded by
/// [`REBOOT_ANSWER`]: a robot that goes down before ssh returns cannot
/// hold the sender.
fn ask_reboot(robot: &Host, opts: &FleetOptions) -> Result<(), RebootAskError> {
    let mut cmd = Command::new(&opts.ssh);
    for o in &opts.ssh_options {
        cmd.arg("-o").arg(o);
    }
    cmd.args(["-o", "BatchMode=yes", "-T", "--", &robot.dest]);
    cmd.arg(remote_words(
        &opts.remote_deploy,
        robot.prefix.as_deref(),
        "reboot",
    ));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| RebootAskError::Spawn {
        ssh: opts.ssh.clone(),
        source,
    })?;
    let mut stderr = child.stderr.take().expect("piped");
    let err_thread = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = (&mut stderr).take(64 * 1024).read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let until = Instant::now() + REBOOT_ANSWER;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let said = err_thread.join().unwrap_or_default();
    let last = last_line(&said);
    match status {
        Some(st) if st.success() => Ok(()),
        Some(st) => Err(match st.code() {
            Some(code) if last.is_empty() => RebootAskError::Exited { code },
            Some(code) => RebootAskError::ExitedSaying {
                code,
                said: last.to_string(),
            },
            None => RebootAskError::Signal {
                said: last.to_string(),
            },
        }),
        None => Err(RebootAskError::NoAnswer),
    }
}

/// Why one connection to a robot ended without an install: the protocol
/// error, what the remote side said on stderr, and ssh's exit code.
struct AttemptFailure {
    error: WireError,
    stderr: String,
    code: Option<i32>,
}

impl AttemptFailure {
    /// Whether the connection broke (ssh exits 255 on its own errors; a
    /// broken pipe or read error on our side), as opposed to the robot
    /// refusing or `deploy` there failing to start: only a broken
    /// connection is worth another attempt.
    fn broken(&self) -> bool {
        self.code == Some(255) || (matches!(self.error, WireError::Io(_)) && self.code.is_some())
    }

    /// The error, with the last line the remote side wrote on stderr
    /// (unless the robot's own refusal already says it).
    fn message(&self) -> String {
        let last = last_line(&self.stderr);
        if last.is_empty() || matches!(self.error, WireError::Remote(_)) {
            self.error.to_string()
        } else {
            format!("{} ({last})", self.error)
        }
    }
}

/// How long to wait before attempt `attempt + 1`.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(200 * u64::from(attempt))
}

/// One connection: ssh to the robot, the update protocol on its stdin and
/// stdout.
fn attempt(
    bundle: &Path,
    robot: &Host,
    opts: &FleetOptions,
    send: &SendOptions,
    on: &mut dyn FnMut(Event),
) -> Result<SendReport, Box<AttemptFailure>> {
    let mut cmd = Command::new(&opts.ssh);
    for o in &opts.ssh_options {
        cmd.arg("-o").arg(o);
    }
    // After the user's options: for ssh the first value given wins.
    cmd.args(["-o", "BatchMode=yes", "-T", "--", &robot.dest]);
    cmd.arg(remote_command(&opts.remote_deploy, robot.prefix.as_deref()));
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| {
        Box::new(AttemptFailure {
            error: WireError::Io(e),
            stderr: format!("cannot run {}", opts.ssh.display()),
            code: None,
        })
    })?;
    let stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let err_thread = std::thread::spawn(move || newest_text(stderr, STDERR_KEPT));
    let mut total = 0u64;
    let result = send_bundle(bundle, stdout, stdin, send, &mut |p| match p {
        Progress::Need { blobs, bytes } => {
            total = bytes;
            on(Event::Need { blobs, bytes });
        }
        Progress::Sent { bytes } => on(Event::Sent { bytes, of: total }),
        Progress::Installing => on(Event::Installing),
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

/// What is kept of the remote side's stderr: its newest 64 KiB (why it
/// failed is at the end), however much it writes.
const STDERR_KEPT: usize = 64 << 10;

/// Reads `r` to its end (so the writer never blocks on a full pipe),
/// keeping only its newest `keep` bytes, as text.
fn newest_text(mut r: impl Read, keep: usize) -> String {
    let mut kept: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                kept.extend_from_slice(&chunk[..n]);
                if kept.len() > keep {
                    let over = kept.len() - keep;
                    kept.drain(..over);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// Updates one robot: connects, and reconnects after a broken connection
/// up to `opts.retries` times.
pub fn update_robot(
    bundle: &Path,
    robot: &Host,
    opts: &FleetOptions,
    on: &mut dyn FnMut(Event),
) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome {
        host: robot.dest.clone(),
        prefix: robot.prefix.clone(),
        ok: false,
        release: None,
        state: None,
        reboot: false,
        rebooted: false,
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
        let send = SendOptions {
            cut_after: if out.attempts == 1 {
                opts.cut_after
            } else {
                None
            },
        };
        on(Event::Connecting {
            attempt: out.attempts,
        });
        match attempt(bundle, robot, opts, &send, on) {
            Ok(rep) => {
                out.ok = true;
                out.bytes_on_wire += rep.bytes_out + rep.bytes_in;
                out.blobs_sent += rep.blobs_sent;
                out.blobs_skipped = rep.blobs_skipped;
                if out.attempts == 1 || out.resumed_bytes == 0 {
                    out.resumed_bytes = rep.resumed_bytes;
                }
                out.release = Some(rep.release.clone());
                out.state = rep
                    .result
                    .get("state")
                    .and_then(|s| s.as_str())
                    .map(str::to_string);
                out.reboot = rep.result.get("reboot") == Some(&serde_json::Value::Bool(true));
                on(Event::Updated {
                    state: out.state.clone(),
                    release: rep.release,
                    reboot: out.reboot,
                });
                if out.reboot && opts.reboot {
                    on(Event::Rebooting);
                    match ask_reboot(robot, opts) {
                        Ok(()) => out.rebooted = true,
                        Err(e) => {
                            out.ok = false;
                            let msg = format!(
                                "installed, but the reboot it needs was refused: {}",
                                units::error::Chain(&e)
                            );
                            on(Event::Failed { error: msg.clone() });
                            out.error = Some(msg);
                        }
                    }
                }
                break;
            }
            Err(failure) => {
                if failure.broken() && out.attempts <= opts.retries {
                    std::thread::sleep(backoff(out.attempts));
                    continue;
                }
                let msg = failure.message();
                on(Event::Failed { error: msg.clone() });
                out.error = Some(msg);
                break;
            }
        }
    }
    out.seconds = start.elapsed().as_secs_f64();
    out
}

/// Updates every robot, `opts.jobs` at a time; `on(i, event)` hears what
/// happens to `robots[i]` (from several threads). The outcomes come back
/// in the order of `robots`.
pub fn update_fleet(
    bundle: &Path,
    robots: &[Host],
    opts: &FleetOptions,
    on: &(dyn Fn(usize, Event) + Sync),
) -> Vec<Outcome> {
    let queue = Mutex::new((0..robots.len()).collect::<VecDeque<_>>());
    let results = Mutex::new(
        (0..robots.len())
            .map(|_| None)
            .collect::<Vec<Option<Outcome>>>(),
    );
    std::thread::scope(|s| {
        for _ in 0..opts.jobs.clamp(1, robots.len().max(1)) {
            s.spawn(|| loop {
                let Some(i) = queue.lock().expect("queue").pop_front() else {
                    break;
                };
                let o = update_robot(bundle, &robots[i], opts, &mut |e| on(i, e));
                results.lock().expect("results")[i] = Some(o);
            });
        }
    });
    results
        .into_inner()
        .expect("results")
        .into_iter()
        .map(|o| o.expect("every robot ran"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_remote_stderr_keeps_its_newest_bytes_only() {
        // 100 MiB of noise, then why it failed: the end is kept, and no
        // more than the bound is held.
        let noise = std::io::repeat(b'x').take(100 << 20);
        let why = &b"\ndeploy: install refused: bad signature\n"[..];
        let s = newest_text(noise.chain(why), STDERR_KEPT);
        assert_eq!(s.len(), STDERR_KEPT);
        assert!(
            s.ends_with("deploy: install refused: bad signature\n"),
            "{}",
            &s[s.len() - 80..]
        );
    }

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

    fn failure(error: WireError, stderr: &str, code: Option<i32>) -> AttemptFailure {
        AttemptFailure {
            error,
            stderr: stderr.into(),
            code,
        }
    }

    #[test]
    fn only_a_broken_connection_is_retried() {
        let io = || WireError::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        // ssh's own errors
        assert!(failure(WireError::Protocol("x".into()), "", Some(255)).broken());
        // a broken pipe while ssh ran
        assert!(failure(io(), "", Some(1)).broken());
        // ssh could not be started at all
        assert!(!failure(io(), "", None).broken());
        // the robot refused
        assert!(!failure(WireError::Remote("no".into()), "", Some(2)).broken());
        assert!(backoff(2) > backoff(1));
    }

    #[test]
    fn a_failure_says_what_the_robot_said_last() {
        let f = failure(
            WireError::Protocol("the robot closed the connection".into()),
            "bash: deploy: command not found\n\n",
            Some(127),
        );
        assert_eq!(
            f.message(),
            "update protocol: the robot closed the connection (bash: deploy: command not found)"
        );
        let f = failure(
            WireError::Remote("bad signature".into()),
            "deploy: x\n",
            Some(2),
        );
        assert_eq!(f.message(), "robot refused: bad signature");
    }
}
