//! The table of boards rtdeploy knows: CPU count, CPU clusters (CPUs that
//! share an L2/L3 and a clock), architecture, how the board boots and, for
//! Jetson modules, what flashing needs to know of the module.

use serde::Serialize;

use units::cpu::CpuSet;

/// How the kernel command line reaches the kernel on this board.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootLoader {
    /// Jetson Linux: `/boot/extlinux/extlinux.conf`, `APPEND` line.
    Extlinux,
    /// The command line is given by whoever starts the kernel (QEMU's
    /// `-append`, a PC boot loader); rtdeploy writes it to
    /// `/etc/rtdeploy/cmdline`.
    External,
}

/// Where a Jetson's root filesystem can go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Storage {
    /// An NVMe drive on the carrier's M.2 slot.
    Nvme,
    /// A USB drive.
    Usb,
    /// The module's own eMMC.
    Emmc,
    /// The module's microSD slot.
    Sd,
}

impl Storage {
    pub const ALL: [Storage; 4] = [Storage::Nvme, Storage::Usb, Storage::Emmc, Storage::Sd];

    /// The name `--storage` takes.
    pub fn name(self) -> &'static str {
        match self {
            Storage::Nvme => "nvme",
            Storage::Usb => "usb",
            Storage::Emmc => "emmc",
            Storage::Sd => "sd",
        }
    }
}

impl std::fmt::Display for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--storage` value that names no storage.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StorageParseError {
    #[error("unknown storage `{0}` (expected nvme, usb, emmc or sd)")]
    Unknown(String),
}

impl std::str::FromStr for Storage {
    type Err = StorageParseError;
    fn from_str(s: &str) -> Result<Self, StorageParseError> {
        Storage::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| StorageParseError::Unknown(s.to_string()))
    }
}

/// A carrier board a Jetson module is flashed on. Jetson Linux names its
/// flash configurations after the carrier and the module
/// (`p3768-0000+p3767-0000`); the developer kits' carriers are the ones
/// rtdeploy knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Carrier {
    /// P3768, the Jetson Orin Nano Developer Kit's carrier; takes every
    /// P3767 module (Orin Nano and Orin NX).
    P3768,
    /// P3509, the Jetson Xavier NX Developer Kit's carrier, which also takes
    /// P3767 modules.
    P3509,
    /// P3737, the Jetson AGX Orin Developer Kit's carrier (P3701 modules).
    P3737,
}

impl Carrier {
    pub const ALL: [Carrier; 3] = [Carrier::P3768, Carrier::P3509, Carrier::P3737];

    /// The name `--carrier` takes.
    pub fn name(self) -> &'static str {
        match self {
            Carrier::P3768 => "p3768",
            Carrier::P3509 => "p3509",
            Carrier::P3737 => "p3737",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Carrier::P3768 => "Jetson Orin Nano Developer Kit carrier",
            Carrier::P3509 => "Jetson Xavier NX Developer Kit carrier",
            Carrier::P3737 => "Jetson AGX Orin Developer Kit carrier",
        }
    }
}

impl std::fmt::Display for Carrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--carrier` value that names no carrier rtdeploy knows.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CarrierParseError {
    #[error("unknown carrier `{0}` (expected p3768, p3509 or p3737)")]
    Unknown(String),
}

impl std::str::FromStr for Carrier {
    type Err = CarrierParseError;
    fn from_str(s: &str) -> Result<Self, CarrierParseError> {
        let lower = s.to_ascii_lowercase();
        Carrier::ALL
            .into_iter()
            .find(|c| c.name() == lower)
            .ok_or_else(|| CarrierParseError::Unknown(s.to_string()))
    }
}

/// What flashing needs to know of a Jetson module.
#[derive(Debug, Clone, Serialize)]
pub struct JetsonModule {
    /// NVIDIA's part numbers of the modules the board model covers.
    pub parts: &'static [&'static str],
    /// Where its root filesystem can go, in the order `--storage` lists
    /// them.
    pub storage: &'static [Storage],
    /// The carriers it is flashed on; the first is NVIDIA's developer kit
    /// carrier for the module, the default.
    pub carriers: &'static [Carrier],
}

impl JetsonModule {
    /// The carrier flashing assumes when none is named.
    pub fn devkit_carrier(&self) -> Carrier {
        self.carriers[0]
    }
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
    /// Memory of the smallest module the model covers, bytes (`None`:
    /// `board.memory` may say it).
    pub memory: Option<u64>,
    /// Clusters as CPU lists; empty when unknown (one cluster of all CPUs).
    pub clusters: &'static [&'static str],
    pub boot: BootLoader,
    /// The Jetson module, for boards that run Jetson Linux and are flashed
    /// with its tools; `None` for the others.
    pub flash_config: Option<JetsonModule>,
}

