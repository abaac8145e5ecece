//! Malformed and inconsistent robot descriptions, each run through the real
//! `deploy config check`: exit 2, the line of the offending field, the field
//! path and what is wrong, and never a panic.
//!
//! Each case is a whole file; the line marked `#!` is where the error must
//! be reported.
//!
//! Hostile files (alias bombs, huge numbers, endless or huge input) are run
//! in a child whose peak memory is read with wait4 and which a watchdog
//! kills if it does not end: each must be refused at its place, within
//! bounds.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

const BASE: &str = "\
robot:
  name: t
board:
  model: generic
  cpus: 4
cpus:
  housekeeping: 0-1
  isolated: 2-3
channels:
  - name: /a
    max_size: 64
    rate: 1000
processes:
  - name: p
    exec: bin/p
    policy: fifo
    priority: 50
    memlock: 64MiB
    publishes: [/a]
";

struct Case {
    name: &'static str,
    yaml: String,
    /// The field path the message must name ("" when the error is about
    /// the file, not a field).
    field: &'static str,
    /// A piece of the message saying what is wrong or what is accepted.
    says: &'static str,
}

/// BASE with `old` replaced by `new` (which carries the `#!` marker).
fn edit(old: &str, new: &str) -> String {
    assert!(BASE.contains(old), "BASE has no `{old}`");
    BASE.replacen(old, new, 1)
}

/// `yaml` on a Jetson Orin Nano (6 CPUs) instead of the generic board.
fn jetson(yaml: &str) -> String {
    let generic = "  model: generic\n  cpus: 4\n";
    assert!(yaml.contains(generic));
    yaml.replacen(generic, "  model: jetson-orin-nano\n", 1)
}

/// BASE with `extra` appended (which carries the `#!` marker).
fn add(extra: &str) -> String {
    format!("{BASE}{extra}")
}

