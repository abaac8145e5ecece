//! The kernel log: what the kernel said while it parsed the isolation
//! parameters of its command line.

use std::path::Path;

use units::cpu::CpuSet;

use super::{check, Check, Status};
use crate::plan::RuntimePlan;

/// The most of the kernel log [`read_kernel_log`] reads.
pub const MAX_KERNEL_LOG: u64 = 8 << 20;

/// The kernel log's records (`/dev/kmsg`: `prio,seq,usec,flags;text`,
/// continuation lines start with a space), without blocking.
/// At most [`MAX_KERNEL_LOG`] bytes are read (the kernel's log buffer is
/// 2^CONFIG_LOG_BUF_SHIFT bytes, 128 KiB to a few MiB on the kernels we
/// meet): a sysroot whose `dev/kmsg` never ends is cut there.
pub fn read_kernel_log(path: &Path) -> std::io::Result<Vec<String>> {
    use std::io::Read;
    let mut f = units::bounded::Bound::pseudo(MAX_KERNEL_LOG)
        .open(path)
        .map_err(|e| e.into_io())?;
    let mut text = String::new();
    let mut buf = vec![0u8; 16 * 1024];
    while (text.len() as u64) < MAX_KERNEL_LOG {
        // /dev/kmsg returns one record per read; a plain file, chunks.
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // EPIPE: the record was overwritten while we read; go on.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if text.is_empty() => return Err(e),
            Err(_) => break,
        }
    }
    Ok(text
        .lines()
        .filter(|l| !l.starts_with(' '))
        .map(|l| l.split_once(';').map_or(l, |(_, msg)| msg).to_string())
        .collect())
}

/// Boot messages about the isolation parameters: warnings the kernel
/// printed while parsing them, and the tickless CPUs it settled on.
pub(super) fn check_kernel_log(plan: &RuntimePlan, kmsg: &Path) -> Check {
    let lines = match read_kernel_log(kmsg) {
        Ok(lines) => lines,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return check(
                "cmdline.kernel_log",
                Status::Unsupported,
                format!("no kernel log at {}", kmsg.display()),
                None,
            )
        }
        Err(e) => {
            return check(
                "cmdline.kernel_log",
                Status::Unsupported,
                format!("cannot read the kernel log {}: {e}", kmsg.display()),
                Some("run as root (dmesg_restrict) to read the kernel's warnings about isolcpus=/nohz_full="),
            )
        }
    };
    const TOPICS: &[&str] = &[
        "isolcpus",
        "nohz_full",
        "no_hz",
        "housekeeping",
        "rcu_nocb",
        "irqaffinity",
    ];
    const TROUBLE: &[&str] = &[
        "error",
        "invalid",
        "incorrect",
        "unsupported",
        "not supported",
        "clearing",
        "must include",
        "ignor",
    ];
    let mut problems: Vec<String> = lines
        .iter()
        .filter(|l| {
            let low = l.to_ascii_lowercase();
            TOPICS.iter().any(|t| low.contains(t)) && TROUBLE.iter().any(|t| low.contains(t))
        })
        .cloned()
        .collect();
    let isolated = &plan.cpus.isolated;
    let nohz = lines
        .iter()
        .find_map(|l| l.strip_prefix("NO_HZ: Full dynticks CPUs: "));
    if plan.cmdline.iter().any(|t| t.key() == "nohz_full") {
        if let Some(cpus) = nohz {
            let cpus = cpus.trim_end_matches('.');
            if CpuSet::parse_list(cpus).ok().as_ref() != Some(isolated) {
                problems.push(format!(
                    "NO_HZ: Full dynticks CPUs: {cpus} (planned {isolated})"
                ));
            }
        }
    }
    let mut c = if problems.is_empty() {
        let seen = nohz
            .map(|n| format!("; NO_HZ: Full dynticks CPUs: {n}"))
            .unwrap_or_default();
        check(
            "cmdline.kernel_log",
            Status::Ok,
            format!(
                "no kernel warning about the isolation parameters in {} records{seen}",
                lines.len()
            ),
            None,
        )
    } else {
        check(
            "cmdline.kernel_log",
            Status::Drift,
            format!(
                "the kernel warned about the isolation parameters ({} messages)",
                problems.len()
            ),
            Some("fix the command line the messages name; `deploy plan` prints the planned one"),
        )
    };
    c.items = problems;
    c
}
