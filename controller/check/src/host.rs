//! Facts about the host that every check report carries: which kernel,
//! whether it is PREEMPT_RT, the CPU, the frequency governors, the
//! `cpu_dma_latency` in force and the CPUs the kernel isolated. Everything is
//! read under a sysroot so tests can point it at a captured tree.

use std::fs;
use std::path::Path;

use serde::Serialize;

/// What the report says about the machine it ran on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostFacts {
    /// `/proc/sys/kernel/osrelease` (what `uname -r` prints).
    pub kernel_release: String,
    /// `/proc/sys/kernel/version` (`#1 SMP PREEMPT_RT ...`).
    pub kernel_version: String,
    /// `/sys/kernel/realtime` is `1`, or the version string says PREEMPT_RT.
    pub preempt_rt: bool,
    /// The preemption model named in the version string (`PREEMPT_RT`,
    /// `PREEMPT_DYNAMIC`, `PREEMPT`, or `none` when it names none).
    pub preempt_model: String,
    /// From `/proc/cpuinfo` (`model name`, else `Hardware`, else the
    /// device-tree model).
    pub cpu_model: Option<String>,
    /// `/sys/devices/system/cpu/online`.
    pub cpus_online: String,
    /// `scaling_governor` of every CPU that has cpufreq.
    pub governors: Vec<CpuGovernor>,
    /// `/sys/devices/system/cpu/isolated` (empty when none).
    pub isolated_cpus: String,
    /// The PM QoS CPU latency in force before the check took its own hold,
    /// read from `/dev/cpu_dma_latency` (microseconds); `None` when it
    /// could not be read.
    pub cpu_dma_latency_us: Option<i64>,
    /// What the kernel offers the runtime and the CPU plan: probed when
    /// the sysroot is `/`, else read off `kernel_release`.
    pub kernel_capabilities: controller::kernel::KernelFacts,
}

/// One CPU's frequency governor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuGovernor {
    pub cpu: u32,
    pub governor: String,
}

/// A /proc or /sys file of the sysroot, as text (through
/// `units::bounded`: no wait on a FIFO, at most 4 MiB).
fn read_pseudo(path: &Path) -> Option<String> {
    units::bounded::Bound::pseudo(4 << 20).read_lossy(path).ok()
}

fn read_trim(path: &Path) -> Option<String> {
    read_pseudo(path).map(|s| s.trim_end_matches(['\n', '\0']).trim().to_string())
}

/// The preemption model a kernel version string names.
pub fn preempt_model(version: &str) -> &'static str {
    let words: Vec<&str> = version.split_whitespace().collect();
    for m in ["PREEMPT_RT", "PREEMPT_DYNAMIC", "PREEMPT_LAZY", "PREEMPT"] {
        if words.contains(&m) {
            return m;
        }
    }
    "none"
}

/// The CPU model from the text of `/proc/cpuinfo`.
pub fn cpu_model_of(cpuinfo: &str) -> Option<String> {
    for key in ["model name", "Hardware", "Model"] {
        for line in cpuinfo.lines() {
            if let Some((k, v)) = line.split_once(':') {
                if k.trim() == key && !v.trim().is_empty() {
                    return Some(v.trim().to_string());
                }
            }
        }
    }
    None
}

