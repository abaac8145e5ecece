//! `deploy flash`: the Jetson Linux flashing commands for an image, as a
//! plan that can be printed (`--dry-run`) or run.
//!
//! Jetson Linux's scripts build the system image from
//! `Linux_for_Tegra/rootfs/`, so the plan is: unpack the image there (as
//! root, numeric owners, modes and device nodes kept), then run `flash.sh`
//! (the module's eMMC, or the SD card of the Orin Nano developer kit's
//! module) or `tools/kernel_flash/l4t_initrd_flash.sh` (NVMe and USB
//! drives) with the flash configuration of the carrier and the L4T
//! release. The board must be in recovery mode and connected over USB.
//!
//! What the plan checks before anything is written: the storage is one the
//! module has, the carrier takes the module, the L4T release is known (from
//! `kernel.l4t` in robot.yaml or `nv_tegra/bsp_version` in the L4T
//! directory, and the two agree when both are there), the L4T directory
//! holds that release's flash configuration, `rootfs/` holds only Jetson
//! Linux's README, and the image went through NVIDIA's `apply_binaries.sh`.
//!
//! Sources (Jetson Linux's own files are in every release's
//! `Jetson_Linux_R<version>_aarch64.tbz2`; public copies of R35.3.1 and
//! R36.2.0: https://github.com/Seeed-Studio/Linux_for_Tegra (branch
//! `r35.3.1`) and https://github.com/johnnynunez/Linux_for_Tegra):
//! - flash configurations: the `.conf` files at the top of the L4T
//!   directory. `jetson-orin-nano-devkit.conf` links to the P3768 carrier's
//!   P3767 configuration on R35 and R36, and its board table
//!   (`tools/kernel_flash/README_initrd_flash.txt`, R36.2) lists Orin NX
//!   16GB and 8GB and Orin Nano under `jetson-orin-nano-devkit`;
//!   `jetson-agx-orin-devkit.conf` links to `p3737-0000+p3701-0000.conf`;
//!   the Xavier NX carrier's (P3509) P3767 configuration is
//!   `p3509-a02+p3767-0000.conf` on R35.3.1 and `p3509-a02-p3767-0000.conf`
//!   on R36.2.
//! - the QSPI-only layout: `bootloader/t186ref/cfg/flash_t234_qspi.xml` on
//!   R35, `bootloader/generic/cfg/flash_t234_qspi.xml` on R36 (both trees,
//!   and README_initrd_flash.txt "Workflow 4" of each).
//! - NVMe on Orin NX/Nano, R35: NVIDIA's Quick Start,
//!   https://docs.nvidia.com/jetson/archives/r35.5.0/DeveloperGuide/IN/QuickStart.html
//!   (`-c tools/kernel_flash/flash_l4t_external.xml -p "-c
//!   bootloader/t186ref/cfg/flash_t234_qspi.xml" --showlogs --network usb0
//!   jetson-orin-nano-devkit internal`, as quoted on
//!   https://forums.developer.nvidia.com/t/cli-equivalent-to-sdkmanager-usage-for-flashing-a-jetson-orin-nx/289638/3).
//!   R36: the same command with `tools/kernel_flash/flash_l4t_t234_nvme.xml`
//!   and the `generic` QSPI layout, as the R36 Quick Start
//!   (https://docs.nvidia.com/jetson/archives/r36.4.3/DeveloperGuide/IN/QuickStart.html)
//!   gives it; that page's text could not be read here, the command is
//!   taken from carrier vendors' copies of it and both files exist in R36.2.
//!   USB drives: the same with `--external-device sda1` and
//!   `flash_l4t_external.xml` (present in R35 and R36; not read on an
//!   NVIDIA page for these modules).
//! - NVMe and USB on AGX Orin (which has eMMC): README_initrd_flash.txt
//!   "Workflow 3" (R35.3.1 and R36.2): `ADDITIONAL_DTB_OVERLAY_OPT=
//!   BootOrderNvme.dtbo` (`BootOrderUsb.dtbo`) so UEFI boots the drive
//!   first, `-c tools/kernel_flash/flash_l4t_external.xml`, and `external`,
//!   which leaves a minimal root filesystem on the eMMC.
//! - eMMC and SD: `flash.sh <config> internal`; the AGX Orin configuration's
//!   default layout is `flash_t234_qspi_sdmmc.xml` (QSPI and eMMC), the
//!   P3768/P3767 one's `flash_t234_qspi_sd.xml` (QSPI and SD card).
//! - the release: `flash.sh` reads `nv_tegra/bsp_version` (`BSP_BRANCH=36`,
//!   `BSP_MAJOR=2`, `BSP_MINOR=0` for R36.2.0) for its "L4T BSP
//!   Information" banner.
//! - `apply_binaries.sh` (`nv_tegra/nv-apply-debs.sh`) installs NVIDIA's
//!   packages into `rootfs/`, `nvidia-l4t-core` first; that package carries
//!   `/etc/nv_tegra_release` (OE4T's
//!   https://github.com/OE4T/meta-tegra/blob/master/recipes-bsp/tegra-binaries/nv-tegra-release_38.2.1.bb
//!   takes it from there); the sample root filesystem is Ubuntu's packages
//!   alone and lacks it.
//! - rootfs A/B (`--rootfs-ab`): `ROOTFS_AB=1` in the environment of the
//!   flashing script. The module's configuration then halves the root
//!   filesystem's size and sets `rootfs_ab=1` (`p3701.conf.common`, AGX
//!   Orin, in R35.3.1 and R36.2; `p3767.conf.common`, Orin NX and Nano,
//!   in R36.2 but not in R35.3.1: the plan reads the file of the L4T
//!   directory it is given and refuses when it does not handle
//!   `ROOTFS_AB`), and `flash.sh` writes `RootfsRedundancyLevel` = 1 and,
//!   with `ROOTFS_RETRY_COUNT_MAX` set from 1 to 3 (other values are
//!   silently ignored there, so they are refused here), `RootfsRetryCountMax`
//!   into `bootloader/L4TConfiguration.dtbo` as runtime-locked UEFI
//!   variables (`process_l4t_conf_dtbo` in `flash.sh`, R35.3.1 and R36.2).
//!   The slots' partitions: on the AGX Orin's eMMC its configuration
//!   switches to `flash_t234_qspi_sdmmc_rootfs_ab.xml` (`APP`, `APP_b`;
//!   `p3737-0000+p3701-0000.conf` R35.3.1, `p3737-0000-p3701-0000.conf.common`
//!   R36.2); on an external drive the layout is
//!   `tools/kernel_flash/flash_l4t_nvme_rootfs_ab.xml` in R35.3.1 and
//!   `flash_l4t_t234_nvme_rootfs_ab.xml` in R36.2 (of which R36.2's
//!   `flash_l4t_nvme_rootfs_ab.xml` is a link), as `README_initrd_flash.txt`
//!   "Workflow 5" gives the command (`ROOTFS_AB=1 ... -c <layout> ...
//!   external`). The Orin Nano developer kit's SD card is refused: R36.2's
//!   `p3768-0000-p3767-0000-a0.conf` keeps `flash_t234_qspi_sd.xml`, which
//!   has no `APP_b`, whatever `ROOTFS_AB` says.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use cpusets::board::Board;
pub use cpusets::board::{Carrier, CarrierParseError, Storage, StorageParseError};
use cpusets::config::L4tRelease;
use serde::Serialize;

