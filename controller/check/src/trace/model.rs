//! The text of an ftrace buffer, parsed (pure: no I/O).
//!
//! The kernel prints one event per line (`kernel/trace/trace_output.c`,
//! with the `irq-info` option and without `record-tgid`):
//!
//! ```text
//!            bash-13027   [000] d..2.  9791.507390: sched_switch: prev_comm=bash ...
//! ```
//!
//! that is the current task's comm and pid, the CPU, the context flags,
//! the timestamp in seconds with microseconds (the instance's clock; the
//! tracer sets `mono`, so it is `CLOCK_MONOTONIC`), the event name and its
//! fields as the event's print format writes them. Every byte comes from
//! outside the process: lines that do not have this shape are counted and
//! skipped, every string is cut to a bound, nothing panics.

/// A comm longer than this is cut (the kernel's is 16 bytes; a marker's
/// text is bounded separately).
const MAX_COMM: usize = 64;
/// A line longer than this is skipped.
pub const MAX_LINE: usize = 4096;
/// A marker's text longer than this is cut.
const MAX_MARKER: usize = 256;

/// One event of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub cpu: u32,
    /// The instance clock's time (CLOCK_MONOTONIC), in nanoseconds; the
    /// text has microseconds, so the last three digits are zero.
    pub ts_ns: u64,
    /// The task current on the CPU (in an interrupt: the interrupted one).
    pub comm: String,
    pub pid: i32,
    pub kind: EventKind,
}

/// The events the analysis understands; the rest are kept by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    Switch {
        prev_comm: String,
        prev_pid: i32,
        prev_prio: i32,
        prev_state: String,
        next_comm: String,
        next_pid: i32,
        next_prio: i32,
    },
    /// `sched_wakeup` and `sched_wakeup_new` (`new`).
    Wakeup {
        comm: String,
        pid: i32,
        prio: i32,
        target_cpu: u32,
        new: bool,
    },
    PiSetprio {
        comm: String,
        pid: i32,
        oldprio: i32,
        newprio: i32,
    },
    IrqEntry {
        irq: u32,
        name: String,
    },
    IrqExit {
        irq: u32,
    },
    SoftirqEntry {
        vec: u32,
        action: String,
    },
    SoftirqExit {
        vec: u32,
    },
    HrtimerEntry {
        function: String,
    },
    HrtimerExit,
    /// `lock:contention_begin`: the current task starts waiting for a
    /// lock (its address, hashed as the kernel prints it, and its kind:
    /// `SPIN`, `RT` (an rt_mutex, which a spinlock is on PREEMPT_RT),
    /// `MUTEX`, `READ`, `WRITE`, `PERCPU`, joined by `|`).
    LockWait {
        lock: String,
        flags: String,
    },
    /// `lock:contention_end`: the current task got the lock (or gave up:
    /// `ret` is not 0).
    LockDone {
        lock: String,
        ret: i32,
    },
    /// A line written to `trace_marker`.
    Marker {
        text: String,
    },
    /// `syscalls:sys_enter_<name>`: the call's arguments as the kernel
    /// prints them (`name: 0xvalue`), in order; at most 6.
    SysEnter {
        name: String,
        args: Vec<(String, u64)>,
    },
    /// `syscalls:sys_exit_<name>`: its return value.
    SysExit {
        name: String,
        ret: i64,
    },
    /// Any other event (io_uring completions, task work, ...): its name
    /// and its text.
    Other {
        name: String,
        text: String,
    },
}

