//! `deploy image` and `deploy flash`: build a reproducible root filesystem
//! for the robot, and flash it onto a Jetson board.
//!
//! Exit codes: 0 written (or flashed, or printed with --dry-run); 2 bad
//! input or a failed step.

use std::path::{Path, PathBuf};

use anyhow::Context;
use cpusets::board::BootLoader;
use image::{build, Base, Format, ImageSpec, Phase, Progress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cmd::load_robot;
use crate::config::Robot;
use crate::ctx::{Ctx, Exit};

/// Build a root filesystem image with the controller installed.
#[derive(Debug, clap::Args)]
pub struct ImageArgs {
    /// The base root filesystem: a directory, a tar (.tar, .tar.gz,
    /// .tar.zst, told apart by content), or `none` for rtdeploy's files only.
    #[arg(long, value_name = "B")]
    pub base: PathBuf,
    /// The release directory: the controller programs robot.yaml names
    /// (`processes[].exec`, e.g. `bin/imu_reader`).
    #[arg(long, value_name = "DIR")]
    pub release: PathBuf,
    /// The `deploy` binary built for the board (installed as /usr/bin/deploy).
    #[arg(long, value_name = "P")]
    pub deploy_binary: PathBuf,
    /// The image to write (refused if it exists, unless --force; always
    /// refused inside the base or release directory, which it would be
    /// made from).
    #[arg(long, value_name = "F")]
    pub out: PathBuf,
    /// tar, tar.zst, ext4 or cpio.gz [default: from the --out extension]
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<Format>,
    /// ext4 size, e.g. `8GiB` [default: content plus 20% and 96 MiB]
    #[arg(long, value_name = "S", value_parser = parse_size)]
    pub size: Option<u64>,
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
    /// emmc or sd (flash.sh).
    #[arg(long, value_name = "S", default_value = "nvme")]
    pub storage: image::flash::Storage,
    /// Print the commands instead of running them.
    #[arg(long)]
    pub dry_run: bool,
}

/// `8GiB`, `512M`, `1073741824`.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (expected e.g. 8GiB, 512MiB)"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        u => {
            return Err(format!(
                "unknown size unit `{u}` in `{s}` (expected KiB, MiB, GiB or TiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
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

/// `/etc/sysctl.d/90-rtdeploy.conf`: rtdeploy's real-time defaults, then
/// robot.yaml's `sysctl:` (overriding), each with its reason.
pub fn render_sysctl(robot: &Robot) -> String {
    let mut out = String::from(
        "# Written by `deploy image` from robot.yaml; `deploy apply` sets the same values.\n",
    );
    for (key, value, why) in cpusets::plan::DEFAULT_SYSCTLS {
        if robot.sysctl.contains_key(*key) {
            continue;
        }
        out.push_str(&format!("# {why}\n{key} = {value}\n"));
    }
    for (key, value) in &robot.sysctl {
        out.push_str(&format!("# from sysctl in robot.yaml\n{key} = {value}\n"));
    }
    out
}

/// `/etc/security/limits.d/90-rtdeploy.conf`: real-time priority and
/// memory locking for the robot's group and each process's user, for
/// programs started by hand (the supervisor sets its children's limits
/// itself).
pub fn render_limits(robot: &Robot) -> String {
    let mut out = String::from(
        "# Written by `deploy image` from robot.yaml.\n# <domain> <type> <item> <value>\n",
    );
    if let Some(g) = &robot.robot.group {
        out.push_str(&format!("@{g} - rtprio 99\n@{g} - memlock unlimited\n"));
    }
    let mut seen = std::collections::BTreeMap::new();
    for p in &robot.processes {
        let Some(user) = &p.user else { continue };
        let e = seen.entry(user.clone()).or_insert((0u32, None::<String>));
        if p.policy.is_realtime() {
            e.0 = e.0.max(p.priority.unwrap_or(0));
        }
        let memlock = match p.memlock {
            Some(services::config::Memlock::Unlimited) => Some("unlimited".to_string()),
            Some(services::config::Memlock::Bytes(b)) => Some(b.0.div_ceil(1024).to_string()),
            None => None,
        };
        if let Some(m) = memlock {
            e.1 = Some(match &e.1 {
                Some(old) if old == "unlimited" || m == "unlimited" => "unlimited".into(),
                Some(old) => old
                    .parse::<u64>()
                    .unwrap_or(0)
                    .max(m.parse().unwrap_or(0))
                    .to_string(),
                None => m,
            });
        }
    }
    for (user, (prio, memlock)) in seen {
        if prio > 0 {
            out.push_str(&format!("{user} - rtprio {prio}\n"));
        }
        if let Some(m) = memlock {
            out.push_str(&format!("{user} - memlock {m}\n"));
        }
    }
    out
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
    let unit = Some((
        "rtdeploy.service".to_string(),
        services::unit::render(&robot.robot, &robot.housekeeping(), &robot.processes),
    ));
    let spec = ImageSpec {
        base: Base::from_arg(&args.base),
        release: args.release.clone(),
        deploy_binary: args.deploy_binary.clone(),
        robot_yaml: loaded.text.clone(),
        robot_name: robot.robot.name.clone(),
        version: args.release_version.clone(),
        rtdeploy_version: env!("CARGO_PKG_VERSION").to_string(),
        source_date_epoch: args.source_date_epoch,
        cmdline,
        boot,
        unit,
        sysctl: render_sysctl(robot),
        limits: render_limits(robot),
        programs: robot.processes.iter().map(|p| p.exec.clone()).collect(),
        size: args.size,
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
    let plan = image::flash::plan(board, &args.image, &args.l4t, args.storage)?;
    if args.dry_run {
        if ctx.json {
            ctx.print_json(&plan)?;
        } else {
            print!("{plan}");
        }
        return Ok(Exit::Ok);
    }
    ctx.note(format!("flashing {} with {}", board.model, plan.config));
    image::flash::run(&plan)?;
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
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
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
