//! The runtime's part in the supervisor's miss tracing (robot.yaml
//! `check.trace_on_miss` with a process's `budgets.wakeup`).
//!
//! The supervisor keeps an ftrace instance of its own recording on the
//! isolated CPUs and tells each real-time process where it is
//! ([`units::env::TRACE`]) and the process's wakeup budget
//! ([`units::env::TRACE_MISS_NS`]).
//! The process then writes markers to the instance's `trace_marker`:
//! `rtdeploy send seq=N t=NS` at each publish, `rtdeploy handler seq=N
//! t=NS` at each handler start, and on a handler that starts over its
//! budget `rtdeploy miss kind=message|timer seq=N sender=PID send=NS
//! handler=NS budget=NS` followed by turning the instance off (as
//! cyclictest's `-b` does), so the window stays in the buffers until the
//! supervisor has copied and analysed it and turned tracing on again.
//!
//! Each marker is one `write` system call (a few microseconds): the price
//! of knowing why, paid only when the robot asks for it. Without the
//! variables nothing is opened and each would-be marker costs one load.
//! Files are opened once, by [`init`], before the loop runs.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;

use units::env::{ProcessEnv, TRACE, TRACE_MISS_NS};

struct MissTrace {
    marker: File,
    on: File,
    miss_ns: u64,
}

static STATE: OnceLock<Option<MissTrace>> = OnceLock::new();

/// Opens the instance's files when the process's environment names one;
/// the first call decides for the life of the process. Returns what went
/// wrong (the process then runs untraced), `None` when all is well or
/// nothing was asked.
pub fn init(env: &ProcessEnv) -> Option<String> {
    let mut problem = None;
    STATE.get_or_init(|| {
        let dir = env.trace.as_ref()?;
        let miss_ns = match env.trace_miss_ns {
            Some(n) if n > 0 => n,
            _ => {
                problem = Some(format!(
                    "{TRACE} is set without a positive {TRACE_MISS_NS}: running untraced"
                ));
                return None;
            }
        };
        match open(dir, miss_ns) {
            Ok(t) => Some(t),
            Err(e) => {
                problem = Some(format!(
                    "the supervisor's trace {}: {e}: running untraced",
                    dir.display()
                ));
                None
            }
        }
    });
    problem
}

fn open(dir: &Path, miss_ns: u64) -> std::io::Result<MissTrace> {
    let w = |name: &str| OpenOptions::new().write(true).open(dir.join(name));
    Ok(MissTrace {
        marker: w("trace_marker")?,
        on: w("tracing_on")?,
        miss_ns,
    })
}

fn get() -> Option<&'static MissTrace> {
    STATE.get().and_then(|t| t.as_ref())
}

/// Writes one marker from `args` to `trace_marker` (open in `f`) in one
/// `write`, with no allocation; a marker longer than 192 bytes is not
/// written.
pub fn write_marker(f: &File, args: std::fmt::Arguments) {
    let mut buf = [0u8; 192];
    let mut c = std::io::Cursor::new(&mut buf[..]);
    if c.write_fmt(args).is_ok() {
        let n = c.position() as usize;
        let _ = (&*f).write(&buf[..n]);
    }
}

fn mark(t: &MissTrace, args: std::fmt::Arguments) {
    write_marker(&t.marker, args);
}

/// A message was published (its index in the channel).
#[inline]
pub fn sent(seq: u64, t_ns: u64) {
    if let Some(t) = get() {
        mark(t, format_args!("rtdeploy send seq={seq} t={t_ns}"));
    }
}

/// What a handler handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// A message: its index and its publisher's pid.
    Message { seq: u64, sender_pid: u32 },
    /// A timer's wake: its number.
    Timer { seq: u64 },
}

/// A handler starts at `now_ns` for an event of `event_ns` (the send
/// time or the deadline): the handler marker, and on a miss the miss
/// marker and the instance turned off.
#[inline]
pub fn handled(what: Handled, event_ns: u64, now_ns: u64) {
    if let Some(t) = get() {
        handled_on(t, what, event_ns, now_ns);
    }
}

fn handled_on(t: &MissTrace, what: Handled, event_ns: u64, now_ns: u64) {
    let (kind, seq, sender) = match what {
        Handled::Message { seq, sender_pid } => ("message", seq, sender_pid),
        Handled::Timer { seq } => ("timer", seq, std::process::id()),
    };
    mark(t, format_args!("rtdeploy handler seq={seq} t={now_ns}"));
    if now_ns.saturating_sub(event_ns) > t.miss_ns {
        mark(
            t,
            format_args!(
                "rtdeploy miss kind={kind} seq={seq} sender={sender} send={event_ns} handler={now_ns} budget={}",
                t.miss_ns
            ),
        );
        let _ = (&t.on).write(b"0");
    }
}