// Jetson modules, as NVIDIA's Jetson Linux (L4T) sources and documents
// describe them:
// - P3767 SKUs (0000 Orin NX 16GB, 0001 Orin NX 8GB, 0003 Orin Nano 8GB,
//   0004 Orin Nano 4GB, 0005 Orin Nano 8GB of the developer kit) and P3701
//   SKUs (0004 AGX Orin 32GB, 0005 AGX Orin 64GB): the board table of
//   `tools/kernel_flash/README_initrd_flash.txt` in Jetson Linux R36.2
//   (Jetson_Linux_R36.2.0_aarch64.tbz2; public copy:
//   https://github.com/johnnynunez/Linux_for_Tegra, same path).
// - P3701-0000, the AGX Orin developer kit's own module, has the 64GB
//   module's CPUs: https://docs.nvidia.com/jetson/archives/r38.2/DeveloperGuide/SD/EmulationSupport.html
//   ("provides complete performance similar to the Jetson AGX Orin 64GB
//   module").
// - CPU counts: AGX Orin 32GB 8 cores, 64GB 12 cores; Orin NX 16GB 8, Orin
//   NX 8GB and Orin Nano 6. Not read on an NVIDIA page here (NVIDIA's module
//   data sheets say so; quoted from NVIDIA's documentation in
//   https://github.com/apache/tvm/pull/16231). The clusters are the Orin's
//   4-core clusters, inferred from the count.
// - Memory: the module names say it (Orin Nano 4GB/8GB: the smaller).
// - Storage: the AGX Orin devkit configuration
//   (`p3737-0000+p3701-0000.conf`, R35.3.1 and R36.2) writes the rootfs with
//   `flash_t234_qspi_sdmmc.xml`, QSPI plus the module's eMMC
//   (`sdmmc_user`); the P3767 configuration (`p3768-0000+p3767-0000.conf`)
//   with `flash_t234_qspi_sd.xml`, QSPI plus an SD card: P3767 modules have
//   no eMMC, and only the developer kit's module (P3767-0005) has a microSD
//   slot. NVMe and USB drives are flashed with `l4t_initrd_flash.sh`
//   (README_initrd_flash.txt, "Workflow 3"). The AGX Orin developer kit's
//   carrier also has a microSD slot; NVIDIA documents no rootfs on it, so
//   `sd` is not offered there.
// - Carriers: Jetson Linux's P3767 configurations exist for the P3768 and
//   P3509 carriers (`p3768-0000+p3767-0000.conf`,
//   `p3509-a02+p3767-0000.conf`), the P3701 ones for P3737.

const P3767_CARRIERS: &[Carrier] = &[Carrier::P3768, Carrier::P3509];