fn cases() -> Vec<Case> {
    let c = |name, yaml: String, field, says| Case {
        name,
        yaml,
        field,
        says,
    };
    vec![
        c("yaml syntax", edit("  name: t\n", "  name: t: u  #!\n"), "", "not valid YAML"),
        c("unknown section", add("robto: {}  #!\n"), "robto", "unknown section `robto`"),
        c("missing section", BASE.replacen("robot:\n  name: t\nboard:\n", "board:  #!\n", 1), "robot", "missing section `robot`"),
        c("unknown field", edit("  name: t\n", "  name: t\n  nmae: x  #!\n"), "robot.nmae", "unknown field `nmae`"),
        c("robot name", edit("  name: t\n", "  name: My Robot  #!\n"), "robot.name", "not a valid robot name"),
        c("unknown board", edit("  model: generic\n", "  model: jetson-orin  #!\n"), "board.model", "expected one of: jetson-orin-nano"),
        c("generic without cpus", edit("  model: generic\n  cpus: 4\n", "  model: generic  #!\n"), "board.model", "needs `cpus:`"),
        c("fixed board with cpus", edit("  model: generic\n  cpus: 4\n", "  model: jetson-orin-nano\n  cpus: 4  #!\n"), "board.cpus", "has 6 CPUs"),
        c("cpu0 isolated", edit("  housekeeping: 0-1\n  isolated: 2-3\n", "  housekeeping: 1\n  isolated: 0,2-3  #!\n"), "cpus.isolated", "CPU 0 cannot be isolated"),
        c("overlap", edit("  housekeeping: 0-1\n", "  housekeeping: 0-2  #!\n"), "cpus.housekeeping", "both housekeeping and isolated"),
        c("beyond board", edit("  isolated: 2-3\n", "  isolated: 2-7  #!\n"), "cpus.isolated", "do not exist on board"),
        c("bad cpu list", edit("  isolated: 2-3\n", "  isolated: 2-x  #!\n"), "cpus.isolated", "not a CPU number"),
        c("backwards range", edit("  isolated: 2-3\n", "  isolated: 3-2  #!\n"), "cpus.isolated", "runs backwards"),
        c("nothing isolated", edit("  isolated: 2-3\n", "  isolated: \"\"  #!\n"), "cpus.isolated", "no CPU is isolated"),
        c("housekeeping without cpu0", edit("  housekeeping: 0-1\n", "  housekeeping: 1  #!\n"), "cpus.housekeeping", "CPU 0 must be a housekeeping CPU"),
        c("planned kernel key", add("kernel:\n  cmdline: [isolcpus=3]  #!\n"), "kernel.cmdline[0]", "planned from `cpus:`"),
        c("kernel token with space", add("kernel:\n  cmdline: [\"quiet splash\"]  #!\n"), "kernel.cmdline[0]", "not one command line token"),
        c("irq thread priority 0", add("irqs:\n  threads:\n    - match: \"irq/*\"\n      policy: fifo\n      priority: 0  #!\n"), "irqs.threads[0].priority", "expected 1 to 99"),
        c("irq thread policy", add("irqs:\n  threads:\n    - match: \"irq/*\"\n      policy: fifa  #!\n      priority: 50\n"), "irqs.threads[0].policy", "unknown variant `fifa`"),
        c("irq thread without match or interface", add("irqs:\n  threads:\n    - policy: fifo  #!\n      priority: 50\n"), "irqs.threads[0]", "give `match` (a glob on the thread name), `interface`"),
        c("kernel thread by interface", add("irqs:\n  kthreads:\n    - match: \"napi/*\"\n      interface: eth0  #!\n      policy: fifo\n      priority: 50\n"), "irqs.kthreads[0].interface", "only IRQ threads have an interface"),
        c("unclosed interface glob", add("irqs:\n  threads:\n    - interface: \"eth[0\"  #!\n      policy: fifo\n      priority: 50\n"), "irqs.threads[0].interface", "unclosed `[`"),
        c("override with name and interface", add("irqs:\n  overrides:\n    - name: eth0  #!\n      interface: eth0\n      cpus: 0\n"), "irqs.overrides[0]", "exactly one of `irq` (a number), `name` (a glob on the action) and `interface`"),
        c("override with irq and name", add("irqs:\n  overrides:\n    - irq: 5  #!\n      name: eth0\n      cpus: 0\n"), "irqs.overrides[0]", "exactly one of `irq`"),
        c("unclosed glob", add("irqs:\n  overrides:\n    - name: \"eth[0\"  #!\n      cpus: 0\n"), "irqs.overrides[0].name", "unclosed `[`"),
        c("feeds unknown process", add("irqs:\n  threads:\n    - match: \"irq/*\"\n      policy: fifo\n      priority: 50\n      feeds: [ghost]  #!\n"), "irqs.threads[0].feeds[0]", "no process `ghost`"),
        c("override beyond board", add("irqs:\n  overrides:\n    - irq: 9\n      cpus: 0-8  #!\n"), "irqs.overrides[0].cpus", "do not exist"),
        c("sysctl name", add("sysctl:\n  kernel..x: 1  #!\n"), "sysctl.kernel..x", "not a sysctl name"),
        c("governor", add("power:\n  governor: turbo  #!\n"), "power.governor", "unknown governor `turbo`"),
        c("dma latency", add("power:\n  cpu_dma_latency: fast  #!\n"), "power.cpu_dma_latency", "whole microseconds"),
        // Jetson power modes (nvpmodel): known for the board, and keeping online the CPUs in use.
        c("nvpmodel on a board without modes", add("power:\n  nvpmodel: 15W  #!\n"), "power.nvpmodel", "board `generic` has no nvpmodel power modes"),
        c("unknown nvpmodel mode", jetson(&add("power:\n  nvpmodel: 20W  #!\n  nvpmodel_conf: p3767_0003\n")), "power.nvpmodel", "unknown nvpmodel mode `20W` for board `jetson-orin-nano` (expected one of: 0 15W, 1 7W in nvpmodel_p3767_0003.conf)"),
        c("nvpmodel file of another module", jetson(&add("power:\n  nvpmodel: 15W\n  nvpmodel_conf: p3767_0000  #!\n")), "power.nvpmodel_conf", "`p3767_0000` is not an nvpmodel configuration of board `jetson-orin-nano` (expected one of: p3767_0003_super, p3767_0003, p3767_0004_super, p3767_0004)"),
        c("nvpmodel mode that differs between files", jetson(&add("power:\n  nvpmodel: 15W  #!\n")), "power.nvpmodel", "set `power.nvpmodel_conf` to the module's: p3767_0003_super (L4T R36), p3767_0003 (L4T R35)"),
        c("nvpmodel mode switches isolated CPUs off", jetson(&edit("  housekeeping: 0-1\n  isolated: 2-3\n", "  housekeeping: 0-3\n  isolated: 4-5\n")) + "power:\n  nvpmodel: 7W  #!\n  nvpmodel_conf: p3767_0003\n", "power.nvpmodel", "nvpmodel mode `7W` (id 1) of nvpmodel_p3767_0003.conf, L4T R35 keeps only CPUs 0-3 online; the plan uses CPUs 4-5 (cpus.isolated 4-5, processes[0] `p` 4-5): CPUs 4-5 would be offline (choose a mode that keeps them online: 0 15W)"),
        c("default NX mode and the second cluster", edit("  model: generic\n  cpus: 4\ncpus:\n  housekeeping: 0-1\n  isolated: 2-3\n", "  model: jetson-orin-nx-16\ncpus:\n  housekeeping: 0-3\n  isolated: 4-7\n") + "power:\n  nvpmodel: 2  #!\n  nvpmodel_conf: nvpmodel_p3767_0000.conf\n", "power.nvpmodel", "`15W` (id 2) of nvpmodel_p3767_0000.conf, L4T R35 keeps only CPUs 0-3 online; the plan uses CPUs 4-7"),
        c("nvpmodel file without a mode", add("power:\n  nvpmodel_conf: p3767_0003  #!\n"), "power.nvpmodel_conf", "`power.nvpmodel` names no mode"),
        c("negative nvpmodel mode", add("power:\n  nvpmodel: -2  #!\n"), "power.nvpmodel", "mode id -2 is negative"),
        c("channel name", edit("  - name: /a\n", "  - name: a  #!\n"), "channels[0].name", "not a channel name"),
        // Paths under the prefix cannot climb out of it.
        c("metrics textfile out of the prefix", add("metrics:\n  textfile: /../../tmp/x.prom  #!\n"), "metrics.textfile", "`/../../tmp/x.prom` has a `..` component, which would lead out of the prefix"),
        c("log buffer smaller than a message", edit("    max_size: 64\n    rate: 1000\n", "    max_size: 2MiB\n    rate: 1000\n    depth: 2\n") + "log:\n  buffer: 1MiB  #!\n", "log.buffer", "cannot hold one message of /a"),
        c("log dir out of the prefix", add("log:\n  dir: /var/../../tmp/x  #!\n"), "log.dir", "`/var/../../tmp/x` has a `..` component, which would lead out of the prefix"),
        c("duplicate channel", edit("    rate: 1000\n", "    rate: 1000\n  - name: /a  #!\n    max_size: 8\n    rate: 10\n"), "channels[1].name", "already defined"),
        c("rate zero", edit("    rate: 1000\n", "    rate: 0  #!\n"), "channels[0].rate", "rate 0"),
        c("negative rate", edit("    rate: 1000\n", "    rate: -5  #!\n"), "channels[0].rate", "-5"),
        c("message too big", edit("    max_size: 64\n", "    max_size: 65MiB  #!\n"), "channels[0].max_size", "out of range"),
        c("retention without unit", edit("    rate: 1000\n", "    rate: 1000\n    retention: 100  #!\n"), "channels[0].retention", "no unit"),
        c("queue too long", edit("    rate: 1000\n", "    rate: 4000000\n    retention: 10s  #!\n"), "channels[0].retention", "slots"),
        c("depth and retention", edit("    rate: 1000\n", "    rate: 1000\n    retention: 10ms\n    depth: 2  #!\n"), "channels[0].depth", "give one"),
        c("channels beyond memlock", edit("    max_size: 64\n    rate: 1000\n", "    max_size: 32MiB\n    rate: 30\n    depth: 2\n").replace("    memlock: 64MiB\n", "    memlock: 64MiB  #!\n"), "processes[0].memlock", "maps 128.0MiB of channels (/a 128.0MiB), more than its memlock 64MiB"),
        c("channels beyond the board's memory", edit("  cpus: 4\n", "  cpus: 4\n  memory: 1GiB\n").replace("    max_size: 64\n    rate: 1000\n", "    max_size: 64MiB\n    rate: 30\n    depth: 16\n").replace("  - name: /a\n", "  - name: /a  #!\n").replace("64MiB\n    publishes", "unlimited\n    publishes"), "channels", "take 1.1GiB of shared memory, more than the board's 1.0GiB"),
        c("depth zero", edit("    rate: 1000\n", "    rate: 1000\n    depth: 0  #!\n"), "channels[0].depth", "out of range"),
        c("keep unread without a depth", edit("    rate: 1000\n", "    rate: 1000\n    keep: unread  #!\n"), "channels[0].keep", "keep: unread needs a `depth`"),
        c("keep unread with two publishers", edit("    rate: 1000\n", "    rate: 1000\n    depth: 2\n    keep: unread  #!\n") + "  - name: q\n    exec: bin/q\n    publishes: [/a]\n", "channels[0].keep", "which 2 processes publish"),
        c("keep word", edit("    rate: 1000\n", "    rate: 1000\n    keep: oldest  #!\n"), "channels[0].keep", "unknown variant `oldest`"),
        c("too many holds", edit("    rate: 1000\n", "    rate: 1000\n    holds: 100  #!\n"), "channels[0].holds", "expected 0 to 64"),
        c("reserved channel", edit("  - name: /a\n", "  - name: /rtdeploy/timing/x  #!\n").replace("[/a]", "[/rtdeploy/timing/x]"), "channels[0].name", "keeps for its timing reports"),
        c("channel unknown field", edit("    max_size: 64\n", "    sise: 64  #!\n    max_size: 64\n"), "channels[0].sise", "unknown field `sise`"),
        c("channels not a list", edit("channels:\n  - name: /a\n    max_size: 64\n    rate: 1000\n", "channels:\n  name: /a  #!\n").replace("    publishes: [/a]\n", ""), "channels", "must be a list"),
        c("priority too high", edit("    priority: 50\n", "    priority: 120  #!\n"), "processes[0].priority", "expected 1 to 99"),
        c("fifo without priority", edit("  - name: p\n", "  - name: p  #!\n").replace("    priority: 50\n", ""), "processes[0].priority", "needs a priority"),
        c("other with priority", edit("    policy: fifo\n    priority: 50\n", "    policy: other\n    priority: 10  #!\n"), "processes[0].priority", "takes no priority"),
        c("policy typo", edit("    policy: fifo\n", "    policy: FIFO  #!\n"), "processes[0].policy", "expected one of `fifo`, `rr`, `other`"),
        c("rt on housekeeping", edit("    memlock: 64MiB\n", "    memlock: 64MiB\n    cpus: 1-2  #!\n"), "processes[0].cpus", "non-isolated CPUs 1"),
        c("process beyond board", edit("    memlock: 64MiB\n", "    memlock: 64MiB\n    cpus: 9  #!\n"), "processes[0].cpus", "do not exist"),
        c("publishes unknown", edit("    publishes: [/a]\n", "    publishes: [/b]  #!\n"), "processes[0].publishes[0]", "no channel `/b`"),
        c("subscribes unknown", add("    subscribes:\n      - /a\n      - /c  #!\n"), "processes[0].subscribes[1]", "no channel `/c`"),
        c("duplicate process", add("  - name: p  #!\n    exec: bin/q\n"), "processes[1].name", "already defined"),
        c("after unknown", add("    after: [ghost]  #!\n"), "processes[0].after[0]", "no process `ghost`"),
        c("after cycle", add("    after: [q]\n  - name: q\n    exec: bin/q\n    after: [p]\n").replace("    after: [q]\n", "    after: [q]  #!\n"), "processes[0].after", "cycle"),
        c("restart policy", add("    restart: {policy: sometimes}  #!\n"), "processes[0].restart.policy", "expected one of `always`, `on-failure`, `never`"),
        c("backoff order", add("    restart:\n      initial_backoff: 5s\n      max_backoff: 1s  #!\n"), "processes[0].restart.max_backoff", "below initial_backoff"),
        c("nice range", edit("    policy: fifo\n    priority: 50\n", "    policy: other\n    nice: 30  #!\n").replace("    memlock: 64MiB\n", ""), "processes[0].nice", "expected -20 to 19"),
        c("memlock", edit("    memlock: 64MiB\n", "    memlock: lots  #!\n"), "processes[0].memlock", "or `unlimited`"),
        c("exec escapes", edit("    exec: bin/p\n", "    exec: ../evil  #!\n"), "processes[0].exec", "leaves the release directory"),
        c("process name", edit("  - name: p\n", "  - name: Imu  #!\n"), "processes[0].name", "not a valid process name"),
        c("process field typo", add("    prio: 3  #!\n"), "processes[0].prio", "unknown field `prio`"),
        c("zero budget", add("    budgets: {wakeup: 0us}  #!\n"), "processes[0].budgets.wakeup", "expected a positive duration"),
        c("stop timeout unit", add("    stop_timeout: 5  #!\n"), "processes[0].stop_timeout", "no unit"),
        c("duration unit", add("    stop_timeout: 5 parsecs  #!\n"), "processes[0].stop_timeout", "unknown unit"),
        c("burst above rt", add("check:\n  priority: 50\n  bursts: {priority: 60}  #!\n"), "check.bursts.priority", "must be below the real-time priority"),
        c("boot check on_failure", add("boot_check:\n  on_failure: panic  #!\n"), "boot_check.on_failure", "expected `refuse` or `degrade`"),
        c("update keep", add("update:\n  keep: 1  #!\n"), "update.keep", "nothing to roll back to"),
        c("public key", add("update:\n  public_keys: [\"not-a-key\"]  #!\n"), "update.public_keys[0]", "not an ed25519 public key"),
        c("duplicate key", edit("  cpus: 4\n", "  cpus: 4\n  cpus: 6  #!\n"), "", "duplicate key `cpus`"),
        c("not a mapping", "- robot  #!\n".into(), "", "must be a mapping of sections"),
        c("empty file", "#!\n".into(), "", "empty"),
        c("cpus wrong type", edit("  isolated: 2-3\n", "  isolated: [2, 3]  #!\n"), "cpus.isolated", "CPU list"),
        // Limits: numbers.
        c("cpu count beyond u32 CPUs", edit("  cpus: 4\n", "  cpus: 4294967295  #!\n"), "board.cpus", "4294967295 CPUs is out of range (expected 1 to 1024)"),
        c("cpu count zero", edit("  cpus: 4\n", "  cpus: 0  #!\n"), "board.cpus", "0 CPUs is out of range (expected 1 to 1024)"),
        c("cpu count beyond u32", edit("  cpus: 4\n", "  cpus: 4294967296  #!\n"), "board.cpus", "expected u32"),
        c("cpu range to u32 max", edit("  isolated: 2-3\n", "  isolated: 2-4294967295  #!\n"), "cpus.isolated", "CPU 4294967295 is beyond the largest supported CPU number 1023"),
        c("cpu number beyond the largest", edit("  isolated: 2-3\n", "  isolated: 1024  #!\n"), "cpus.isolated", "CPU 1024 is beyond the largest supported CPU number 1023"),
        c("queue length beyond 64 bits", edit("    rate: 1000\n", "    rate: 2000000000\n    retention: 9223372036854775808ns  #!\n"), "channels[0].retention", "needs more than 2^64 slots (at most 1048576"),
        c("largest rate and retention", edit("    rate: 1000\n", "    rate: 4294967295\n    retention: 18446744073s  #!\n"), "channels[0].retention", "needs more than 2^64 slots"),
        c("integer beyond 128 bits", edit("    rate: 1000\n", "    rate: 1234567890123456789012345678901234567890  #!\n"), "channels[0].rate", "is out of range (a 40-digit number"),
        // The board's kernel: what it is, and what it cannot do.
        c("kernel version", add("kernel:\n  version: 5.x  #!\n"), "kernel.version", "`5.x` is not a kernel version"),
        c("unknown l4t release", jetson(&add("kernel:\n  l4t: R33.1  #!\n")), "kernel.l4t", "L4T R33 is not a release rtdeploy knows the kernel of (expected R32, R34, R35, R36, R38"),
        c("l4t on a board without Jetson Linux", add("kernel:\n  l4t: 36.4.3  #!\n"), "kernel.l4t", "board `generic` does not run Jetson Linux"),
        c("l4t older than the board", jetson(&add("kernel:\n  l4t: R32.7.4  #!\n")), "kernel.l4t", "L4T R32.7.4 does not support"),
        c("kernel and l4t disagree", jetson(&add("kernel:\n  version: 6.1  #!\n  l4t: 36.4\n")), "kernel.version", "kernel 6.1 disagrees with L4T R36.4.0 (JetPack 6 ships 5.15)"),
        c("isolated partition on 5.15", edit("  isolated: 2-3\n", "  isolated: 2-3\n  partition: isolated  #!\n") + "kernel:\n  version: \"5.15\"\n", "cpus.partition", "`isolated` partitions need Linux 6.1 or later; the board runs 5.15 (kernel.version)"),
        c("isolated partition on JetPack 5", jetson(&(edit("  isolated: 2-3\n", "  isolated: 2-3\n  partition: isolated  #!\n") + "kernel:\n  l4t: 35.6.0\n")), "cpus.partition", "the board runs 5.10 (kernel.l4t R35.6.0, JetPack 5)"),
        c("nested partition on 6.6", edit("  isolated: 2-3\n", "  isolated: 2-3\n  partition: root  #!\n") + "kernel:\n  version: 6.6.70-rt\n", "cpus.partition", "needs cpuset.cpus.exclusive (Linux 6.7 or later)"),
        c("forced backend the kernel lacks", edit("    publishes: [/a]\n", "    publishes: [/a]\n    env:\n      RTDEPLOY_BACKEND: io_uring-futex  #!\n") + "kernel:\n  version: 5.15.148-tegra\n", "processes[0].env.RTDEPLOY_BACKEND", "backend `io_uring-futex` needs Linux 6.7 or later; the board runs 5.15"),
        c("unknown backend", edit("    publishes: [/a]\n", "    publishes: [/a]\n    env:\n      RTDEPLOY_BACKEND: epoll  #!\n"), "processes[0].env.RTDEPLOY_BACKEND", "unknown wake backend `epoll` (expected one of: io_uring-futex, futex_waitv, doorbell)"),
        c("boot attempt limit out of range", add("update:\n  boot_attempts:\n    limit: 12  #!\n"), "update.boot_attempts.limit", "12 (expected 1 to 8: the boot script counts in one digit)"),
        c("boot partition not absolute", add("update:\n  boot_attempts:\n    partition: boot/../rtboot  #!\n"), "update.boot_attempts.partition", "is not a mount point"),
        c("boot attempts on a Jetson", jetson(&add("update:\n  boot_attempts:\n    limit: 3  #!\n")), "update.boot_attempts", "Jetson boards boot through UEFI (L4TLauncher)"),
        c("watchdog device out of /dev", add("watchdog:\n  device: /dev/../tmp/wd  #!\n"), "watchdog.device", "`/dev/../tmp/wd` (expected a device node under /dev without `.` or `..`, like `/dev/watchdog0`)"),
        c("watchdog device not a path", add("watchdog:\n  device: watchdog0  #!\n"), "watchdog.device", "`watchdog0` (expected a device node under /dev"),
        c("watchdog timeout in milliseconds", add("watchdog:\n  timeout: 1500ms  #!\n"), "watchdog.timeout", "1500ms (expected whole seconds from 4s to 3600s: the kernel sets a watchdog's timeout in seconds)"),
        c("watchdog timeout too long", add("watchdog:\n  timeout: 2h  #!\n"), "watchdog.timeout", "(expected whole seconds from 4s to 3600s"),
        c("watchdog unknown key", add("watchdog:\n  heartbeat: 10s  #!\n"), "watchdog.heartbeat", "unknown"),
        c("boot attempts without extlinux.conf", add("update:\n  boot_attempts:\n    limit: 3  #!\n"), "update.boot_attempts", "board `generic`: this board's boot loader is not one rtdeploy writes extlinux.conf for"),
        // Limits: aliases and nesting.
        c("too many aliases", add(&format!("sysctl:\n  kernel.x: &a 1\n  kernel.y: [{}]  #!\n", vec!["*a"; 1025].join(", "))), "", "more than 1024 aliases (the limit for robot.yaml)"),
        c("aliases of aliases", add(&format!("sysctl:\n  a0: &a0 [{}]\n  a1: &a1 [{}]\n  a2: &a2 [{}]  #!\n", vec!["x"; 100].join(","), vec!["*a0"; 100].join(","), vec!["*a1"; 100].join(","))), "", "aliases expand to more than 100000 values (the limit for robot.yaml)"),
        c("alias copies of long text", add(&format!("sysctl:\n  a: &a {}\n  b: [*a, *a, *a, *a, *a]  #!\n", "x".repeat(300_000))), "", "aliases copy more than 1024 KiB of text (the limit for robot.yaml)"),
        c("nested too deep", add(&format!("sysctl:\n  x: {}1{}  #!\n", "[".repeat(70), "]".repeat(70))), "", "nested deeper than 64 levels (the limit for robot.yaml)"),
        // The 65th mapping (the file's, `sysctl:`'s, then those of k1 to k63)
        // starts at k64.
        c("nested too deep in blocks", add(&format!("sysctl:\n{}\n", (1..=70).map(|i| format!("{}k{i}:{}", " ".repeat(2 * i), if i == 64 { "  #!" } else { "" })).collect::<Vec<_>>().join("\n"))), "", "nested deeper than 64 levels (the limit for robot.yaml)"),
        c("nested too deep by an alias", add(&format!("sysctl:\n  a: &a {}1{}\n  b: [[[[*a]]]]  #!\n", "[".repeat(60), "]".repeat(60))), "", "this alias nests the document 66 levels deep (the limit is 64)"),
        // Echoed values are escaped and cut.
        c("control characters echoed", edit("  name: t\n", "  name: \"a\\e[2Jb\\nc\"  #!\n"), "robot.name", "`a\\u{1b}[2Jb\\nc` is not a valid robot name"),
        c("long key echoed", add(&format!("? {}  #!\n: 1\n", "k".repeat(5000))), "", "(4952 more characters)` (expected one of: robot, board"),
    ]
}