/// The file of the L4T directory that names its release.
pub const BSP_VERSION: &str = "nv_tegra/bsp_version";

/// The file `apply_binaries.sh` adds to the root filesystem (from the
/// `nvidia-l4t-core` package); an image without it was built from the
/// bare sample root filesystem.
pub const APPLIED_MARKER: &str = "etc/nv_tegra_release";

/// Why a flash plan could not be made or run.
#[derive(Debug, thiserror::Error)]
pub enum FlashPlanError {
    #[error("board `{0}` has no Jetson Linux flash configuration (only Jetson boards are flashed; boot other boards from the image directly)")]
    NotFlashable(String),
    #[error("board `{board}` has no {storage} storage (it has {}); nothing was written", has.iter().map(|s| s.name()).collect::<Vec<_>>().join(", "))]
    NoSuchStorage {
        board: String,
        storage: Storage,
        has: Vec<Storage>,
    },
    #[error("board `{board}` does not fit the {carrier} carrier (it fits {})", fits.iter().map(|c| c.name()).collect::<Vec<_>>().join(", "))]
    CarrierMismatch {
        board: String,
        carrier: Carrier,
        fits: Vec<Carrier>,
    },
    #[error("flashing the SD card is known for the {} only (the {carrier} is not); nothing was written", Carrier::P3768.description())]
    SdCarrier { carrier: Carrier },
    #[error("cannot tell the Jetson Linux release: robot.yaml has no `kernel.l4t` and {} has no {BSP_VERSION} (set `kernel.l4t`, e.g. `36.4.3`)", l4t.display())]
    UnknownRelease { l4t: PathBuf },
    #[error("cannot read {}: {reason}", path.display())]
    BadBspVersion { path: PathBuf, reason: String },
    #[error("robot.yaml's `kernel.l4t` is {yaml} but {} says {dir}; flash with the Jetson Linux release robot.yaml names, or change `kernel.l4t`", path.display())]
    ReleaseMismatch {
        yaml: L4tRelease,
        dir: L4tRelease,
        path: PathBuf,
    },
    #[error("L4T {0} has no flash configuration in rtdeploy (expected R35, JetPack 5, or R36, JetPack 6)")]
    UnsupportedRelease(L4tRelease),
    #[error("{} is not a Jetson Linux {release} directory (no {missing})", dir.display())]
    NotL4t {
        dir: PathBuf,
        release: String,
        missing: String,
    },
    #[error("cannot read image {}", path.display())]
    Image {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("image {} is not a tar or tar.zst image (flash unpacks the image into Linux_for_Tegra/rootfs; build one with --format tar.zst)", path.display())]
    NotTar { path: PathBuf },
    #[error("image {} has no /{APPLIED_MARKER}: it was built from Jetson Linux's bare sample root filesystem; run `sudo ./apply_binaries.sh` in Linux_for_Tegra on the sample root filesystem first and build the image from that (running it after unpacking the image would replace the image's /boot/extlinux/extlinux.conf and its planned command line)", path.display())]
    NotApplied { path: PathBuf },
    #[error("{} is not empty (holds {}); move it aside so the image is flashed alone", dir.display(), first)]
    RootfsNotEmpty { dir: PathBuf, first: String },
    #[error("rootfs A/B cannot be flashed on the {board}'s {storage} with Jetson Linux {release}: {reason}; nothing was written")]
    AbUnsupported {
        board: String,
        storage: Storage,
        release: String,
        reason: String,
    },
    #[error("--retry-count {0}: Jetson Linux's flash.sh takes a rootfs retry count from 1 to 3 (RootfsRetryCountMax, two bits a slot) and ignores any other")]
    BadRetryCount(u8),
    #[error("flashing needs root (the scripts write device nodes and talk to the board over USB); run it with sudo, or use --dry-run")]
    NotRoot,
    #[error("step `{step}` failed: {status}")]
    StepFailed { step: String, status: String },
}

/// One command of the plan.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub why: String,
    pub cwd: PathBuf,
    /// Environment variables set for the command.
    pub env: Vec<(String, String)>,
    pub program: String,
    pub args: Vec<String>,
}

