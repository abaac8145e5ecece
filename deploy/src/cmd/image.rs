//! `deploy image` and `deploy flash`: build a reproducible root filesystem
//! for the robot, and flash it onto a Jetson board.
//!
//! Exit codes: 0 written (or flashed, or printed with --dry-run); 2 bad
//! input or a failed step.

use std::path::{Path, PathBuf};

use anyhow::Context;
use cpusets::board::BootLoader;
use cpusets::conf_files::{limits_conf, sysctl_conf, MemlockLimit, ProcessLimits};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rootfs::{build, Base, Format, ImageSpec, Phase, Progress};
use units::size::ByteSize;

use crate::cmd::load_robot;
use crate::ctx::{Ctx, Exit};
use services::robot::Robot;

/// Build a root filesystem image with the controller installed.
#[derive(Debug, clap::Args)]
pub struct ImageArgs {
    /// The base root filesystem: a directory, a tar (plain, gzip, zstd, or
    /// bzip2 as Jetson Linux's sample root filesystem .tbz2 comes; told
    /// apart by content), or `none` for rtdeploy's files only (an overlay
    /// for a root filesystem the board already has).
    #[arg(long, value_name = "B")]
    pub base: PathBuf,
    /// The release directory: the controller programs robot.yaml names
    /// (`processes[].exec`, e.g. `bin/imu_reader`).
    #[arg(long, value_name = "DIR")]
    pub release: PathBuf,
    /// The `deploy` binary built for the board (installed as /usr/bin/deploy).
    #[arg(long, value_name = "P")]
    pub deploy_binary: PathBuf,
    /// The `rtdeploy-bridge` binary built for the board, installed as
    /// /usr/bin/rtdeploy-bridge [default, when robot.yaml's `bridge:` runs
    /// that program: rtdeploy-bridge beside --deploy-binary]
    #[arg(long, value_name = "P")]
    pub bridge_binary: Option<PathBuf>,
    /// The image to write (refused if it exists, unless --force; always
    /// refused inside the base or release directory, which it would be
    /// made from).
    #[arg(long, value_name = "F")]
    pub out: PathBuf,
    /// tar, tar.zst, ext4 or cpio.gz [default: from the --out extension]
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<Format>,
    /// ext4 size, e.g. `8GiB` [default: content plus 20% and 96 MiB]
    #[arg(long, value_name = "S", value_parser = ByteSize::parse)]
    pub size: Option<ByteSize>,
    /// Replace an existing output (and its sidecars).
    #[arg(long)]
    pub force: bool,
    /// fsync the image before renaming it into place (survives a power cut
    /// right after the build; slower).
    #[arg(long)]
    pub sync: bool,
    /// The release version; the release directory is <version>-<sha8>.
    #[arg(long, value_name = "V", default_value = "0")]
    pub release_version: String,
    /// Clamp every mtime to this time [default: the newest mtime in the
    /// release directory].
    #[arg(long, value_name = "SECONDS", env = "SOURCE_DATE_EPOCH")]
    pub source_date_epoch: Option<u64>,
    /// Install the programs as given, debug information and all (by
    /// default they go in stripped, and their debug information into
    /// <out>.debug/ for symbolising a crash on the build host).
    #[arg(long)]
    pub no_strip: bool,
}

/// Flash an image onto a Jetson board in recovery mode.
#[derive(Debug, clap::Args)]
pub struct FlashArgs {
    /// A tar or tar.zst image from `deploy image`.
    #[arg(long, value_name = "F")]
    pub image: PathBuf,
    /// The Jetson Linux directory (Linux_for_Tegra).
    #[arg(long, value_name = "DIR")]
    pub l4t: PathBuf,
    /// Where the root filesystem goes: nvme, usb (l4t_initrd_flash.sh),
    /// emmc or sd (flash.sh); only storage the board's module has (AGX
    /// Orin: emmc, nvme, usb; Orin NX: nvme, usb; Orin Nano: nvme, usb,
    /// sd on the developer kit's module).
    #[arg(long, value_name = "S", default_value = "nvme")]
    pub storage: rootfs::flash::Storage,
    /// The carrier board: p3768 (Orin Nano developer kit), p3509 (Xavier
    /// NX developer kit) or p3737 (AGX Orin developer kit) [default: the
    /// module's developer kit carrier]
    #[arg(long, value_name = "C")]
    pub carrier: Option<rootfs::flash::Carrier>,
    /// Provision rootfs A/B: two root filesystem slots, the second booted
    /// by the firmware when the first fails its retry count (Jetson
    /// Linux's ROOTFS_AB=1; checked against the L4T directory's files for
    /// the module, the storage and the release).
    #[arg(long)]
    pub rootfs_ab: bool,
    /// With --rootfs-ab: boots of a slot that may fail before the other
    /// boots, 1 to 3 (ROOTFS_RETRY_COUNT_MAX) [default: the firmware's]
    #[arg(long, value_name = "N", requires = "rootfs_ab")]
    pub retry_count: Option<u8>,
    /// Print the commands instead of running them (without it, the board
    /// in recovery mode is flashed).
    #[arg(long)]
    pub dry_run: bool,
}

