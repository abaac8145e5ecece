//! `deploy flash`: the Jetson Linux flashing commands for an image, as a
//! plan that can be printed (`--dry-run`) or run.
//!
//! Jetson Linux's scripts build the system image from
//! `Linux_for_Tegra/rootfs/`, so the plan is: unpack the image there (as
//! root, numeric owners, modes and device nodes kept), then run
//! `tools/kernel_flash/l4t_initrd_flash.sh` for NVMe and USB storage or
//! `flash.sh` for eMMC and SD, with the board's flash configuration. The
//! board must be in recovery mode and connected over USB.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use cpusets::board::Board;
use serde::Serialize;

/// Where the root filesystem goes on the board.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Storage {
    Nvme,
    Usb,
    Emmc,
    Sd,
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
        Ok(match s {
            "nvme" => Storage::Nvme,
            "usb" => Storage::Usb,
            "emmc" => Storage::Emmc,
            "sd" => Storage::Sd,
            _ => return Err(StorageParseError::Unknown(s.to_string())),
        })
    }
}

/// Why a flash plan could not be made or run.
#[derive(Debug, thiserror::Error)]
pub enum FlashPlanError {
    #[error("board `{0}` has no Jetson Linux flash configuration (only Jetson boards are flashed; boot other boards from the image directly)")]
    NotFlashable(String),
    #[error("{} is not a Jetson Linux directory (no {})", dir.display(), missing)]
    NotL4t { dir: PathBuf, missing: &'static str },
    #[error("cannot read image {}", path.display())]
    Image {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("image {} is not a tar or tar.zst image (flash unpacks the image into Linux_for_Tegra/rootfs; build one with --format tar.zst)", path.display())]
    NotTar { path: PathBuf },
    #[error("{} is not empty (holds {}); move it aside so the image is flashed alone", dir.display(), first)]
    RootfsNotEmpty { dir: PathBuf, first: String },
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
    pub program: String,
    pub args: Vec<String>,
}

impl Step {
    /// The command as a shell line.
    pub fn shell(&self) -> String {
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|a| quote(a))
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

/// The commands that flash `image` onto `board` from the Jetson Linux
/// directory `l4t`.
#[derive(Debug, Clone, Serialize)]
pub struct FlashPlan {
    pub board: &'static str,
    pub config: &'static str,
    pub storage: Storage,
    pub steps: Vec<Step>,
}

impl fmt::Display for FlashPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "# flash {} ({}) onto {:?} storage; put the board in recovery mode first",
            self.board, self.config, self.storage
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

/// Tells a tar or tar.zst image from the others by its first bytes.
fn is_tar_image(path: &Path) -> Result<bool, FlashPlanError> {
    use std::io::Read;
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(512).read_to_end(&mut head))
        .map_err(|source| FlashPlanError::Image {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
        || (head.len() >= 262 && &head[257..262] == b"ustar"))
}

/// Makes the plan; checks the board, the image and the L4T directory, and
/// that `l4t/rootfs` holds nothing but Jetson Linux's README.
pub fn plan(
    board: &Board,
    image: &Path,
    l4t: &Path,
    storage: Storage,
) -> Result<FlashPlan, FlashPlanError> {
    let config = board
        .flash_config
        .ok_or_else(|| FlashPlanError::NotFlashable(board.model.to_string()))?;
    if !is_tar_image(image)? {
        return Err(FlashPlanError::NotTar {
            path: image.to_path_buf(),
        });
    }
    let script = match storage {
        Storage::Nvme | Storage::Usb => "tools/kernel_flash/l4t_initrd_flash.sh",
        Storage::Emmc | Storage::Sd => "flash.sh",
    };
    for need in [script, "rootfs"] {
        if !l4t.join(need).exists() {
            return Err(FlashPlanError::NotL4t {
                dir: l4t.to_path_buf(),
                missing: need,
            });
        }
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
    let flash_args: Vec<String> = match storage {
        Storage::Nvme | Storage::Usb => {
            let (dev, layout) = if storage == Storage::Nvme {
                ("nvme0n1p1", "tools/kernel_flash/flash_l4t_t234_nvme.xml")
            } else {
                ("sda1", "tools/kernel_flash/flash_l4t_external.xml")
            };
            vec![
                "--external-device".into(),
                dev.into(),
                "-c".into(),
                layout.into(),
                "-p".into(),
                "-c bootloader/generic/cfg/flash_t234_qspi.xml".into(),
                "--showlogs".into(),
                "--network".into(),
                "usb0".into(),
                config.into(),
                "internal".into(),
            ]
        }
        Storage::Emmc | Storage::Sd => vec![config.into(), "internal".into()],
    };
    steps.push(Step {
        why: format!("flash with {script} and the {config} configuration"),
        cwd: l4t.to_path_buf(),
        program: format!("./{script}"),
        args: flash_args,
    });
    Ok(FlashPlan {
        board: board.model,
        config,
        storage,
        steps,
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

    fn l4t() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("tools/kernel_flash")).unwrap();
        std::fs::write(d.path().join("tools/kernel_flash/l4t_initrd_flash.sh"), "").unwrap();
        std::fs::write(d.path().join("flash.sh"), "").unwrap();
        std::fs::create_dir(d.path().join("rootfs")).unwrap();
        std::fs::write(d.path().join("rootfs/README.txt"), "").unwrap();
        d
    }

    fn tar_image(dir: &Path) -> PathBuf {
        let p = dir.join("img.tar");
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_entry_type(tar::EntryType::Directory);
        b.append_data(&mut h, "etc", std::io::empty()).unwrap();
        std::fs::write(&p, b.into_inner().unwrap()).unwrap();
        p
    }

    #[test]
    fn nvme_plan_uses_initrd_flash_with_the_board_config() {
        let d = l4t();
        let img = tar_image(d.path());
        let board = cpusets::board::find("jetson-orin-nano").unwrap();
        let p = plan(board, &img, d.path(), Storage::Nvme).unwrap();
        assert_eq!(p.steps.len(), 2);
        assert_eq!(p.steps[0].program, "tar");
        let flash = p.steps[1].shell();
        assert!(
            flash.starts_with(
                "./tools/kernel_flash/l4t_initrd_flash.sh --external-device nvme0n1p1"
            ),
            "{flash}"
        );
        assert!(
            flash.ends_with("jetson-orin-nano-devkit internal"),
            "{flash}"
        );
        let p = plan(board, &img, d.path(), Storage::Emmc).unwrap();
        assert_eq!(
            p.steps[1].shell(),
            "./flash.sh jetson-orin-nano-devkit internal"
        );
    }

    #[test]
    fn refuses_boards_without_flash_config_and_busy_rootfs() {
        let d = l4t();
        let img = tar_image(d.path());
        let qemu = cpusets::board::find("qemu-x86_64").unwrap();
        let e = plan(qemu, &img, d.path(), Storage::Nvme)
            .unwrap_err()
            .to_string();
        assert!(e.contains("qemu-x86_64"), "{e}");
        std::fs::create_dir(d.path().join("rootfs/etc")).unwrap();
        let board = cpusets::board::find("jetson-agx-orin").unwrap();
        let e = plan(board, &img, d.path(), Storage::Nvme)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not empty") && e.contains("etc"), "{e}");
        std::fs::write(d.path().join("x.ext4"), vec![0u8; 2048]).unwrap();
        let e = plan(board, &d.path().join("x.ext4"), d.path(), Storage::Nvme)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a tar"), "{e}");
    }
}