impl Step {
    /// The command as a shell line.
    pub fn shell(&self) -> String {
        self.env
            .iter()
            .map(|(k, v)| format!("{k}={}", quote(v)))
            .chain(
                std::iter::once(&self.program)
                    .chain(&self.args)
                    .map(|a| quote(a)),
            )
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn quote(a: &str) -> String {
    if !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=+:,@".contains(c))
    {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

/// Where the plan's L4T release was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReleaseSource {
    /// `kernel.l4t` in robot.yaml.
    RobotYaml,
    /// `nv_tegra/bsp_version` in the L4T directory.
    BspVersion,
    /// Both, and they agree.
    Both,
}

/// Rootfs A/B, asked for at flash time: two root filesystem slots that
/// L4TLauncher boots in turn when one fails (see the module documentation
/// and `releases::l4t_slots`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct RootfsAb {
    /// `ROOTFS_RETRY_COUNT_MAX`: boots of a slot that may fail before the
    /// other one boots (1 to 3); `None`: the firmware's default.
    pub retry_count_max: Option<u8>,
}

/// The commands that flash an image onto a board from a Jetson Linux
/// directory.
#[derive(Debug, Clone, Serialize)]
pub struct FlashPlan {
    pub board: &'static str,
    pub carrier: Carrier,
    /// The L4T release, like `R36.4.3`.
    pub release: String,
    pub release_source: ReleaseSource,
    /// The flash configuration (`<config>.conf` in the L4T directory).
    pub config: &'static str,
    pub storage: Storage,
    /// Rootfs A/B provisioned, and the partition layout that holds the
    /// two slots.
    pub rootfs_ab: Option<AbPlan>,
    pub steps: Vec<Step>,
}

/// How rootfs A/B is flashed.
#[derive(Debug, Clone, Serialize)]
pub struct AbPlan {
    pub retry_count_max: Option<u8>,
    /// The layout file with `APP` and `APP_b`, relative to the L4T
    /// directory.
    pub layout: String,
}

impl fmt::Display for FlashPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "# flash {} on the {} ({}) with Jetson Linux {}, configuration {}, root filesystem on {}",
            self.board,
            self.carrier,
            self.carrier.description(),
            self.release,
            self.config,
            self.storage
        )?;
        if let Some(ab) = &self.rootfs_ab {
            writeln!(
                f,
                "# rootfs A/B: slots APP and APP_b ({}), retry count {}",
                ab.layout,
                ab.retry_count_max
                    .map_or("the firmware's default".to_string(), |n| n.to_string())
            )?;
        }
        writeln!(
            f,
            "# as root, with the board in recovery mode and connected over USB"
        )?;
        for s in &self.steps {
            writeln!(f, "# {}", s.why)?;
            writeln!(
                f,
                "(cd {} && {})",
                quote(&s.cwd.display().to_string()),
                s.shell()
            )?;
        }
        Ok(())
    }
}

/// The flash configuration for a carrier and an L4T major release.
pub fn flash_config(carrier: Carrier, release: L4tRelease) -> Option<&'static str> {
    Some(match (carrier, release.major) {
        (Carrier::P3768, 35 | 36) => "jetson-orin-nano-devkit",
        (Carrier::P3509, 35) => "p3509-a02+p3767-0000",
        (Carrier::P3509, 36) => "p3509-a02-p3767-0000",
        (Carrier::P3737, 35 | 36) => "jetson-agx-orin-devkit",
        _ => return None,
    })
}

/// The files that moved between releases: the QSPI-only partition layout
/// (`l4t_initrd_flash.sh -p "-c ..."`) and the NVMe drive's layout.
fn release_files(release: L4tRelease) -> Option<(&'static str, &'static str)> {
    match release.major {
        35 => Some((
            "bootloader/t186ref/cfg/flash_t234_qspi.xml",
            "tools/kernel_flash/flash_l4t_external.xml",
        )),
        36 => Some((
            "bootloader/generic/cfg/flash_t234_qspi.xml",
            "tools/kernel_flash/flash_l4t_t234_nvme.xml",
        )),
        _ => None,
    }
}

/// Reads `nv_tegra/bsp_version` of an L4T directory: `None` when the file
/// is not there.
pub fn bsp_version(l4t: &Path) -> Result<Option<L4tRelease>, FlashPlanError> {
    let path = l4t.join(BSP_VERSION);
    // units::bounded: one line of a few bytes, a FIFO refused.
    let text = match units::bounded::Bound::regular(4096)
        .following_links()
        .read_text(&path)
    {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => {
            return Err(FlashPlanError::BadBspVersion {
                path,
                reason: e.into_io().to_string(),
            })
        }
    };
    let field = |name: &str| -> Result<u32, FlashPlanError> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix(name)?.strip_prefix('='))
            .map(|v| v.trim().trim_matches('"'))
            .next()
            .ok_or_else(|| format!("no {name}= line"))
            .and_then(|v| {
                v.parse::<u32>()
                    .map_err(|_| format!("{name}={v} is not a number"))
            })
            .map_err(|reason| FlashPlanError::BadBspVersion {
                path: path.clone(),
                reason,
            })
    };
    Ok(Some(L4tRelease {
        major: field("BSP_BRANCH")?,
        minor: field("BSP_MAJOR")?,
        revision: field("BSP_MINOR")?,
    }))
}

/// The release to flash with: robot.yaml's and the L4T directory's, which
/// must agree when both are known.
fn release(
    yaml: Option<L4tRelease>,
    l4t: &Path,
) -> Result<(L4tRelease, ReleaseSource), FlashPlanError> {
    match (yaml, bsp_version(l4t)?) {
        (Some(y), Some(d)) if y != d => Err(FlashPlanError::ReleaseMismatch {
            yaml: y,
            dir: d,
            path: l4t.join(BSP_VERSION),
        }),
        (Some(y), Some(_)) => Ok((y, ReleaseSource::Both)),
        (Some(y), None) => Ok((y, ReleaseSource::RobotYaml)),
        (None, Some(d)) => Ok((d, ReleaseSource::BspVersion)),
        (None, None) => Err(FlashPlanError::UnknownRelease {
            l4t: l4t.to_path_buf(),
        }),
    }
}

/// Tells a tar or tar.zst image from the others by its first bytes.
fn image_kind(path: &Path) -> Result<Option<bool>, FlashPlanError> {
    use std::io::Read;
    // Its first block: a zstd frame's magic or a tar header's `ustar`.
    let head = crate::entry::open_input(path, true)
        .and_then(|f| {
            units::bounded::read_at_most(&mut f.take(512), path, 512)
                .map_err(units::bounded::FileReadError::into_io)
        })
        .map_err(|source| FlashPlanError::Image {
            path: path.to_path_buf(),
            source,
        })?;
    if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Ok(Some(true))
    } else if head.len() >= 262 && &head[257..262] == b"ustar" {
        Ok(Some(false))
    } else {
        Ok(None)
    }
}