pub const BOARDS: &[Board] = &[
    Board {
        model: "jetson-orin-nano",
        description: "NVIDIA Jetson Orin Nano 4GB/8GB (6x Cortex-A78AE)",
        arch: "aarch64",
        cpus: Some(6),
        memory: Some(4 << 30),
        clusters: &["0-3", "4-5"],
        boot: BootLoader::Extlinux,
        flash_config: Some(JetsonModule {
            parts: &["P3767-0003", "P3767-0004", "P3767-0005"],
            // sd: the developer kit's module (P3767-0005) only.
            storage: &[Storage::Nvme, Storage::Usb, Storage::Sd],
            carriers: P3767_CARRIERS,
        }),
    },
    Board {
        model: "jetson-orin-nx-8",
        description: "NVIDIA Jetson Orin NX 8GB (6x Cortex-A78AE)",
        arch: "aarch64",
        cpus: Some(6),
        memory: Some(8 << 30),
        clusters: &["0-3", "4-5"],
        boot: BootLoader::Extlinux,
        flash_config: Some(JetsonModule {
            parts: &["P3767-0001"],
            storage: &[Storage::Nvme, Storage::Usb],
            carriers: P3767_CARRIERS,
        }),
    },
    Board {
        model: "jetson-orin-nx-16",
        description: "NVIDIA Jetson Orin NX 16GB (8x Cortex-A78AE)",
        arch: "aarch64",
        cpus: Some(8),
        memory: Some(16 << 30),
        clusters: &["0-3", "4-7"],
        boot: BootLoader::Extlinux,
        flash_config: Some(JetsonModule {
            parts: &["P3767-0000"],
            storage: &[Storage::Nvme, Storage::Usb],
            carriers: P3767_CARRIERS,
        }),
    },
    Board {
        model: "jetson-agx-orin-32",
        description: "NVIDIA Jetson AGX Orin 32GB (8x Cortex-A78AE)",
        arch: "aarch64",
        cpus: Some(8),
        memory: Some(32 << 30),
        clusters: &["0-3", "4-7"],
        boot: BootLoader::Extlinux,
        flash_config: Some(JetsonModule {
            parts: &["P3701-0004"],
            storage: &[Storage::Emmc, Storage::Nvme, Storage::Usb],
            carriers: &[Carrier::P3737],
        }),
    },
    Board {
        model: "jetson-agx-orin-64",
        description:
            "NVIDIA Jetson AGX Orin 64GB, or the AGX Orin developer kit's module (12x Cortex-A78AE)",
        arch: "aarch64",
        cpus: Some(12),
        memory: Some(64 << 30),
        clusters: &["0-3", "4-7", "8-11"],
        boot: BootLoader::Extlinux,
        flash_config: Some(JetsonModule {
            parts: &["P3701-0005", "P3701-0000"],
            storage: &[Storage::Emmc, Storage::Nvme, Storage::Usb],
            carriers: &[Carrier::P3737],
        }),
    },
    Board {
        model: "qemu-x86_64",
        description: "QEMU x86_64 virtual machine (-smp sets the CPU count, 4 by default)",
        arch: "x86_64",
        cpus: Some(4),
        memory: None,
        clusters: &[],
        boot: BootLoader::External,
        flash_config: None,
    },
    Board {
        model: "qemu-aarch64",
        description: "QEMU aarch64 virt machine booted by U-Boot from /boot/extlinux/extlinux.conf (-smp sets the CPU count, 4 by default)",
        arch: "aarch64",
        cpus: Some(4),
        memory: None,
        clusters: &[],
        boot: BootLoader::Extlinux,
        flash_config: None,
    },
    Board {
        model: "generic",
        description: "any Linux machine; board.cpus gives the CPU count",
        arch: "any",
        cpus: None,
        memory: None,
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

    /// Whether `board.cpus` may set the CPU count: `generic` needs it, a
    /// QEMU machine follows `-smp`; a real board's count is fixed.
    pub fn takes_cpu_count(&self) -> bool {
        self.model == "generic" || self.model.starts_with("qemu-")
    }

    /// The storage the board's module has, empty for boards that are not
    /// flashed.
    pub fn storage(&self) -> &'static [Storage] {
        self.flash_config.as_ref().map_or(&[], |m| m.storage)
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
            if let Some(m) = &b.flash_config {
                assert!(!m.parts.is_empty() && !m.storage.is_empty(), "{}", b.model);
                assert!(!m.carriers.is_empty(), "{}", b.model);
            }
        }
        assert_eq!(find("jetson-orin-nano").unwrap().cpus, Some(6));
        assert!(find("jetson-orin").is_none());
    }

    /// CPU counts and storage as NVIDIA gives them (see the comment above
    /// the table), written out here rather than read from it.
    #[test]
    fn jetson_modules_as_nvidia_describes_them() {
        let cpus = |m: &str| find(m).unwrap().cpus.unwrap();
        assert_eq!(cpus("jetson-agx-orin-32"), 8);
        assert_eq!(cpus("jetson-agx-orin-64"), 12);
        assert_eq!(cpus("jetson-orin-nx-16"), 8);
        assert_eq!(cpus("jetson-orin-nx-8"), 6);
        assert_eq!(cpus("jetson-orin-nano"), 6);
        assert!(find("jetson-agx-orin").is_none(), "one name per module");

        let has = |m: &str, s: Storage| find(m).unwrap().storage().contains(&s);
        for m in ["jetson-orin-nano", "jetson-orin-nx-8", "jetson-orin-nx-16"] {
            assert!(!has(m, Storage::Emmc), "{m}: P3767 modules have no eMMC");
            assert!(has(m, Storage::Nvme), "{m}");
        }
        for m in ["jetson-agx-orin-32", "jetson-agx-orin-64"] {
            assert!(has(m, Storage::Emmc), "{m}: P3701 modules have eMMC");
        }
        assert!(has("jetson-orin-nano", Storage::Sd));
        assert!(!has("jetson-orin-nx-16", Storage::Sd));
        assert!(find("qemu-x86_64").unwrap().storage().is_empty());

        // The QEMU machines follow -smp; the aarch64 one boots as a Jetson
        // does, from extlinux.conf, but is never flashed.
        let q = find("qemu-aarch64").unwrap();
        assert_eq!((q.arch, q.boot), ("aarch64", BootLoader::Extlinux));
        assert!(q.flash_config.is_none() && q.takes_cpu_count());
        assert!(find("qemu-x86_64").unwrap().takes_cpu_count());
        assert!(!find("jetson-orin-nano").unwrap().takes_cpu_count());

        let devkit = |m: &str| {
            find(m)
                .unwrap()
                .flash_config
                .as_ref()
                .unwrap()
                .devkit_carrier()
        };
        assert_eq!(devkit("jetson-orin-nx-16"), Carrier::P3768);
        assert_eq!(devkit("jetson-agx-orin-32"), Carrier::P3737);
    }

    #[test]
    fn names_parse() {
        assert_eq!("emmc".parse::<Storage>(), Ok(Storage::Emmc));
        assert!("ufs".parse::<Storage>().is_err());
        assert_eq!("P3509".parse::<Carrier>(), Ok(Carrier::P3509));
        assert!("p3710".parse::<Carrier>().is_err());
    }
}