/// A miss as its marker says: `rtdeploy miss kind=... seq=... ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissMarker {
    pub timer: bool,
    pub seq: u64,
    pub sender_pid: u32,
    pub send_ns: u64,
    pub handler_ns: u64,
    pub budget_ns: u64,
}

impl MissMarker {
    /// Parses a marker's text; `None` when it is not a whole miss marker
    /// (the text comes from the trace: any process may write markers).
    pub fn parse(text: &str) -> Option<MissMarker> {
        let rest = text.trim().strip_prefix("rtdeploy miss ")?;
        let mut m = MissMarker {
            timer: false,
            seq: 0,
            sender_pid: 0,
            send_ns: 0,
            handler_ns: 0,
            budget_ns: 0,
        };
        let mut seen = 0u8;
        for field in rest.split_whitespace().take(8) {
            let (k, v) = field.split_once('=')?;
            let num = || v.parse::<u64>().ok();
            match k {
                "kind" => {
                    m.timer = match v {
                        "timer" => true,
                        "message" => false,
                        _ => return None,
                    };
                    seen |= 1;
                }
                "seq" => (m.seq, seen) = (num()?, seen | 2),
                "sender" => (m.sender_pid, seen) = (v.parse().ok()?, seen | 4),
                "send" => (m.send_ns, seen) = (num()?, seen | 8),
                "handler" => (m.handler_ns, seen) = (num()?, seen | 16),
                "budget" => (m.budget_ns, seen) = (num()?, seen | 32),
                _ => {}
            }
        }
        (seen == 63 && m.handler_ns >= m.send_ns).then_some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn miss_markers_parse_and_garbage_does_not() {
        let m = MissMarker::parse(
            "rtdeploy miss kind=message seq=41 sender=900 send=100 handler=600 budget=200",
        )
        .unwrap();
        assert_eq!(
            m,
            MissMarker {
                timer: false,
                seq: 41,
                sender_pid: 900,
                send_ns: 100,
                handler_ns: 600,
                budget_ns: 200
            }
        );
        assert!(
            MissMarker::parse("rtdeploy miss kind=timer seq=1 sender=5 send=1 handler=2 budget=1")
                .unwrap()
                .timer
        );
        for bad in [
            "",
            "rtdeploy miss",
            "rtdeploy miss kind=other seq=1 sender=5 send=1 handler=2 budget=1",
            "rtdeploy miss kind=timer seq=x sender=5 send=1 handler=2 budget=1",
            "rtdeploy miss kind=timer sender=5 send=1 handler=2 budget=1",
            "rtdeploy miss kind=timer seq=1 sender=5 send=9 handler=2 budget=1",
            "rtdeploy miss kind=timer seq=1 sender=-5 send=1 handler=2 budget=1",
            "rtdeploy handler seq=1 t=5",
        ] {
            assert_eq!(MissMarker::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_miss_writes_its_marker_and_turns_the_instance_off() {
        // Plain files stand in for the instance's (the process-wide one
        // is set from the environment once, and tests share a process).
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("trace_marker"), "").unwrap();
        std::fs::write(dir.path().join("tracing_on"), "1").unwrap();
        let t = open(dir.path(), 1_000).unwrap();
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
        // In time: the handler marker only, tracing stays on.
        handled_on(
            &t,
            Handled::Message {
                seq: 7,
                sender_pid: 42,
            },
            10_000,
            11_000,
        );
        assert_eq!(read("trace_marker"), "rtdeploy handler seq=7 t=11000");
        assert_eq!(read("tracing_on"), "1");
        // Late: the miss marker, which parses back, and tracing off.
        handled_on(
            &t,
            Handled::Message {
                seq: 8,
                sender_pid: 42,
            },
            20_000,
            21_001,
        );
        let text = read("trace_marker");
        let miss = &text[text.find("rtdeploy miss").unwrap()..];
        assert_eq!(
            MissMarker::parse(miss),
            Some(MissMarker {
                timer: false,
                seq: 8,
                sender_pid: 42,
                send_ns: 20_000,
                handler_ns: 21_001,
                budget_ns: 1_000
            })
        );
        assert_eq!(read("tracing_on"), "0");
        // Nothing asked: no marker anywhere, one load.
        assert!(get().is_none());
        handled(Handled::Timer { seq: 3 }, 0, 5_000_000);
        assert_eq!(read("trace_marker"), text);
    }
}