/// Reads the host facts under `sysroot` (`/` on a robot).
pub fn read_host_facts(sysroot: &Path) -> HostFacts {
    let kernel_release =
        read_trim(&sysroot.join("proc/sys/kernel/osrelease")).unwrap_or_else(|| "unknown".into());
    let kernel_version =
        read_trim(&sysroot.join("proc/sys/kernel/version")).unwrap_or_else(|| "unknown".into());
    let rt_flag = read_trim(&sysroot.join("sys/kernel/realtime")).is_some_and(|s| s == "1");
    let model = preempt_model(&kernel_version);
    let cpu_model = read_pseudo(&sysroot.join("proc/cpuinfo"))
        .and_then(|t| cpu_model_of(&t))
        .or_else(|| read_trim(&sysroot.join("proc/device-tree/model")));
    let cpu_dir = sysroot.join("sys/devices/system/cpu");
    let mut governors = vec![];
    if let Ok(rd) = fs::read_dir(&cpu_dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(n) = name.strip_prefix("cpu").and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(g) = read_trim(&e.path().join("cpufreq/scaling_governor")) {
                governors.push(CpuGovernor {
                    cpu: n,
                    governor: g,
                });
            }
        }
    }
    governors.sort_by_key(|g| g.cpu);
    // A character device (read as a pseudo file): 4 bytes, or a short
    // text in a captured fixture.
    let cpu_dma_latency_us = units::bounded::Bound::pseudo(64)
        .read(&sysroot.join("dev/cpu_dma_latency"))
        .ok()
        .and_then(|b| dma_latency_value(&b));
    let kernel_capabilities =
        controller::kernel::KernelFacts::of(&kernel_release, sysroot == Path::new("/"));
    HostFacts {
        kernel_capabilities,
        kernel_release,
        preempt_rt: rt_flag || model == "PREEMPT_RT",
        preempt_model: model.to_string(),
        kernel_version,
        cpu_model,
        cpus_online: read_trim(&cpu_dir.join("online")).unwrap_or_default(),
        governors,
        isolated_cpus: read_trim(&cpu_dir.join("isolated")).unwrap_or_default(),
        cpu_dma_latency_us,
    }
}

/// `/dev/cpu_dma_latency` reads as a native-endian `s32`; a text value
/// (a captured fixture, or a hex string some tools write) is accepted too.
pub fn dma_latency_value(bytes: &[u8]) -> Option<i64> {
    if bytes.len() == 4 {
        return Some(i32::from_ne_bytes(bytes.try_into().ok()?) as i64);
    }
    let t = std::str::from_utf8(bytes).ok()?.trim();
    t.parse::<i64>()
        .ok()
        .or_else(|| i64::from_str_radix(t.trim_start_matches("0x"), 16).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preempt_models() {
        assert_eq!(
            preempt_model("#1 SMP PREEMPT_RT Debian 6.1.0-rt"),
            "PREEMPT_RT"
        );
        assert_eq!(
            preempt_model("#1 SMP PREEMPT_DYNAMIC @0"),
            "PREEMPT_DYNAMIC"
        );
        assert_eq!(preempt_model("#1 SMP PREEMPT Tue"), "PREEMPT");
        assert_eq!(preempt_model("#1 SMP Tue"), "none");
    }

    #[test]
    fn cpu_models() {
        assert_eq!(
            cpu_model_of("processor\t: 0\nmodel name\t: AMD EPYC\n").as_deref(),
            Some("AMD EPYC")
        );
        assert_eq!(
            cpu_model_of("processor\t: 0\nCPU part\t: 0xd42\nHardware\t: NVIDIA Orin\n").as_deref(),
            Some("NVIDIA Orin")
        );
        assert_eq!(cpu_model_of("processor\t: 0\n"), None);
    }

    #[test]
    fn dma_latency_forms() {
        assert_eq!(
            dma_latency_value(&2_000_000_000i32.to_ne_bytes()),
            Some(2_000_000_000)
        );
        assert_eq!(dma_latency_value(&0i32.to_ne_bytes()), Some(0));
        assert_eq!(dma_latency_value(b"0x00000000\n"), Some(0));
        assert_eq!(dma_latency_value(b"15\n"), Some(15));
    }

    #[test]
    fn a_captured_jetpack_tree_reports_its_kernel_by_version() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("proc/sys/kernel")).unwrap();
        std::fs::write(
            d.path().join("proc/sys/kernel/osrelease"),
            "5.10.216-tegra\n",
        )
        .unwrap();
        let f = read_host_facts(d.path()).kernel_capabilities;
        assert_eq!(f.found_by, "version");
        assert_eq!(f.wake_backend, Some("doorbell"));
        assert!(!f.io_uring_futex && !f.futex_waitv);
        // The running system is probed.
        let live = read_host_facts(Path::new("/")).kernel_capabilities;
        assert_eq!(live.found_by, "probe");
    }
}