/// Whether the tar (or tar.zst) image holds `name`; reads headers until it
/// is found.
fn image_has(path: &Path, zst: bool, name: &str) -> Result<bool, FlashPlanError> {
    let io = |source| FlashPlanError::Image {
        path: path.to_path_buf(),
        source,
    };
    let file = crate::entry::open_input(path, true).map_err(io)?;
    let reader: Box<dyn std::io::Read> = if zst {
        Box::new(zstd::stream::read::Decoder::new(file).map_err(io)?)
    } else {
        Box::new(std::io::BufReader::new(file))
    };
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(io)? {
        let entry = entry.map_err(io)?;
        let p = entry.path().map_err(io)?;
        let p = p.to_string_lossy();
        if p.trim_start_matches("./").trim_start_matches('/') == name {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Makes the plan for flashing `image` onto `board` on `carrier` (the
/// module's developer kit carrier when `None`) with the L4T directory
/// `l4t`; `yaml_release` is robot.yaml's `kernel.l4t`. Reads the L4T
/// directory and the image, writes nothing.
///
/// An image built from the bare sample root filesystem is refused rather
/// than fixed by adding `sudo ./apply_binaries.sh` to the plan: the script
/// installs `bootloader/extlinux.conf` over the image's
/// `/boot/extlinux/extlinux.conf` (which carries the planned command line)
/// and adds NVIDIA's packages after the image's manifest was written, so
/// the board would run neither the command line nor the files the image
/// records. Running it once on the sample root filesystem, before `deploy
/// image`, keeps both.
pub fn plan(
    board: &Board,
    image: &Path,
    l4t: &Path,
    storage: Storage,
    carrier: Option<Carrier>,
    yaml_release: Option<L4tRelease>,
    ab: Option<RootfsAb>,
) -> Result<FlashPlan, FlashPlanError> {
    let module = board
        .flash_config
        .as_ref()
        .ok_or_else(|| FlashPlanError::NotFlashable(board.model.to_string()))?;
    if !module.storage.contains(&storage) {
        return Err(FlashPlanError::NoSuchStorage {
            board: board.model.to_string(),
            storage,
            has: module.storage.to_vec(),
        });
    }
    let carrier = carrier.unwrap_or_else(|| module.devkit_carrier());
    if !module.carriers.contains(&carrier) {
        return Err(FlashPlanError::CarrierMismatch {
            board: board.model.to_string(),
            carrier,
            fits: module.carriers.to_vec(),
        });
    }
    if storage == Storage::Sd && carrier != Carrier::P3768 {
        return Err(FlashPlanError::SdCarrier { carrier });
    }
    let (release, release_source) = release(yaml_release, l4t)?;
    let (config, (qspi, nvme_layout)) = flash_config(carrier, release)
        .zip(release_files(release))
        .ok_or(FlashPlanError::UnsupportedRelease(release))?;
    let has_emmc = module.storage.contains(&Storage::Emmc);
    let script = match storage {
        Storage::Nvme | Storage::Usb => "tools/kernel_flash/l4t_initrd_flash.sh",
        Storage::Emmc | Storage::Sd => "flash.sh",
    };
    let conf = format!("{config}.conf");
    for need in [script, "rootfs", conf.as_str()] {
        if !l4t.join(need).exists() {
            return Err(FlashPlanError::NotL4t {
                dir: l4t.to_path_buf(),
                release: release.to_string(),
                missing: need.to_string(),
            });
        }
    }
    let ab_plan = match ab {
        Some(ab) => Some(ab_plan(board, module, l4t, storage, release, ab)?),
        None => None,
    };
    let zst = image_kind(image)?.ok_or_else(|| FlashPlanError::NotTar {
        path: image.to_path_buf(),
    })?;
    if !image_has(image, zst, APPLIED_MARKER)? {
        return Err(FlashPlanError::NotApplied {
            path: image.to_path_buf(),
        });
    }
    let rootfs = l4t.join("rootfs");
    if let Ok(rd) = std::fs::read_dir(&rootfs) {
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        if let Some(first) = names.into_iter().find(|n| n != "README.txt") {
            return Err(FlashPlanError::RootfsNotEmpty { dir: rootfs, first });
        }
    }
    let image_abs = std::path::absolute(image).unwrap_or_else(|_| image.to_path_buf());
    let mut steps = vec![Step {
        why: "unpack the image as Jetson Linux's rootfs (numeric owners, modes, device nodes kept)"
            .into(),
        cwd: l4t.to_path_buf(),
        env: Vec::new(),
        program: "tar".into(),
        args: vec![
            "--numeric-owner".into(),
            "--same-permissions".into(),
            "-xf".into(),
            image_abs.display().to_string(),
            "-C".into(),
            "rootfs".into(),
        ],
    }];
    let strs = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (mut env, mut args, why) = match storage {
        Storage::Emmc | Storage::Sd => (
            Vec::new(),
            strs(&[config, "internal"]),
            format!("flash QSPI and the {storage} with flash.sh and {config}"),
        ),
        Storage::Nvme | Storage::Usb if has_emmc => {
            let (dev, overlay) = if storage == Storage::Nvme {
                ("nvme0n1p1", "BootOrderNvme.dtbo")
            } else {
                ("sda1", "BootOrderUsb.dtbo")
            };
            (
                vec![("ADDITIONAL_DTB_OVERLAY_OPT".to_string(), overlay.to_string())],
                strs(&[
                    "--external-device",
                    dev,
                    "-c",
                    "tools/kernel_flash/flash_l4t_external.xml",
                    "--showlogs",
                    config,
                    "external",
                ]),
                format!("flash the {storage} drive (root filesystem, booted first) and a minimal eMMC with l4t_initrd_flash.sh and {config}"),
            )
        }
        Storage::Nvme | Storage::Usb => {
            let (dev, layout) = if storage == Storage::Nvme {
                ("nvme0n1p1", nvme_layout)
            } else {
                ("sda1", "tools/kernel_flash/flash_l4t_external.xml")
            };
            (
                Vec::new(),
                vec![
                    "--external-device".into(),
                    dev.into(),
                    "-c".into(),
                    layout.into(),
                    "-p".into(),
                    format!("-c {qspi}"),
                    "--showlogs".into(),
                    "--network".into(),
                    "usb0".into(),
                    config.into(),
                    "internal".into(),
                ],
                format!("flash QSPI and the {storage} drive with l4t_initrd_flash.sh and {config}"),
            )
        }
    };
    let why = match &ab_plan {
        Some(ab) => {
            env.push(("ROOTFS_AB".into(), "1".into()));
            if let Some(n) = ab.retry_count_max {
                env.push(("ROOTFS_RETRY_COUNT_MAX".into(), n.to_string()));
            }
            if storage != Storage::Emmc {
                // The external drive's layout: the one with both slots.
                if let Some(i) = args.iter().position(|a| a == "-c") {
                    args[i + 1] = ab.layout.clone();
                }
            }
            format!("{why}, rootfs A/B")
        }
        None => why,
    };
    steps.push(Step {
        why,
        cwd: l4t.to_path_buf(),
        env,
        program: format!("./{script}"),
        args,
    });
    Ok(FlashPlan {
        board: board.model,
        carrier,
        release: release.to_string(),
        release_source,
        config,
        storage,
        rootfs_ab: ab_plan,
        steps,
    })
}

/// The most bytes of a module configuration read.
const MAX_CONF: u64 = 1 << 20;

/// Whether and how rootfs A/B can be flashed for this module, storage and
/// release, from the files of the L4T directory (see the module
/// documentation for what each release ships).
fn ab_plan(
    board: &Board,
    module: &cpusets::board::JetsonModule,
    l4t: &Path,
    storage: Storage,
    release: L4tRelease,
    ab: RootfsAb,
) -> Result<AbPlan, FlashPlanError> {
    if let Some(n) = ab.retry_count_max.filter(|n| !(1..=3).contains(n)) {
        return Err(FlashPlanError::BadRetryCount(n));
    }
    let refuse = |reason: String| FlashPlanError::AbUnsupported {
        board: board.model.to_string(),
        storage,
        release: release.to_string(),
        reason,
    };
    let family = module
        .parts
        .first()
        .and_then(|p| p.get(..5))
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| refuse("its module is not known".into()))?;
    let layout = match (storage, release.major) {
        (Storage::Sd, _) => {
            return Err(refuse(
                "the SD card's configuration keeps flash_t234_qspi_sd.xml, which has no APP_b"
                    .into(),
            ))
        }
        (Storage::Emmc, 35) => "bootloader/t186ref/cfg/flash_t234_qspi_sdmmc_rootfs_ab.xml",
        (Storage::Emmc, _) => "bootloader/generic/cfg/flash_t234_qspi_sdmmc_rootfs_ab.xml",
        (Storage::Nvme | Storage::Usb, 35) => "tools/kernel_flash/flash_l4t_nvme_rootfs_ab.xml",
        (Storage::Nvme | Storage::Usb, _) => "tools/kernel_flash/flash_l4t_t234_nvme_rootfs_ab.xml",
    };
    if !l4t.join(layout).is_file() {
        return Err(refuse(format!(
            "{} has no {layout}, the layout with both slots",
            l4t.display()
        )));
    }
    // The module's configuration must act on ROOTFS_AB: R35.3.1's
    // p3767.conf.common does not, and flash.sh would then write one slot
    // and a firmware that believes in two.
    let conf = l4t.join(format!("{family}.conf.common"));
    let text = units::bounded::Bound::regular(MAX_CONF)
        .following_links()
        .read_lossy(&conf)
        .map_err(|e| refuse(format!("cannot read {}: {e}", conf.display())))?;
    let handles = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .any(|l| l.contains("ROOTFS_AB") && l.contains("== 1"));
    if !handles {
        return Err(refuse(format!(
            "{} does not act on ROOTFS_AB (this release flashes one root filesystem on this module)",
            conf.display()
        )));
    }
    Ok(AbPlan {
        retry_count_max: ab.retry_count_max,
        layout: layout.into(),
    })
}

/// Runs the plan's steps in order, stopping at the first failure.
pub fn run(plan: &FlashPlan) -> Result<(), FlashPlanError> {
    if !rustix::process::geteuid().is_root() {
        return Err(FlashPlanError::NotRoot);
    }
    for s in &plan.steps {
        let status = Command::new(&s.program)
            .args(&s.args)
            .envs(s.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&s.cwd)
            .status()
            .map_err(|e| FlashPlanError::StepFailed {
                step: s.shell(),
                status: e.to_string(),
            })?;
        if !status.success() {
            return Err(FlashPlanError::StepFailed {
                step: s.shell(),
                status: status.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const R35: L4tRelease = L4tRelease {
        major: 35,
        minor: 6,
        revision: 0,
    };
    const R36: L4tRelease = L4tRelease {
        major: 36,
        minor: 4,
        revision: 3,
    };

    /// A Linux_for_Tegra directory of `release`: the scripts, the flash
    /// configurations that release ships, an empty rootfs and, when
    /// `bsp` is set, `nv_tegra/bsp_version`.
    fn l4t(release: L4tRelease, bsp: bool) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir_all(p.join("tools/kernel_flash")).unwrap();
        std::fs::create_dir_all(p.join("nv_tegra")).unwrap();
        std::fs::write(p.join("tools/kernel_flash/l4t_initrd_flash.sh"), "").unwrap();
        std::fs::write(p.join("flash.sh"), "").unwrap();
        let p3509 = if release.major == 35 {
            "p3509-a02+p3767-0000.conf"
        } else {
            "p3509-a02-p3767-0000.conf"
        };
        for conf in [
            "jetson-orin-nano-devkit.conf",
            "jetson-agx-orin-devkit.conf",
            p3509,
        ] {
            std::fs::write(p.join(conf), "").unwrap();
        }
        std::fs::create_dir(p.join("rootfs")).unwrap();
        std::fs::write(p.join("rootfs/README.txt"), "").unwrap();
        if bsp {
            // As Jetson Linux ships it (R36.2.0's, with its numbers).
            std::fs::write(
                p.join(BSP_VERSION),
                format!(
                    "# Copyright (c) 2019, NVIDIA CORPORATION.  All rights reserved.\n\nBSP_BRANCH={}\nBSP_MAJOR={}\nBSP_MINOR={}\nBSP_VERSION=\"${{BSP_BRANCH}}.${{BSP_MAJOR}}.${{BSP_MINOR}}\"\n",
                    release.major, release.minor, release.revision
                ),
            )
            .unwrap();
        }
        d
    }

    /// A tar image holding `names` (directories end in `/`).
    fn tar_image(dir: &Path, names: &[&str]) -> PathBuf {
        let p = dir.join("img.tar");
        let mut b = tar::Builder::new(Vec::new());
        for n in names {
            let mut h = tar::Header::new_gnu();
            h.set_size(0);
            h.set_mode(0o755);
            h.set_entry_type(if n.ends_with('/') {
                tar::EntryType::Directory
            } else {
                tar::EntryType::Regular
            });
            b.append_data(&mut h, n, std::io::empty()).unwrap();
        }
        std::fs::write(&p, b.into_inner().unwrap()).unwrap();
        p
    }

    fn applied(dir: &Path) -> PathBuf {
        tar_image(dir, &["./", "./etc/", "./etc/nv_tegra_release", "./usr/"])
    }

    fn board(m: &str) -> &'static Board {
        cpusets::board::find(m).unwrap()
    }

    /// The flash command for each board, release and storage the module
    /// has, written out from NVIDIA's documents (see the module
    /// documentation), not from the code's tables.
    #[test]
    fn flash_command_per_board_release_and_storage() {
        let nvme_r35 = "./tools/kernel_flash/l4t_initrd_flash.sh --external-device nvme0n1p1 -c tools/kernel_flash/flash_l4t_external.xml -p '-c bootloader/t186ref/cfg/flash_t234_qspi.xml' --showlogs --network usb0";
        let usb_r35 = "./tools/kernel_flash/l4t_initrd_flash.sh --external-device sda1 -c tools/kernel_flash/flash_l4t_external.xml -p '-c bootloader/t186ref/cfg/flash_t234_qspi.xml' --showlogs --network usb0";
        let nvme_r36 = "./tools/kernel_flash/l4t_initrd_flash.sh --external-device nvme0n1p1 -c tools/kernel_flash/flash_l4t_t234_nvme.xml -p '-c bootloader/generic/cfg/flash_t234_qspi.xml' --showlogs --network usb0";
        let usb_r36 = "./tools/kernel_flash/l4t_initrd_flash.sh --external-device sda1 -c tools/kernel_flash/flash_l4t_external.xml -p '-c bootloader/generic/cfg/flash_t234_qspi.xml' --showlogs --network usb0";
        let agx_nvme = "ADDITIONAL_DTB_OVERLAY_OPT=BootOrderNvme.dtbo ./tools/kernel_flash/l4t_initrd_flash.sh --external-device nvme0n1p1 -c tools/kernel_flash/flash_l4t_external.xml --showlogs jetson-agx-orin-devkit external";
        let agx_usb = "ADDITIONAL_DTB_OVERLAY_OPT=BootOrderUsb.dtbo ./tools/kernel_flash/l4t_initrd_flash.sh --external-device sda1 -c tools/kernel_flash/flash_l4t_external.xml --showlogs jetson-agx-orin-devkit external";
        let cases: Vec<(&str, Option<Carrier>, L4tRelease, Storage, String)> = vec![
            (
                "jetson-orin-nano",
                None,
                R35,
                Storage::Nvme,
                format!("{nvme_r35} jetson-orin-nano-devkit internal"),
            ),
            (
                "jetson-orin-nano",
                None,
                R35,
                Storage::Usb,
                format!("{usb_r35} jetson-orin-nano-devkit internal"),
            ),
            (
                "jetson-orin-nano",
                None,
                R35,
                Storage::Sd,
                "./flash.sh jetson-orin-nano-devkit internal".into(),
            ),
            (
                "jetson-orin-nano",
                None,
                R36,
                Storage::Nvme,
                format!("{nvme_r36} jetson-orin-nano-devkit internal"),
            ),
            (
                "jetson-orin-nano",
                None,
                R36,
                Storage::Usb,
                format!("{usb_r36} jetson-orin-nano-devkit internal"),
            ),
            (
                "jetson-orin-nano",
                None,
                R36,
                Storage::Sd,
                "./flash.sh jetson-orin-nano-devkit internal".into(),
            ),
            // Orin NX on NVIDIA's P3768 carrier flashes as the Orin Nano
            // developer kit.
            (
                "jetson-orin-nx-8",
                None,
                R35,
                Storage::Nvme,
                format!("{nvme_r35} jetson-orin-nano-devkit internal"),
            ),
            (
                "jetson-orin-nx-16",
                None,
                R36,
                Storage::Nvme,
                format!("{nvme_r36} jetson-orin-nano-devkit internal"),
            ),
            (
                "jetson-orin-nx-16",
                None,
                R36,
                Storage::Usb,
                format!("{usb_r36} jetson-orin-nano-devkit internal"),
            ),
            // On the Xavier NX carrier, spelled per release.
            (
                "jetson-orin-nx-16",
                Some(Carrier::P3509),
                R35,
                Storage::Nvme,
                format!("{nvme_r35} p3509-a02+p3767-0000 internal"),
            ),
            (
                "jetson-orin-nx-16",
                Some(Carrier::P3509),
                R36,
                Storage::Nvme,
                format!("{nvme_r36} p3509-a02-p3767-0000 internal"),
            ),
            (
                "jetson-orin-nx-8",
                Some(Carrier::P3509),
                R36,
                Storage::Usb,
                format!("{usb_r36} p3509-a02-p3767-0000 internal"),
            ),
            (
                "jetson-agx-orin-32",
                None,
                R35,
                Storage::Emmc,
                "./flash.sh jetson-agx-orin-devkit internal".into(),
            ),
            (
                "jetson-agx-orin-32",
                None,
                R36,
                Storage::Emmc,
                "./flash.sh jetson-agx-orin-devkit internal".into(),
            ),
            (
                "jetson-agx-orin-32",
                None,
                R36,
                Storage::Nvme,
                agx_nvme.into(),
            ),
            (
                "jetson-agx-orin-64",
                None,
                R35,
                Storage::Emmc,
                "./flash.sh jetson-agx-orin-devkit internal".into(),
            ),
            (
                "jetson-agx-orin-64",
                None,
                R35,
                Storage::Nvme,
                agx_nvme.into(),
            ),
            (
                "jetson-agx-orin-64",
                None,
                R36,
                Storage::Usb,
                agx_usb.into(),
            ),
        ];
        for (model, carrier, release, storage, want) in cases {
            let d = l4t(release, false);
            let img = applied(d.path());
            let p = plan(
                board(model),
                &img,
                d.path(),
                storage,
                carrier,
                Some(release),
                None,
            )
            .unwrap_or_else(|e| panic!("{model} {release} {storage}: {e}"));
            assert_eq!(p.steps.len(), 2);
            assert_eq!(p.steps[0].program, "tar");
            assert_eq!(p.steps[1].shell(), want, "{model} {release} {storage}");
            assert_eq!(p.release_source, ReleaseSource::RobotYaml);
            let text = p.to_string();
            assert!(text.contains(&want), "{text}");
        }
    }

    #[test]
    fn a_storage_the_board_lacks_is_refused() {
        let d = l4t(R36, true);
        let img = applied(d.path());
        for (model, storage, has) in [
            ("jetson-orin-nano", Storage::Emmc, "nvme, usb, sd"),
            ("jetson-orin-nx-8", Storage::Emmc, "nvme, usb"),
            ("jetson-orin-nx-16", Storage::Sd, "nvme, usb"),
            ("jetson-agx-orin-64", Storage::Sd, "emmc, nvme, usb"),
        ] {
            let e = plan(board(model), &img, d.path(), storage, None, None, None)
                .unwrap_err()
                .to_string();
            assert_eq!(
                e,
                format!(
                    "board `{model}` has no {storage} storage (it has {has}); nothing was written"
                )
            );
        }
        // The Orin Nano's SD card is flashed on NVIDIA's carrier only, and
        // an AGX Orin does not fit a P3767 carrier.
        let e = plan(
            board("jetson-orin-nano"),
            &img,
            d.path(),
            Storage::Sd,
            Some(Carrier::P3509),
            None,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("p3509"), "{e}");
        let e = plan(
            board("jetson-agx-orin-32"),
            &img,
            d.path(),
            Storage::Emmc,
            Some(Carrier::P3768),
            None,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("does not fit the p3768 carrier (it fits p3737)"),
            "{e}"
        );
        assert_eq!(fs_names(&d.path().join("rootfs")), ["README.txt"]);
    }

    fn fs_names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn release_from_robot_yaml_and_the_l4t_directory() {
        let d = l4t(R36, true);
        let img = applied(d.path());
        let b = board("jetson-orin-nano");
        assert_eq!(bsp_version(d.path()).unwrap(), Some(R36));
        // From the directory alone.
        let p = plan(b, &img, d.path(), Storage::Nvme, None, None, None).unwrap();
        assert_eq!(
            (p.release.as_str(), p.release_source),
            ("R36.4.3", ReleaseSource::BspVersion)
        );
        // Both, agreeing.
        let p = plan(b, &img, d.path(), Storage::Nvme, None, Some(R36), None).unwrap();
        assert_eq!(p.release_source, ReleaseSource::Both);
        // Both, differing: refused, both named.
        let e = plan(b, &img, d.path(), Storage::Nvme, None, Some(R35), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("robot.yaml's `kernel.l4t` is R35.6.0 but ")
                && e.contains("nv_tegra/bsp_version says R36.4.3"),
            "{e}"
        );
        let other = L4tRelease { revision: 2, ..R36 };
        let e = plan(b, &img, d.path(), Storage::Nvme, None, Some(other), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("R36.4.2") && e.contains("R36.4.3"), "{e}");
        // Neither.
        let bare = l4t(R36, false);
        let e = plan(b, &img, bare.path(), Storage::Nvme, None, None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot tell the Jetson Linux release"), "{e}");
        // A release rtdeploy has no flash configuration for.
        let r38 = L4tRelease {
            major: 38,
            minor: 2,
            revision: 0,
        };
        let e = plan(b, &img, bare.path(), Storage::Nvme, None, Some(r38), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("L4T R38.2.0 has no flash configuration"), "{e}");
        // An R35 directory lacks R36's P3509 configuration.
        let r35 = l4t(R35, false);
        let e = plan(
            board("jetson-orin-nx-16"),
            &img,
            r35.path(),
            Storage::Nvme,
            Some(Carrier::P3509),
            Some(R36),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no p3509-a02-p3767-0000.conf"), "{e}");
        std::fs::write(r35.path().join(BSP_VERSION), "BSP_BRANCH=35\nBSP_MAJOR=x\n").unwrap();
        let e = bsp_version(r35.path()).unwrap_err().to_string();
        assert!(e.contains("BSP_MAJOR=x is not a number"), "{e}");
    }

    #[test]
    fn an_image_without_apply_binaries_is_refused() {
        let d = l4t(R36, true);
        let bare = tar_image(d.path(), &["etc/", "etc/passwd", "usr/"]);
        let e = plan(
            board("jetson-orin-nano"),
            &bare,
            d.path(),
            Storage::Nvme,
            None,
            None,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("has no /etc/nv_tegra_release") && e.contains("sudo ./apply_binaries.sh"),
            "{e}"
        );
        // The same marker inside a tar.zst image.
        let tar = std::fs::read(applied(d.path())).unwrap();
        let zst = d.path().join("img.tar.zst");
        std::fs::write(&zst, zstd::encode_all(&tar[..], 3).unwrap()).unwrap();
        plan(
            board("jetson-orin-nano"),
            &zst,
            d.path(),
            Storage::Nvme,
            None,
            None,
            None,
        )
        .unwrap();
    }

    #[test]
    fn refuses_boards_without_flash_config_and_busy_rootfs() {
        let d = l4t(R36, true);
        let img = applied(d.path());
        let qemu = board("qemu-x86_64");
        let e = plan(qemu, &img, d.path(), Storage::Nvme, None, None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("qemu-x86_64"), "{e}");
        std::fs::create_dir(d.path().join("rootfs/etc")).unwrap();
        let b = board("jetson-agx-orin-64");
        let e = plan(b, &img, d.path(), Storage::Nvme, None, None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not empty") && e.contains("etc"), "{e}");
        std::fs::write(d.path().join("x.ext4"), vec![0u8; 2048]).unwrap();
        let e = plan(
            b,
            &d.path().join("x.ext4"),
            d.path(),
            Storage::Nvme,
            None,
            None,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not a tar"), "{e}");
    }

    /// The files rootfs A/B needs in an L4T directory of `release`: the
    /// modules' configurations (acting on ROOTFS_AB or, as R35.3.1's
    /// p3767.conf.common, not) and the layouts with both slots.
    fn with_ab(d: &Path, release: L4tRelease, p3767_ab: bool) {
        let acts = "if [ \"${ROOTFS_AB}\" == 1 ]; then\n\trootfs_ab=1;\nfi;\n";
        let inert = "# ROOTFS_AB is not read here\nROOTFSSIZE=55GiB;\n";
        std::fs::write(d.join("p3701.conf.common"), acts).unwrap();
        std::fs::write(
            d.join("p3767.conf.common"),
            if p3767_ab { acts } else { inert },
        )
        .unwrap();
        let files: &[&str] = if release.major == 35 {
            &[
                "tools/kernel_flash/flash_l4t_nvme_rootfs_ab.xml",
                "bootloader/t186ref/cfg/flash_t234_qspi_sdmmc_rootfs_ab.xml",
            ]
        } else {
            &[
                "tools/kernel_flash/flash_l4t_t234_nvme_rootfs_ab.xml",
                "bootloader/generic/cfg/flash_t234_qspi_sdmmc_rootfs_ab.xml",
            ]
        };
        for f in files {
            std::fs::create_dir_all(d.join(f).parent().unwrap()).unwrap();
            std::fs::write(d.join(f), "<partition_layout/>").unwrap();
        }
    }

    /// Rootfs A/B: the commands NVIDIA's README_initrd_flash.txt
    /// "Workflow 5" and the modules' configurations give (written out
    /// here, not taken from the code's tables), and each refusal.
    #[test]
    fn rootfs_ab_is_flashed_where_the_release_provides_it() {
        let t = tempfile::tempdir().unwrap();
        let img = applied(t.path());
        let ab = |n| Some(RootfsAb { retry_count_max: n });
        let cmd = |p: &FlashPlan| p.steps.last().unwrap().shell();

        let d = l4t(R36, true);
        with_ab(d.path(), R36, true);
        let p = plan(
            board("jetson-orin-nano"),
            &img,
            d.path(),
            Storage::Nvme,
            None,
            None,
            ab(Some(2)),
        )
        .unwrap();
        assert_eq!(
            cmd(&p),
            "ROOTFS_AB=1 ROOTFS_RETRY_COUNT_MAX=2 ./tools/kernel_flash/l4t_initrd_flash.sh --external-device nvme0n1p1 -c tools/kernel_flash/flash_l4t_t234_nvme_rootfs_ab.xml -p '-c bootloader/generic/cfg/flash_t234_qspi.xml' --showlogs --network usb0 jetson-orin-nano-devkit internal"
        );
        let shown = p.to_string();
        assert!(
            shown.contains("# rootfs A/B: slots APP and APP_b (tools/kernel_flash/flash_l4t_t234_nvme_rootfs_ab.xml), retry count 2"),
            "{shown}"
        );
        let p = plan(
            board("jetson-agx-orin-64"),
            &img,
            d.path(),
            Storage::Emmc,
            None,
            None,
            ab(None),
        )
        .unwrap();
        assert_eq!(
            cmd(&p),
            "ROOTFS_AB=1 ./flash.sh jetson-agx-orin-devkit internal"
        );
        assert!(p.to_string().contains("retry count the firmware's default"));
        // The SD card's configuration has no second slot.
        let e = plan(
            board("jetson-orin-nano"),
            &img,
            d.path(),
            Storage::Sd,
            None,
            None,
            ab(None),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("has no APP_b") && e.contains("nothing was written"),
            "{e}"
        );
        // flash.sh ignores a retry count outside 1 to 3: refused here.
        let e = plan(
            board("jetson-orin-nano"),
            &img,
            d.path(),
            Storage::Nvme,
            None,
            None,
            ab(Some(4)),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--retry-count 4: "), "{e}");

        // R35: the AGX Orin has both slots on its eMMC and on a drive; the
        // Orin Nano's configuration (as R35.3.1's) does not act on
        // ROOTFS_AB.
        let d = l4t(R35, true);
        with_ab(d.path(), R35, false);
        let agx = board("jetson-agx-orin-64");
        let p = plan(agx, &img, d.path(), Storage::Nvme, None, None, ab(Some(3))).unwrap();
        assert_eq!(
            cmd(&p),
            "ADDITIONAL_DTB_OVERLAY_OPT=BootOrderNvme.dtbo ROOTFS_AB=1 ROOTFS_RETRY_COUNT_MAX=3 ./tools/kernel_flash/l4t_initrd_flash.sh --external-device nvme0n1p1 -c tools/kernel_flash/flash_l4t_nvme_rootfs_ab.xml --showlogs jetson-agx-orin-devkit external"
        );
        let p = plan(agx, &img, d.path(), Storage::Emmc, None, None, ab(None)).unwrap();
        assert_eq!(
            p.rootfs_ab.as_ref().unwrap().layout,
            "bootloader/t186ref/cfg/flash_t234_qspi_sdmmc_rootfs_ab.xml"
        );
        let e = plan(
            board("jetson-orin-nano"),
            &img,
            d.path(),
            Storage::Nvme,
            None,
            None,
            ab(None),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("p3767.conf.common does not act on ROOTFS_AB")
                && e.contains("Jetson Linux R35.6.0"),
            "{e}"
        );
        // Without the layout file: refused, naming it.
        std::fs::remove_file(
            d.path()
                .join("tools/kernel_flash/flash_l4t_nvme_rootfs_ab.xml"),
        )
        .unwrap();
        let e = plan(agx, &img, d.path(), Storage::Usb, None, None, ab(None))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("has no tools/kernel_flash/flash_l4t_nvme_rootfs_ab.xml"),
            "{e}"
        );
        // Without --rootfs-ab nothing changes.
        let p = plan(agx, &img, d.path(), Storage::Emmc, None, None, None).unwrap();
        assert!(p.rootfs_ab.is_none());
        assert_eq!(cmd(&p), "./flash.sh jetson-agx-orin-devkit internal");
    }
}
