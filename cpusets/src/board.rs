//! The table of boards rtdeploy knows: CPU count, CPU clusters (CPUs that
//! share an L2/L3 and a clock), architecture and how the board boots.

use serde::Serialize;

use crate::cpuset::CpuSet;

/// How the kernel command line reaches the kernel on this board.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootLoader {
    /// Jetson Linux: `/boot/extlinux/extlinux.conf`, `APPEND` line.
    Extlinux,
    /// The command line is given by whoever starts the kernel (QEMU's
    /// `-append`, a PC boot loader); rtdeploy writes it to
    /// `/etc/rtdeploy/cmdline`.
    External,
}

/// One known board model.
#[derive(Debug, Clone, Serialize)]
pub struct Board {
    /// The name used in `robot.yaml` (`board.model`).
    pub model: &'static str,
    pub description: &'static str,
    pub arch: &'static str,
    /// CPU count, or `None` when `board.cpus` must say it.
    pub cpus: Option<u32>,
    /// Clusters as CPU lists; empty when unknown (one cluster of all CPUs).
    pub clusters: &'static [&'static str],
    pub boot: BootLoader,
    /// The Jetson Linux flash configuration (`flash.sh <config> ...`).
    pub flash_config: Option<&'static str>,
}

pub const BOARDS: &[Board] = &[
    Board {
        model: "jetson-orin-nano",
        description: "NVIDIA Jetson Orin Nano (6x Cortex-A78AE)",
        arch: "aarch64",
        cpus: Some(6),
        clusters: &["0-3", "4-5"],
        boot: BootLoader::Extlinux,
        flash_config: Some("jetson-orin-nano-devkit"),
    },
    Board {
        model: "jetson-orin-nx-8",
        description: "NVIDIA Jetson Orin NX 8GB (6x Cortex-A78AE)",
        arch: "aarch64",
        cpus: Some(6),
        clusters: &["0-3", "4-5"],
        boot: BootLoader::Extlinux,
        flash_config: Some("p3509-a02+p3767-0000"),
    },
    Board {
        model: "jetson-orin-nx-16",
        description: "NVIDIA Jetson Orin NX 16GB (8x Cortex-A78AE)",
        arch: "aarch64",
        cpus: Some(8),
        clusters: &["0-3", "4-7"],
        boot: BootLoader::Extlinux,
        flash_config: Some("p3509-a02+p3767-0000"),
    },
    Board {
        model: "jetson-agx-orin",
        description: "NVIDIA Jetson AGX Orin 64GB (12x Cortex-A78AE)",
        arch: "aarch64",
        cpus: Some(12),
        clusters: &["0-3", "4-7", "8-11"],
        boot: BootLoader::Extlinux,
        flash_config: Some("jetson-agx-orin-devkit"),
    },
    Board {
        model: "qemu-x86_64",
        description: "QEMU x86_64 virtual machine (-smp sets the CPU count, 4 by default)",
        arch: "x86_64",
        cpus: Some(4),
        clusters: &[],
        boot: BootLoader::External,
        flash_config: None,
    },
    Board {
        model: "generic",
        description: "any Linux machine; board.cpus gives the CPU count",
        arch: "any",
        cpus: None,
        clusters: &[],
        boot: BootLoader::External,
        flash_config: None,
    },
];

/// Looks a model up by its `robot.yaml` name.
pub fn find(model: &str) -> Option<&'static Board> {
    BOARDS.iter().find(|b| b.model == model)
}

/// The names accepted in `board.model`, for error messages.
pub fn model_names() -> Vec<&'static str> {
    BOARDS.iter().map(|b| b.model).collect()
}

impl Board {
    /// The clusters as CPU sets; one cluster of `0..cpus` when the table
    /// has none.
    pub fn cluster_sets(&self, cpus: u32) -> Vec<CpuSet> {
        if self.clusters.is_empty() {
            return vec![CpuSet::first(cpus)];
        }
        self.clusters
            .iter()
            .map(|c| CpuSet::parse_list(c).expect("board table holds valid CPU lists"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for b in BOARDS {
            if let Some(n) = b.cpus {
                let all = CpuSet::first(n);
                let mut seen = CpuSet::new();
                for c in b.cluster_sets(n) {
                    assert!(
                        c.is_subset(&all),
                        "{}: cluster {c} beyond {n} CPUs",
                        b.model
                    );
                    assert!(c.is_disjoint(&seen), "{}: clusters overlap", b.model);
                    seen = seen.union(&c);
                }
                assert_eq!(seen, all, "{}: clusters do not cover every CPU", b.model);
            }
        }
        assert_eq!(find("jetson-orin-nano").unwrap().cpus, Some(6));
        assert!(find("jetson-orin").is_none());
    }
}