/// The format from the output's name, when it says.
fn format_from_name(out: &Path) -> Option<Format> {
    let name = out.file_name()?.to_str()?;
    [
        (".tar.zst", Format::TarZst),
        (".tzst", Format::TarZst),
        (".tar", Format::Tar),
        (".cpio.gz", Format::CpioGz),
        (".ext4", Format::Ext4),
        (".img", Format::Ext4),
    ]
    .into_iter()
    .find(|(ext, _)| name.ends_with(ext))
    .map(|(_, f)| f)
}

/// What each process started under its own user needs from limits.conf.
fn process_limits(robot: &Robot) -> impl Iterator<Item = ProcessLimits<'_>> {
    robot.processes.iter().filter_map(|p| {
        Some(ProcessLimits {
            user: p.user.as_deref()?,
            rtprio: if p.policy.is_realtime() {
                p.priority.unwrap_or(0)
            } else {
                0
            },
            memlock: p.memlock.map(|m| match m {
                services::config::Memlock::Unlimited => MemlockLimit::Unlimited,
                services::config::Memlock::Bytes(b) => MemlockLimit::Bytes(b.0),
            }),
        })
    })
}

/// The bridge binary the image carries: the one given, else, when the
/// robot's bridge runs the program images install, the one built beside
/// the deploy binary (cargo builds both into one directory). A robot that
/// would run a bridge the image lacks is refused: its supervisor would
/// fail to start it at every boot.
fn bridge_binary(robot: &Robot, args: &ImageArgs) -> anyhow::Result<Option<PathBuf>> {
    if let Some(p) = &args.bridge_binary {
        return Ok(Some(p.clone()));
    }
    let Some(b) = robot
        .bridge
        .as_ref()
        .filter(|b| b.exec == services::bridge::DEFAULT_EXEC)
    else {
        return Ok(None);
    };
    let beside = args.deploy_binary.with_file_name("rtdeploy-bridge");
    if beside.is_file() {
        return Ok(Some(beside));
    }
    anyhow::bail!(
        "robot.yaml's bridge runs {} (bridge.exec), which the image installs, but there is no {} beside the deploy binary {}: \
         pass --bridge-binary (built for the board: `cargo build --release -p bridge`, \
         or scripts/build-aarch64.sh --bridge for a Jetson), or set bridge.exec to a program \
         the base or the release holds",
        b.exec,
        beside.display(),
        args.deploy_binary.display()
    )
}