/// The parsed lines and how many were not events.
#[derive(Debug, Clone, Default)]
pub struct Parsed {
    pub events: Vec<Event>,
    /// Lines that were neither comments nor events (cut, corrupt, or of a
    /// format this parser does not know).
    pub skipped: usize,
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Parses every line of `text` (one CPU's buffer or several); events keep
/// the order of the text.
pub fn parse(text: &str) -> Parsed {
    let mut out = Parsed::default();
    for line in text.lines() {
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if line.len() > MAX_LINE {
            out.skipped += 1;
            continue;
        }
        match parse_line(line) {
            Some(e) => out.events.push(e),
            None => out.skipped += 1,
        }
    }
    out
}

/// One event line, or `None` when it does not have the kernel's shape.
pub fn parse_line(line: &str) -> Option<Event> {
    // The CPU column: the first ` [ddd] ` preceded by `-pid`.
    let (head, cpu, rest) = split_cpu(line)?;
    let head = head.trim_end();
    let dash = head.rfind('-')?;
    let pid: i32 = head[dash + 1..].parse().ok()?;
    let comm = head[..dash].trim_start();
    // Flags (irq-info), then `secs.usecs: `.
    let rest = rest.trim_start();
    let (ts_field, after) = rest.split_once(": ")?;
    let ts_text = ts_field.split_whitespace().last()?;
    let ts_ns = parse_ts(ts_text)?;
    // Syscall events have their own shape: `sys_futex(uaddr: 0x.., op:
    // 0x81, ...)` and `sys_futex -> 0x0`.
    if let Some(kind) = parse_syscall(after) {
        return Some(Event {
            cpu,
            ts_ns,
            comm: cut(comm, MAX_COMM),
            pid,
            kind,
        });
    }
    let (name, fields) = match after.split_once(": ") {
        Some((n, f)) => (n, f),
        None => (after.trim_end().strip_suffix(':')?, ""),
    };
    if name.is_empty() || name.contains(' ') || name.contains('(') {
        return None;
    }
    let kind = parse_kind(name, fields)?;
    Some(Event {
        cpu,
        ts_ns,
        comm: cut(comm, MAX_COMM),
        pid,
        kind,
    })
}

/// A number as a syscall event prints it: always hexadecimal, with `0x`
/// (Linux 6.18: `op: 0x81`) or without (6.12 and before print the
/// arguments with `%lx`: `uaddr: ffff809a0000, op: 81`).
fn sys_num(v: &str) -> Option<u64> {
    let v = v.trim();
    let h = v.strip_prefix("0x").unwrap_or(v);
    if h.is_empty() || h.len() > 16 {
        return None;
    }
    u64::from_str_radix(h, 16).ok()
}

/// A syscall enter or exit event's text (after the timestamp), or `None`.
fn parse_syscall(after: &str) -> Option<EventKind> {
    let after = after.trim_end();
    let rest = after.strip_prefix("sys_")?;
    if let Some((name, ret)) = rest.split_once(" -> ") {
        if name.is_empty()
            || name.len() > 32
            || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return None;
        }
        return Some(EventKind::SysExit {
            name: name.to_string(),
            ret: sys_num(ret)? as i64,
        });
    }
    let (name, args) = rest.split_once('(')?;
    if name.is_empty()
        || name.len() > 32
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return None;
    }
    let args = args.strip_suffix(')')?;
    let mut out = Vec::new();
    for a in args.split(", ").filter(|a| !a.is_empty()).take(6) {
        let (k, v) = a.split_once(": ")?;
        out.push((cut(k, 16), sys_num(v)?));
    }
    Some(EventKind::SysEnter {
        name: name.to_string(),
        args: out,
    })
}

/// The timestamp of an event line (ns), without parsing the rest.
pub fn line_ts(line: &str) -> Option<u64> {
    let (_, _, rest) = split_cpu(line)?;
    let (ts_field, _) = rest.split_once(": ")?;
    parse_ts(ts_field.split_whitespace().last()?)
}

fn split_cpu(line: &str) -> Option<(&str, u32, &str)> {
    let mut from = 0;
    while let Some(i) = line[from..].find(" [") {
        let at = from + i;
        let after = &line[at + 2..];
        if let Some(close) = after.find(']') {
            let digits = &after[..close];
            if !digits.is_empty()
                && digits.len() <= 6
                && digits.bytes().all(|b| b.is_ascii_digit())
                && line[..at].trim_end().rsplit('-').next().is_some_and(|p| {
                    !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit() || b == b'-')
                })
            {
                let cpu = digits.parse().ok()?;
                return Some((&line[..at], cpu, &after[close + 1..]));
            }
        }
        from = at + 2;
    }
    None
}

