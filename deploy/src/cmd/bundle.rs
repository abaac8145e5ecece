//! `deploy bundle --release DIR --version V --key KEY --out F`: a signed
//! release bundle (see `releases::bundle`), byte-identical for identical
//! inputs.
//!
//! The robot and board it is for come from DIR/robot.yaml, else from the
//! robot.yaml given with -c (default <prefix>/etc/rtdeploy/robot.yaml),
//! which must validate. With `--mender-artifact OUT` the bundle is also
//! wrapped into a Mender artifact for our update module (see
//! [`releases::mender`]), for the device type `--device-type` or robot.yaml's
//! `update.mender.device_type`. Exit: 0 written, 2 error.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use releases::bundle::{self, BundleSpec};
use serde::Serialize;

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Args)]
pub struct BundleArgs {
    /// The release directory (bin/... and other files; robot.yaml at its
    /// top goes into the manifest).
    #[arg(long, value_name = "DIR")]
    pub release: PathBuf,
    /// The release version (part of the directory name on the robot).
    #[arg(long, value_name = "V")]
    pub version: String,
    /// The secret key from `deploy keygen`.
    #[arg(long, value_name = "KEY")]
    pub key: PathBuf,
    /// The bundle file to write.
    #[arg(long, value_name = "F")]
    pub out: PathBuf,
    /// Also write a Mender artifact carrying the bundle (module-image,
    /// type `rtdeploy-release`; needs Debian's `mender-artifact`).
    #[arg(long, value_name = "OUT")]
    pub mender_artifact: Option<PathBuf>,
    /// The artifact's device type [default: robot.yaml's
    /// `update.mender.device_type`]
    #[arg(long, value_name = "T", requires = "mender_artifact")]
    pub device_type: Option<String>,
    /// Bundle the programs as given, debug information and all (by
    /// default ELF files go in stripped, and their debug information into
    /// <out>.debug/ for symbolising a crash on the build host).
    #[arg(long)]
    pub no_strip: bool,
}

#[derive(Serialize)]
struct Written {
    bundle: PathBuf,
    release: String,
    robot: String,
    board: String,
    files: usize,
    release_bytes: u64,
    bundle_bytes: u64,
    /// `<out>.debug`, when programs were stripped.
    #[serde(skip_serializing_if = "Option::is_none")]
    debug: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mender_artifact: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_type: Option<String>,
}

pub fn run(ctx: &Ctx, args: BundleArgs) -> anyhow::Result<Exit> {
    let in_release = args.release.join("robot.yaml");
    let config_path = if in_release.is_file() {
        in_release
    } else {
        ctx.config_path.clone()
    };
    let config_ctx = Ctx {
        config_path,
        ..ctx.clone()
    };
    let loaded = super::load_robot(&config_ctx)?;
    let key = bundle::load_secret_key(&args.key)?;
    let device_type = match &args.mender_artifact {
        None => None,
        Some(_) => Some(
            args.device_type
                .clone()
                .or_else(|| {
                    loaded
                        .robot
                        .update
                        .mender
                        .as_ref()
                        .map(|m| m.device_type.clone())
                })
                .context("no device type for the Mender artifact (pass --device-type or set update.mender.device_type in robot.yaml)")?,
        ),
    };
    // The programs robot.yaml runs must be in the release (checked on
    // the directory as given, so a refusal names it); then the bundle is
    // made from a copy whose ELF files are stripped.
    let out_dir = match args.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let staging = tempfile::Builder::new()
        .prefix(".rtdeploy-bundle.")
        .tempdir_in(&out_dir)
        .with_context(|| {
            format!(
                "cannot create a temporary directory in {}",
                out_dir.display()
            )
        })?;
    let (release_dir, debug) = if args.no_strip {
        (args.release.clone(), Vec::new())
    } else {
        let copy = staging.path().join("release");
        let (files, debug) = rootfs::release::stage_stripped(&args.release, &copy)?;
        let seen: Vec<releases::programs::ReleaseFile> = files
            .iter()
            .map(|(path, mode)| releases::programs::ReleaseFile {
                path,
                mode: *mode,
                regular: true,
            })
            .collect();
        let programs = loaded.robot.programs();
        releases::check_programs(
            &args.release.display().to_string(),
            programs.iter().map(String::as_str),
            &seen,
        )?;
        (copy, debug)
    };
    let spec = BundleSpec {
        release_dir,
        version: args.version.clone(),
        robot: loaded.robot.robot.name.clone(),
        board: loaded.robot.board.model.clone(),
        robot_yaml: loaded.text.clone(),
        programs: loaded.robot.programs(),
    };
    let w = bundle::write_bundle(&spec, &key, &args.out).with_context(|| {
        format!(
            "bundle {} -> {}",
            args.release.display(),
            args.out.display()
        )
    })?;
    let debug_dir = {
        let mut name = args.out.as_os_str().to_owned();
        name.push(".debug");
        PathBuf::from(name)
    };
    let debug = rootfs::build::write_debug_dir(&debug_dir, &debug)?;
    drop(staging);
    if let (Some(out), Some(t)) = (&args.mender_artifact, &device_type) {
        releases::mender::write_artifact(&args.out, &w.release, t, out)
            .with_context(|| format!("Mender artifact {}", out.display()))?;
    }
    let doc = Written {
        mender_artifact: args.mender_artifact,
        device_type,
        bundle: args.out,
        release: w.release,
        robot: spec.robot,
        board: spec.board,
        files: w.manifest.files.len(),
        release_bytes: w.manifest.total_size(),
        bundle_bytes: w.bytes,
        debug,
    };
    if ctx.json {
        ctx.print_json(&doc)?;
    } else {
        crate::ctx::write_stdout(&format!(
            "{}: release {} for robot {} on {} ({} files, {} bytes; bundle {} bytes)\n",
            doc.bundle.display(),
            doc.release,
            doc.robot,
            doc.board,
            doc.files,
            doc.release_bytes,
            doc.bundle_bytes
        ))?;
        if let Some(d) = &doc.debug {
            crate::ctx::write_stdout(&format!(
                "{}: debug information of the stripped programs\n",
                d.display()
            ))?;
        }
        if let (Some(a), Some(t)) = (&doc.mender_artifact, &doc.device_type) {
            crate::ctx::write_stdout(&format!(
                "{}: Mender artifact {} for device type {t}\n",
                a.display(),
                doc.release
            ))?;
        }
    }
    Ok(Exit::Ok)
}