fn deploy(config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(["config", "check", "-c"])
        .arg(config)
        .output()
        .expect("run deploy")
}

#[test]
fn base_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, BASE).unwrap();
    let out = deploy(&path);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_malformed_config_is_refused_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let cases = cases();
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let line = case
            .yaml
            .lines()
            .position(|l| l.contains("#!"))
            .unwrap_or_else(|| panic!("case `{}` has no #! marker", case.name))
            + 1;
        let path = dir.path().join(format!("case{i}.yaml"));
        std::fs::write(&path, &case.yaml).unwrap();
        let out = deploy(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let want_place = format!("{}:{line}:", path.display());
        let error_line = stderr
            .lines()
            .find(|l| l.starts_with(&want_place) && l.contains(": error: "));
        let ok = out.status.code() == Some(2)
            && error_line.is_some_and(|l| {
                (case.field.is_empty() || l.contains(&format!(": {}: ", case.field)))
                    && l.contains(case.says)
            });
        if !ok {
            failures.push(format!(
                "case `{}`: exit {:?}, wanted an error at line {line} naming `{}` and saying `{}`; got:\n{stderr}",
                case.name,
                out.status.code(),
                case.field,
                case.says
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let yaml = BASE
        .replace("  isolated: 2-3\n", "  isolated: 0,2-3\n")
        .replace("    rate: 1000\n", "    rate: 0\n")
        .replace("    priority: 50\n", "    priority: 300\n")
        + "update:\n  keep: 1\n";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = deploy(&path);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for field in [
        "cpus.isolated",
        "cpus.housekeeping",
        "channels[0].rate",
        "processes[0].priority",
        "update.keep",
    ] {
        assert!(
            stderr.contains(&format!(": error: {field}: ")),
            "no error for {field} in:\n{stderr}"
        );
    }
    assert!(stderr.contains("5 errors"), "{stderr}");
}

#[test]
fn bad_elements_of_a_list_are_each_reported() {
    let yaml = BASE.replace(
        "    publishes: [/a]\n",
        "    publishes: [/a]\n  - name: q\n    exec: bin/q\n    policy: fifo\n    priority: 500\n  - name: r\n    exec: 5\n    policy: nope\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = deploy(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    // The unparsable element and the invalid one are both reported.
    assert!(
        stderr.contains(": error: processes[2].policy: unknown variant `nope`"),
        "{stderr}"
    );
    assert!(
        stderr.contains(": error: processes[1].priority: priority 500 is out of range"),
        "{stderr}"
    );
}

#[test]
fn warnings_do_not_fail() {
    let yaml = add("  - name: bg\n    exec: bin/bg\n    cpus: 0-2\n");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = deploy(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            ": warning: processes[1].cpus: non-real-time process `bg` runs on isolated CPUs 2"
        ),
        "{stderr}"
    );
}

/// Boot attempts on the QEMU aarch64 board (U-Boot, extlinux.conf): valid;
/// without `panic=` in kernel.cmdline a warning says a panic counts no
/// attempt, and with it there is none.
#[test]
fn boot_attempts_without_panic_on_the_command_line_is_a_warning() {
    let qemu = BASE.replacen(
        "  model: generic\n  cpus: 4\n",
        "  model: qemu-aarch64\n",
        1,
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    for (extra, warned) in [("", true), ("kernel:\n  cmdline: [panic=10]\n", false)] {
        std::fs::write(
            &path,
            format!("{qemu}update:\n  boot_attempts:\n    limit: 2\n{extra}"),
        )
        .unwrap();
        let out = deploy(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert_eq!(
            stderr.contains(
                ": warning: update.boot_attempts: a kernel panic does not reboot without `panic=N`"
            ),
            warned,
            "{extra:?}: {stderr}"
        );
    }
}

/// `tsc=reliable` on a Jetson: an x86 parameter the arm64 kernel ignores.
#[test]
fn a_command_line_token_of_another_architecture_is_a_warning() {
    let yaml = jetson(&add(
        "kernel:\n  cmdline:\n    - nosoftlockup\n    - tsc=reliable\n",
    ));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let out = deploy(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let line = yaml.lines().position(|l| l.contains("tsc=")).unwrap() + 1;
    assert!(
        stderr.contains(&format!(
            ":{line}:7: warning: kernel.cmdline[1]: `tsc=reliable` is a x86_64 parameter; board `jetson-orin-nano` is aarch64 and its kernel ignores it (remove it)"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("nosoftlockup"), "{stderr}");
}

#[test]
fn json_report_lists_diagnostics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, BASE.replace("    rate: 1000\n", "    rate: 0\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(["--json", "config", "check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("one JSON document on stdout");
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(doc["valid"], false);
    assert_eq!(doc["diagnostics"][0]["field"], "channels[0].rate");
    assert_eq!(doc["diagnostics"][0]["line"], 12);
}

#[test]
fn a_file_that_is_not_utf8_is_refused_at_its_first_bad_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    // Columns count characters: `µ` is two bytes, one column.
    let mut bytes = BASE
        .replacen("  name: t\n", "  name: tµ\u{0}\n", 1)
        .into_bytes();
    let at = bytes.iter().position(|&b| b == 0).unwrap();
    bytes[at] = 0xff;
    std::fs::write(&path, bytes).unwrap();
    let out = deploy(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}:2:11: error: byte 0xff is not UTF-8 (robot.yaml must be UTF-8 text)",
            path.display()
        )),
        "{stderr}"
    );
}

/// Peak memory a refused file may cost `deploy config check` (it needs
/// about 15 MiB for a valid one).
const MAX_RSS_KIB: i64 = 200 * 1024;

/// A run still going after this has hung or gone quadratic: it is killed
/// and the test fails. A safety net, not a timing assertion: every run
/// below ends in well under a second.
const WATCHDOG: Duration = Duration::from_secs(60);

/// The child's peak memory counts this process's pages at the fork (see
/// [`process::fork_exec`]), so bounded runs go one at a time, each test
/// building and dropping its large file's text under this lock.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How a bounded run of `deploy config check` ended.
struct Bounded {
    code: Option<i32>,
    stderr: String,
    /// Peak resident memory, from wait4's rusage.
    peak_rss_kib: i64,
}

/// This process's resident memory, from /proc/self/status.
fn own_rss_kib() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Runs `deploy config check -c <config>` in a child whose peak memory is
/// read with wait4; a watchdog kills it after [`WATCHDOG`] and fails the
/// test. The output goes to files (a pipe nobody reads would block it).
/// The caller holds [`one_at_a_time`].
fn deploy_bounded(dir: &Path, config: &Path) -> Bounded {
    // The peak read below is at least this process's size at the fork: it
    // must be small for the bound to say anything about `deploy`.
    let own = own_rss_kib();
    assert!(
        own < MAX_RSS_KIB / 4,
        "the test process holds {own} KiB: too much to measure a child's peak"
    );
    let stderr_path = dir.join("stderr");
    let mut command = Command::new(env!("CARGO_BIN_EXE_deploy"));
    command
        .args(["config", "check", "-c"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(File::create(dir.join("stdout")).unwrap())
        .stderr(File::create(&stderr_path).unwrap());
    process::fork_exec(&mut command);
    // Reaped below by wait4, for its rusage (Child::wait drops it).
    #[allow(clippy::zombie_processes)]
    let pid = command.spawn().expect("run deploy").id() as libc::pid_t;
    let exited = Arc::new((Mutex::new(false), Condvar::new()));
    let watchdog = {
        let exited = Arc::clone(&exited);
        std::thread::spawn(move || {
            let (lock, cv) = &*exited;
            let done = lock.lock().unwrap();
            let (done, _) = cv.wait_timeout_while(done, WATCHDOG, |e| !*e).unwrap();
            // Under the lock, before the main thread marks the exit: the
            // child is running or a zombie, so the pid is still its own.
            if !*done {
                process::kill(pid);
                return true;
            }
            false
        })
    };
    process::wait_exit(pid);
    {
        let (lock, cv) = &*exited;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
    let (status, peak_rss_kib) = process::reap(pid);
    let killed = watchdog.join().unwrap();
    let mut stderr = String::new();
    File::open(&stderr_path)
        .unwrap()
        .take(1 << 20)
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        !killed,
        "deploy config check -c {} still ran after {WATCHDOG:?} and was killed; stderr:\n{}",
        config.display(),
        &stderr[..stderr.len().min(2000)]
    );
    Bounded {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stderr,
        peak_rss_kib,
    }
}

/// The few process calls std does not offer: waiting for an exit without
/// reaping it, reaping with the child's resource usage, and a kill by pid.
#[allow(unsafe_code)]
mod process {
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// Makes a FIFO at `path`.
    pub fn mkfifo(path: &std::path::Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(r, 0, "mkfifo: {}", std::io::Error::last_os_error());
    }

    /// Makes `command` start with fork and exec, not posix_spawn.
    ///
    /// A posix_spawn child shares this process's memory until it execs,
    /// and exec records the high-water mark of the memory it leaves: the
    /// child's ru_maxrss would be this test process's own peak. A forked
    /// child's mark is this process's size at the fork instead (which the
    /// caller keeps small), and then its own.
    pub fn fork_exec(command: &mut Command) {
        // SAFETY: the closure does nothing, so it is async-signal-safe and
        // touches no state shared with the parent; it only makes std fork.
        unsafe { command.pre_exec(|| Ok(())) };
    }
    /// Blocks until `pid` exits, leaving it a zombie: until it is reaped,
    /// its pid cannot be given to another process.
    pub fn wait_exit(pid: libc::pid_t) {
        loop {
            // SAFETY: all-zero bytes are a valid siginfo_t (plain integers
            // and unions of them).
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `info` is a valid, writable siginfo_t for the call's
            // duration; P_PID with a pid of our own child.
            let r = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                )
            };
            if r == 0 {
                return;
            }
            let err = std::io::Error::last_os_error();
            assert_eq!(err.kind(), std::io::ErrorKind::Interrupted, "waitid: {err}");
        }
    }

    /// Reaps `pid`: its wait status and peak resident memory in KiB.
    pub fn reap(pid: libc::pid_t) -> (libc::c_int, i64) {
        let mut status = 0;
        // SAFETY: all-zero bytes are a valid rusage (integers and timevals).
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `status` and `usage` are valid and writable for the
        // call's duration; `pid` is our own child, exited, not yet reaped.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
        (status, usage.ru_maxrss)
    }

    /// SIGKILL to `pid`, which the caller knows is not yet reaped.
    pub fn kill(pid: libc::pid_t) {
        // SAFETY: kill has no memory-safety conditions; the caller
        // guarantees the pid is still our child's.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Checks a bounded run: refused (exit 2) with `error` at `place`
/// (`line:col`), a short report, within [`MAX_RSS_KIB`].
fn assert_refused_within_bounds(run: &Bounded, config: &Path, place: &str, error: &str) {
    let want = format!("{}:{place}: error: {error}", config.display());
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.lines().any(|l| l.starts_with(&want)),
        "wanted a line starting with\n{want}\ngot:\n{}",
        &run.stderr[..run.stderr.len().min(4000)]
    );
    assert!(
        run.stderr.len() < 64 << 10,
        "{} bytes of report",
        run.stderr.len()
    );
    assert!(
        run.peak_rss_kib < MAX_RSS_KIB,
        "peak RSS {} KiB (at most {MAX_RSS_KIB} KiB)",
        run.peak_rss_kib
    );
    eprintln!(
        "{}: refused at {place}, peak RSS {} KiB",
        config.display(),
        run.peak_rss_kib
    );
}

#[test]
fn billion_laughs_is_refused_at_the_alias_past_the_limit() {
    let _serial = one_at_a_time();
    // Ten levels of ten aliases of the level below: 10^10 strings once
    // expanded, in about 1.8 KB.
    let mut yaml = String::from("robot:\n  name: t\nsysctl:\n");
    yaml += &format!("  l0: &l0 [{}]\n", ["\"lol\""; 10].join(", "));
    for level in 1..10 {
        let below = format!("*l{}", level - 1);
        yaml += &format!(
            "  l{level}: &l{level} [{}]\n",
            [below.as_str(); 10].join(", ")
        );
    }
    assert!(yaml.len() < 2000, "{} bytes", yaml.len());
    // Where the expansion first passes the limit, counted here
    // independently: an alias of level k copies the list and what is
    // under it.
    let nodes = |level: u32| (0..=level + 1).map(|k| 10usize.pow(k)).sum::<usize>();
    let mut total = 0;
    let mut place = None;
    'lines: for (i, line) in yaml.lines().enumerate() {
        let mut from = 0;
        while let Some(at) = line[from..].find("*l") {
            let col = from + at;
            let level: u32 = line[col + 2..col + 3].parse().unwrap();
            total += nodes(level);
            if total > services::robot::MAX_ALIAS_NODES {
                place = Some(format!("{}:{}", i + 1, col + 1));
                break 'lines;
            }
            from = col + 2;
        }
    }
    let place = place.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let run = deploy_bounded(dir.path(), &path);
    assert_refused_within_bounds(
        &run,
        &path,
        &place,
        "aliases expand to more than 100000 values (the limit for robot.yaml)",
    );
}

#[test]
fn a_cpu_count_of_u32_max_is_refused_without_building_the_set() {
    let _serial = one_at_a_time();
    // It was 4 billion single-CPU inserts into a 512 MiB set.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, edit("  cpus: 4\n", "  cpus: 4294967295\n")).unwrap();
    let run = deploy_bounded(dir.path(), &path);
    assert_refused_within_bounds(
        &run,
        &path,
        "5:9",
        "board.cpus: 4294967295 CPUs is out of range (expected 1 to 1024)",
    );
    // And no follow-on error measuring the processes against no CPUs.
    assert_eq!(run.stderr.matches(": error: ").count(), 1, "{}", run.stderr);
}

#[test]
fn an_endless_device_and_a_fifo_are_refused_without_being_read() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    // A FIFO nobody writes: opening it for reading used to wait forever.
    let fifo = dir.path().join("robot.yaml");
    process::mkfifo(&fifo);
    for (path, kind) in [
        (Path::new("/dev/zero"), "a character device"),
        (fifo.as_path(), "a FIFO"),
    ] {
        let run = deploy_bounded(dir.path(), path);
        assert_eq!(run.code, Some(2), "{}", run.stderr);
        let want = format!(
            "deploy: cannot read {}: {kind}, not a regular file",
            path.display()
        );
        assert!(
            run.stderr.contains(&want),
            "wanted {want}, got {}",
            run.stderr
        );
        assert!(
            run.peak_rss_kib < MAX_RSS_KIB,
            "peak RSS {} KiB (at most {MAX_RSS_KIB} KiB)",
            run.peak_rss_kib
        );
    }
}

#[test]
fn a_50_mb_value_is_refused_by_the_size_limit_and_not_echoed() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    let name = "x".repeat(50_000_000);
    let yaml = BASE.replacen("  name: t\n", &format!("  name: {name}\n"), 1);
    std::fs::write(&path, yaml).unwrap();
    // Freed before the run (see `one_at_a_time`).
    drop(name);
    let run = deploy_bounded(dir.path(), &path);
    // The limit falls on line 2, after `robot:\n` (7 bytes).
    assert_refused_within_bounds(
        &run,
        &path,
        &format!("2:{}", services::robot::MAX_FILE_BYTES - 7 + 1),
        "the file is larger than 512 KiB (the limit for robot.yaml)",
    );
    assert!(!run.stderr.contains(&"x".repeat(100)), "value echoed");
}

#[test]
fn a_long_value_is_echoed_cut_short() {
    let _serial = one_at_a_time();
    // Just within the size limit, so that the validator quotes it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    let name = "X".repeat(500_000);
    std::fs::write(
        &path,
        BASE.replacen("  name: t\n", &format!("  name: {name}\n"), 1),
    )
    .unwrap();
    let run = deploy_bounded(dir.path(), &path);
    assert_refused_within_bounds(&run, &path, "2:9", "robot.name: `XXXX");
    let line = run.stderr.lines().next().unwrap();
    assert!(line.len() < 1000, "{} bytes: {line}", line.len());
    assert!(line.contains("characters cut"), "{line}");
    // What would be accepted, at the end of the message, is kept.
    assert!(line.ends_with("at most 64 characters)"), "{line}");
}

#[test]
fn duplicate_keys_are_found_in_linear_time() {
    let _serial = one_at_a_time();
    // As many keys as fit in the size limit (131 000 keys of three
    // characters, in a flow mapping), the last one a duplicate of the
    // first. Compared pairwise, that is 8.6e9 comparisons (50 000 keys took
    // 36 s): minutes, and the watchdog fails the test long before.
    let digits: Vec<char> = ('a'..='z').chain('A'..='Z').chain('0'..='9').collect();
    let key = |i: usize| -> String {
        [i / 3844, i / 62 % 62, i % 62]
            .iter()
            .map(|&d| digits[d])
            .collect()
    };
    let mut yaml = String::from("robot:\n  name: t\nsysctl: {");
    let mut keys = 0;
    while yaml.len() < services::robot::MAX_FILE_BYTES - 16 {
        yaml += &key(keys);
        yaml.push(',');
        keys += 1;
    }
    let col = yaml.len() - "robot:\n  name: t\n".len() + 1;
    yaml += &key(0);
    yaml += "}\n";
    assert!(keys > 130_000, "{keys} keys");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let run = deploy_bounded(dir.path(), &path);
    assert_refused_within_bounds(
        &run,
        &path,
        &format!("3:{col}"),
        "duplicate key `aaa` (first written on line 3)",
    );
}

#[test]
fn aliases_of_a_long_value_are_refused_within_bounds() {
    let _serial = one_at_a_time();
    // 400 KB of text aliased a thousand times would be 400 MB of strings.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    let yaml = format!(
        "robot:\n  name: t\nsysctl:\n  a: &a {}\n  b: [*a, *a, *a]\n  c: [{}]\n",
        "v".repeat(400_000),
        vec!["*a"; 1000].join(", ")
    );
    std::fs::write(&path, yaml).unwrap();
    let run = deploy_bounded(dir.path(), &path);
    // The third copy passes 1 MiB.
    assert_refused_within_bounds(
        &run,
        &path,
        "5:15",
        "aliases copy more than 1024 KiB of text (the limit for robot.yaml)",
    );
}

#[test]
fn nesting_by_anchors_of_anchors_costs_no_copies() {
    let _serial = one_at_a_time();
    // Every list here is anchored, each inside the next: copying each
    // anchored list would keep 60 copies of the 250 000 values inside.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    let mut inner = vec!["1"; 250_000].join(",");
    for i in 0..60 {
        inner = format!("&a{i} [{inner}]");
    }
    let yaml = format!("robot:\n  name: t\nsysctl:\n  x: {inner}\n  y: bad value\n");
    assert!(yaml.len() < services::robot::MAX_FILE_BYTES);
    std::fs::write(&path, yaml).unwrap();
    let run = deploy_bounded(dir.path(), &path);
    assert_refused_within_bounds(&run, &path, "1:1", "board: missing section `board`");
}

#[test]
fn a_flood_of_problems_is_cut_at_the_limit() {
    let _serial = one_at_a_time();
    // 80 000 bad list elements, one problem each.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    let yaml = format!(
        "{BASE}kernel:\n  cmdline: [{}]\n",
        vec!["\"a b\""; 80_000].join(",")
    );
    assert!(yaml.len() < services::robot::MAX_FILE_BYTES);
    std::fs::write(&path, yaml).unwrap();
    let run = deploy_bounded(dir.path(), &path);
    assert_refused_within_bounds(
        &run,
        &path,
        "21:13",
        "kernel.cmdline[0]: `a b` is not one command line token",
    );
    let max = services::robot::MAX_DIAGNOSTICS;
    let listed = run.stderr.matches(": error: ").count();
    assert_eq!(listed, max + 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!(
            ": error: {} more problems, the first here, not listed (at most {max} are reported)",
            80_000 - max
        )),
        "{}",
        run.stderr
    );
}