/// `9791.507390` (seconds, microseconds) in nanoseconds.
fn parse_ts(s: &str) -> Option<u64> {
    let (secs, frac) = s.split_once('.')?;
    if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = secs.parse().ok()?;
    let mut f: u64 = frac.parse().ok()?;
    for _ in frac.len()..9 {
        f *= 10;
    }
    secs.checked_mul(1_000_000_000)?.checked_add(f)
}

/// The value of `key=` in `fields`, up to the next space (or, for a comm,
/// up to ` <until>=`).
fn field<'a>(fields: &'a str, key: &str) -> Option<&'a str> {
    let mut from = 0;
    let pat = format!("{key}=");
    loop {
        let i = fields[from..].find(&pat)? + from;
        if i == 0 || fields.as_bytes()[i - 1] == b' ' || fields.as_bytes()[i - 1] == b'[' {
            let v = &fields[i + pat.len()..];
            return Some(v.split([' ', ']']).next().unwrap_or(""));
        }
        from = i + pat.len();
    }
}

/// A comm: the text after `key=` up to ` <next>=`.
fn comm_field(fields: &str, key: &str, next: &str) -> Option<String> {
    let pat = format!("{key}=");
    let start = if fields.starts_with(&pat) {
        pat.len()
    } else {
        fields.find(&format!(" {pat}"))? + 1 + pat.len()
    };
    let rest = &fields[start..];
    let end = rest.find(&format!(" {next}="))?;
    Some(cut(&rest[..end], MAX_COMM))
}

fn num<T: std::str::FromStr>(fields: &str, key: &str) -> Option<T> {
    field(fields, key)?.parse().ok()
}

fn parse_kind(name: &str, f: &str) -> Option<EventKind> {
    Some(match name {
        "sched_switch" => {
            let (prev, next) = f.split_once(" ==> ")?;
            EventKind::Switch {
                prev_comm: comm_field(prev, "prev_comm", "prev_pid")?,
                prev_pid: num(prev, "prev_pid")?,
                prev_prio: num(prev, "prev_prio")?,
                prev_state: cut(field(prev, "prev_state")?, 8),
                next_comm: comm_field(next, "next_comm", "next_pid")?,
                next_pid: num(next, "next_pid")?,
                next_prio: num(next, "next_prio")?,
            }
        }
        "sched_wakeup" | "sched_wakeup_new" => EventKind::Wakeup {
            comm: comm_field(f, "comm", "pid")?,
            pid: num(f, "pid")?,
            prio: num(f, "prio")?,
            target_cpu: num(f, "target_cpu")?,
            new: name == "sched_wakeup_new",
        },
        "sched_pi_setprio" => EventKind::PiSetprio {
            comm: comm_field(f, "comm", "pid")?,
            pid: num(f, "pid")?,
            oldprio: num(f, "oldprio")?,
            newprio: num(f, "newprio")?,
        },
        "irq_handler_entry" => EventKind::IrqEntry {
            irq: num(f, "irq")?,
            name: cut(f.split_once("name=").map_or("", |x| x.1), MAX_COMM),
        },
        "irq_handler_exit" => EventKind::IrqExit {
            irq: num(f, "irq")?,
        },
        "softirq_entry" => EventKind::SoftirqEntry {
            vec: num(f, "vec")?,
            action: cut(field(f, "action").unwrap_or("?"), MAX_COMM),
        },
        "softirq_exit" => EventKind::SoftirqExit {
            vec: num(f, "vec")?,
        },
        "hrtimer_expire_entry" => EventKind::HrtimerEntry {
            function: cut(field(f, "function").unwrap_or("?"), MAX_COMM),
        },
        "hrtimer_expire_exit" => EventKind::HrtimerExit,
        // `%p (flags=%s)` and `%p (ret=%d)`.
        "contention_begin" => {
            let (lock, rest) = f.trim().split_once(' ')?;
            EventKind::LockWait {
                lock: cut(lock, 32),
                flags: cut(
                    rest.strip_prefix("(flags=")?
                        .trim_end()
                        .trim_end_matches(')'),
                    MAX_COMM,
                ),
            }
        }
        "contention_end" => {
            let (lock, rest) = f.trim().split_once(' ')?;
            EventKind::LockDone {
                lock: cut(lock, 32),
                ret: rest
                    .strip_prefix("(ret=")?
                    .trim_end()
                    .trim_end_matches(')')
                    .parse()
                    .ok()?,
            }
        }
        "tracing_mark_write" => EventKind::Marker {
            text: cut(f.trim_end(), MAX_MARKER),
        },
        _ => EventKind::Other {
            name: cut(name, MAX_COMM),
            text: cut(f.trim_end(), MAX_MARKER),
        },
    })
}