fn progress_bar(ctx: &Ctx) -> ProgressBar {
    if ctx.quiet || ctx.json {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{msg:12} [{bar:32}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb
}

pub fn run(ctx: &Ctx, args: ImageArgs) -> anyhow::Result<Exit> {
    let loaded = load_robot(ctx)?;
    let robot = &loaded.robot;
    let format = match args.format.or_else(|| format_from_name(&args.out)) {
        Some(f) => f,
        None => anyhow::bail!(
            "cannot tell the format from {} (name it .tar, .tar.zst, .ext4 or .cpio.gz, or pass --format)",
            args.out.display()
        ),
    };
    let board = robot.board.board();
    let boot = board.map_or(BootLoader::External, |b| b.boot);
    let cmdline = cpusets::cmdline::plan(&robot.cpus, &robot.kernel, &robot.all_cpus());
    // The supervisor's systemd unit, enabled in multi-user.target.
    let unit = Some(("rtdeploy.service".to_string(), robot.unit()));
    let spec = ImageSpec {
        base: Base::from_arg(&args.base),
        release: args.release.clone(),
        deploy_binary: args.deploy_binary.clone(),
        tools: bridge_binary(robot, &args)?
            .map(|p| {
                (
                    services::bridge::DEFAULT_EXEC
                        .trim_start_matches('/')
                        .to_string(),
                    p,
                )
            })
            .into_iter()
            .collect(),
        robot_yaml: loaded.text.clone(),
        robot_name: robot.robot.name.clone(),
        version: args.release_version.clone(),
        rtdeploy_version: env!("CARGO_PKG_VERSION").to_string(),
        source_date_epoch: args.source_date_epoch,
        cmdline,
        boot,
        unit,
        sysctl: sysctl_conf(&robot.sysctl),
        limits: limits_conf(robot.robot.group.as_deref(), process_limits(robot)),
        // With `update.mender`, our update module in Mender's modules
        // directory, calling the image's own `deploy`.
        extra_files: robot
            .update
            .mender
            .iter()
            .map(|_| {
                (
                    releases::mender::MODULE_PATH.to_string(),
                    releases::mender::module_script("/usr/bin/deploy", &[]).into_bytes(),
                    0o755,
                )
            })
            // With `update.boot_attempts`, the boot partition's files:
            // U-Boot's boot script and an unarmed state. Whoever makes the
            // board's disk makes that partition (FAT, the first one U-Boot
            // scans, the root file system right after it) from this
            // directory and mounts it at `update.boot_attempts.partition`.
            .chain(robot.update.boot_attempts.iter().flat_map(|_| {
                releases::boot_attempts::partition_files()
                    .into_iter()
                    .map(|(rel, bytes)| {
                        (
                            format!(
                                "{}/{}",
                                releases::boot_attempts::PARTITION_TEMPLATE,
                                rel.display()
                            ),
                            bytes,
                            0o644,
                        )
                    })
                    .collect::<Vec<_>>()
            }))
            .collect(),
        programs: robot.programs(),
        board: robot.board.model.clone(),
        arch: board
            .map(|b| b.arch)
            .filter(|a| *a != "any")
            .map(String::from),
        strip: !args.no_strip,
        size: args.size.map(|s| s.0),
        force: args.force,
        sync: args.sync,
    };
    let pb = progress_bar(ctx);
    let mut on_progress = |p: Progress| {
        let msg = match p.phase {
            Phase::ReadBase => "reading base",
            Phase::Write => "writing",
            Phase::MakeFs => "mke2fs",
        };
        if pb.message() != msg {
            pb.set_message(msg);
            pb.reset();
        }
        pb.set_length(p.total);
        pb.set_position(p.done);
    };
    let result = build(&spec, &args.out, format, &mut on_progress);
    pb.finish_and_clear();
    let summary = result.with_context(|| format!("cannot build {}", args.out.display()))?;
    for w in &summary.warnings {
        ctx.note(format!("warning: {w}"));
    }
    if ctx.json {
        ctx.print_json(&summary)?;
    } else {
        println!(
            "wrote {} ({}, {} bytes)",
            summary.out.display(),
            summary.format,
            summary.bytes
        );
        println!("  manifest sha256 {}", summary.manifest_sha256);
        println!("  release   {}", summary.release_dir);
        println!("  epoch     {}", summary.source_date_epoch);
        match &summary.append {
            Some(a) => println!("  APPEND    {a}"),
            None => println!("  cmdline   {} (in /etc/rtdeploy/cmdline)", summary.cmdline),
        }
        println!("  manifest  {}", summary.manifest.display());
        println!("  sbom      {}", summary.sbom.display());
        if let Some(d) = &summary.debug {
            println!(
                "  debug     {} (programs stripped of {} bytes of debug information)",
                d.display(),
                summary.stripped_bytes
            );
        }
    }
    Ok(Exit::Ok)
}

pub fn run_flash(ctx: &Ctx, args: FlashArgs) -> anyhow::Result<Exit> {
    let loaded = load_robot(ctx)?;
    let robot = &loaded.robot;
    let board = robot
        .board
        .board()
        .with_context(|| format!("unknown board `{}`", robot.board.model))?;
    // The L4T release: robot.yaml's `kernel.l4t` and the directory's
    // nv_tegra/bsp_version, which the plan checks against each other.
    let plan = rootfs::flash::plan(
        board,
        &args.image,
        &args.l4t,
        args.storage,
        args.carrier,
        robot.kernel.l4t_release(),
        args.rootfs_ab.then_some(rootfs::flash::RootfsAb {
            retry_count_max: args.retry_count,
        }),
    )?;
    if args.dry_run {
        if ctx.json {
            ctx.print_json(&plan)?;
        } else {
            print!("{plan}");
        }
        return Ok(Exit::Ok);
    }
    ctx.note(format!(
        "flashing {} on {} with L4T {} ({})",
        board.model, plan.carrier, plan.release, plan.config
    ));
    rootfs::flash::run(&plan)?;
    if ctx.json {
        ctx.print_json(&plan)?;
    }
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let parse_size = ByteSize::parse;
        assert_eq!(parse_size("8GiB").unwrap().0, 8 << 30);
        assert_eq!(parse_size("512M").unwrap().0, 512 << 20);
        assert_eq!(parse_size("4096").unwrap().0, 4096);
        assert!(parse_size("8 parsecs").is_err());
        assert!(parse_size("GiB").is_err());
    }

    #[test]
    fn format_from_the_output_name() {
        assert_eq!(
            format_from_name(Path::new("a/robot.tar.zst")),
            Some(Format::TarZst)
        );
        assert_eq!(format_from_name(Path::new("robot.tar")), Some(Format::Tar));
        assert_eq!(
            format_from_name(Path::new("initrd.cpio.gz")),
            Some(Format::CpioGz)
        );
        assert_eq!(
            format_from_name(Path::new("rootfs.ext4")),
            Some(Format::Ext4)
        );
        assert_eq!(format_from_name(Path::new("rootfs")), None);
    }
}