/// The kernel's `prio` of a trace event as a scheduling class and
/// priority, as `chrt` would show it: below 0 deadline, below 100
/// real-time (`99 - prio`), else normal (`nice = prio - 120`). `policy`
/// names the real-time policy when it is known (`FIFO`, `RR`).
pub fn prio_label(prio: i32, policy: Option<&str>) -> String {
    if prio < 0 {
        "DEADLINE".to_string()
    } else if prio < 100 {
        format!("{} {}", policy.unwrap_or("RT"), 99 - prio)
    } else {
        format!("nice {}", prio - 120)
    }
}

/// A marker line of the runtime: `rtdeploy <what> key=value...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub what: MarkKind,
    pub seq: u64,
    /// The CLOCK_MONOTONIC time written in the marker (ns), when present.
    pub t_ns: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKind {
    Send,
    Handler,
}

impl Mark {
    /// The runtime's marker in `text`, if it is one.
    pub fn parse(text: &str) -> Option<Mark> {
        let rest = text.strip_prefix("rtdeploy ")?;
        let (what, f) = rest.split_once(' ').unwrap_or((rest, ""));
        let what = match what {
            "send" => MarkKind::Send,
            "handler" => MarkKind::Handler,
            _ => return None,
        };
        Some(Mark {
            what,
            seq: num(f, "seq")?,
            t_ns: num(f, "t"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as kernel 6.18 prints them (captured from an instance with
    // the mono clock), with the field layouts of the events' formats.
    const SWITCH: &str = "            bash-13027   [000] d..2.  9791.507390: sched_switch: prev_comm=bash prev_pid=13027 prev_prio=120 prev_state=S ==> next_comm=bash next_pid=13032 next_prio=120";

    #[test]
    fn a_sched_switch_line() {
        let e = parse_line(SWITCH).unwrap();
        assert_eq!(e.cpu, 0);
        assert_eq!(e.ts_ns, 9_791_507_390_000);
        assert_eq!(e.comm, "bash");
        assert_eq!(e.pid, 13027);
        assert_eq!(
            e.kind,
            EventKind::Switch {
                prev_comm: "bash".into(),
                prev_pid: 13027,
                prev_prio: 120,
                prev_state: "S".into(),
                next_comm: "bash".into(),
                next_pid: 13032,
                next_prio: 120,
            }
        );
    }

    #[test]
    fn comms_with_spaces_and_dashes() {
        let l = " Web Content-x-4242  [003] d..2.   100.000001: sched_switch: prev_comm=Web Content-x prev_pid=4242 prev_prio=120 prev_state=R+ ==> next_comm=irq/130-eqos next_pid=512 next_prio=49";
        let e = parse_line(l).unwrap();
        assert_eq!(e.comm, "Web Content-x");
        assert_eq!(e.pid, 4242);
        assert_eq!(e.cpu, 3);
        match e.kind {
            EventKind::Switch {
                prev_comm,
                prev_state,
                next_comm,
                next_prio,
                ..
            } => {
                assert_eq!(prev_comm, "Web Content-x");
                assert_eq!(prev_state, "R+");
                assert_eq!(next_comm, "irq/130-eqos");
                assert_eq!(next_prio, 49);
            }
            k => panic!("{k:?}"),
        }
    }

    #[test]
    fn the_other_events() {
        let lines = [
            "          <idle>-0       [000] dNH2.  9791.512080: sched_wakeup: comm=rcu_preempt pid=15 prio=120 target_cpu=000",
            "            bash-13027   [000] d..2.  9791.507259: sched_wakeup_new: comm=bash pid=13032 prio=120 target_cpu=001",
            "       rt-recv-900     [001] d..2.   50.000010: sched_pi_setprio: comm=low pid=901 oldprio=120 newprio=19",
            "          <idle>-0       [000] d.h1.  9791.655726: irq_handler_entry: irq=42 name=virtio3-tx",
            "          <idle>-0       [000] dNh1.  9791.655748: irq_handler_exit: irq=42 ret=handled",
            "           sleep-13032   [000] ..s..  9791.508043: softirq_entry: vec=9 [action=RCU]",
            "           sleep-13032   [000] ..s..  9791.508062: softirq_exit: vec=9 [action=RCU]",
            "           sleep-13032   [000] d.h..  9791.508029: hrtimer_expire_entry: hrtimer=0000000081332b12 function=tick_nohz_handler now=9791508018568",
            "           sleep-13032   [000] d.h..  9791.508037: hrtimer_expire_exit: hrtimer=0000000081332b12",
            "            bash-13027   [000] ...1.  9791.506875: tracing_mark_write: rtdeploy send seq=7 t=9791506874123",
            "         rt-recv-900     [001] ...1.    50.000020: io_uring_complete: ring 000000003f9b2b8c, req 00000000a6d9b0b2, user_data 0x1, result -11, cflags 0x0 extra1 0 extra2 0 ",
        ];
        let kinds: Vec<EventKind> = lines.iter().map(|l| parse_line(l).unwrap().kind).collect();
        assert_eq!(
            kinds[0],
            EventKind::Wakeup {
                comm: "rcu_preempt".into(),
                pid: 15,
                prio: 120,
                target_cpu: 0,
                new: false
            }
        );
        assert!(matches!(
            kinds[1],
            EventKind::Wakeup {
                new: true,
                target_cpu: 1,
                ..
            }
        ));
        assert_eq!(
            kinds[2],
            EventKind::PiSetprio {
                comm: "low".into(),
                pid: 901,
                oldprio: 120,
                newprio: 19
            }
        );
        assert_eq!(
            kinds[3],
            EventKind::IrqEntry {
                irq: 42,
                name: "virtio3-tx".into()
            }
        );
        assert_eq!(kinds[4], EventKind::IrqExit { irq: 42 });
        assert_eq!(
            kinds[5],
            EventKind::SoftirqEntry {
                vec: 9,
                action: "RCU".into()
            }
        );
        assert_eq!(kinds[6], EventKind::SoftirqExit { vec: 9 });
        assert_eq!(
            kinds[7],
            EventKind::HrtimerEntry {
                function: "tick_nohz_handler".into()
            }
        );
        assert_eq!(kinds[8], EventKind::HrtimerExit);
        match &kinds[9] {
            EventKind::Marker { text } => assert_eq!(
                Mark::parse(text),
                Some(Mark {
                    what: MarkKind::Send,
                    seq: 7,
                    t_ns: Some(9_791_506_874_123)
                })
            ),
            k => panic!("{k:?}"),
        }
        assert!(matches!(&kinds[10], EventKind::Other { name, .. } if name == "io_uring_complete"));
    }

    #[test]
    fn syscall_lines() {
        let text = "\
           rtd-rt-send-6020    [001] .....  4849.824352: sys_futex(uaddr: 0x7f7ba5e02a4c, op: 0x81, val: 0x7fffffff, utime: 0, uaddr2: 3, val3: 0)
           rtd-rt-send-6020    [001] .....  4849.824492: sys_futex -> 0x1
           rtd-low-91    [000] .....  4849.842454: sys_futex_waitv -> 0xffffffffffffff92
           rtd-low-91    [000] .....  4849.842455: sys_futex(uaddr: 0xzz, op: 0x81)
";
        let p = parse(text);
        assert_eq!(p.skipped, 1, "{p:?}");
        assert_eq!(
            p.events[0].kind,
            EventKind::SysEnter {
                name: "futex".into(),
                args: vec![
                    ("uaddr".into(), 0x7f7ba5e02a4c),
                    ("op".into(), 0x81),
                    ("val".into(), 0x7fffffff),
                    ("utime".into(), 0),
                    ("uaddr2".into(), 3),
                    ("val3".into(), 0)
                ]
            }
        );
        assert_eq!(
            (p.events[0].comm.as_str(), p.events[0].pid),
            ("rtd-rt-send", 6020)
        );
        assert_eq!(
            p.events[1].kind,
            EventKind::SysExit {
                name: "futex".into(),
                ret: 1
            }
        );
        assert_eq!(
            p.events[2].kind,
            EventKind::SysExit {
                name: "futex_waitv".into(),
                ret: -110
            }
        );
    }

    #[test]
    fn syscall_lines_of_kernels_that_print_hex_without_0x() {
        // As Debian's 6.12 PREEMPT_RT arm64 kernel prints them (`%lx`):
        // every argument is hexadecimal, `op: 81` is 0x81.
        let text = "\
          talker-370     [002] ...1.    64.338117: sys_futex(uaddr: ffff809a0000, op: 81, val: 7fffffff, utime: 0, uaddr2: 0, val3: 0)
        listener-371     [003] ...1.    64.339034: sys_futex(uaddr: ffffaa923000, op: 9, val: 9d33, utime: ffffd778ea70, uaddr2: 0, val3: ffffffff)
        listener-371     [003] ...1.    64.339090: sys_futex -> 0xffffffffffffff92
";
        let p = parse(text);
        assert_eq!(p.skipped, 0, "{p:?}");
        assert_eq!(
            p.events[0].kind,
            EventKind::SysEnter {
                name: "futex".into(),
                args: vec![
                    ("uaddr".into(), 0xffff809a0000),
                    ("op".into(), 0x81),
                    ("val".into(), 0x7fffffff),
                    ("utime".into(), 0),
                    ("uaddr2".into(), 0),
                    ("val3".into(), 0)
                ]
            }
        );
        match &p.events[1].kind {
            EventKind::SysEnter { args, .. } => {
                assert_eq!(args[2], ("val".into(), 0x9d33));
                assert_eq!(args[5], ("val3".into(), 0xffffffff));
            }
            k => panic!("{k:?}"),
        }
        assert_eq!(
            p.events[2].kind,
            EventKind::SysExit {
                name: "futex".into(),
                ret: -110
            }
        );
    }

    #[test]
    fn lock_contention_lines() {
        // As 6.18 prints them (`%p (flags=%s)`, `%p (ret=%d)`).
        let p = parse(
            "\
         rt-send-900     [002] d..1.  100.000003: contention_begin: 00000000a1b2c3d4 (flags=SPIN|RT)
         rt-send-900     [002] d..1.  100.000043: contention_end: 00000000a1b2c3d4 (ret=-4)
         rt-send-900     [002] d..1.  100.000044: contention_begin: 00000000a1b2c3d4 flags=RT
         rt-send-900     [002] d..1.  100.000045: contention_end: 00000000a1b2c3d4 (ret=x)
",
        );
        assert_eq!(p.skipped, 2);
        assert_eq!(
            p.events[0].kind,
            EventKind::LockWait {
                lock: "00000000a1b2c3d4".into(),
                flags: "SPIN|RT".into()
            }
        );
        assert_eq!(
            p.events[1].kind,
            EventKind::LockDone {
                lock: "00000000a1b2c3d4".into(),
                ret: -4
            }
        );
    }

    #[test]
    fn corrupt_lines_are_counted_not_fatal() {
        let text = format!(
            "# tracer: nop\n#\n{SWITCH}\ngarbage\n   x-1 [zz] ...: nothing\n  a-1 [000] .... 99999999999999999999.000000: sched_switch: x\n{}\n\u{0}\u{1}\u{2} [1] \n{}\n",
            "y".repeat(MAX_LINE + 1),
            &SWITCH[..60]
        );
        let p = parse(&text);
        assert_eq!(p.events.len(), 1);
        assert_eq!(p.skipped, 6);
    }

    #[test]
    fn priorities_as_chrt_shows_them() {
        assert_eq!(prio_label(49, Some("FIFO")), "FIFO 50");
        assert_eq!(prio_label(19, None), "RT 80");
        assert_eq!(prio_label(120, None), "nice 0");
        assert_eq!(prio_label(-1, None), "DEADLINE");
    }
}
