//! `deploy bundle --release DIR --version V --key KEY --out F`: a signed
//! release bundle (see `releases::bundle`), byte-identical for identical
//! inputs.
//!
//! The robot and board it is for come from DIR/robot.yaml, else from the
//! robot.yaml given with -c (default <prefix>/etc/rtdeploy/robot.yaml),
//! which must validate. Exit: 0 written, 2 error.

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
    let spec = BundleSpec {
        release_dir: args.release.clone(),
        version: args.version.clone(),
        robot: loaded.robot.robot.name.clone(),
        board: loaded.robot.board.model.clone(),
        robot_yaml: loaded.text.clone(),
    };
    let w = bundle::write_bundle(&spec, &key, &args.out).with_context(|| {
        format!(
            "bundle {} -> {}",
            args.release.display(),
            args.out.display()
        )
    })?;
    let doc = Written {
        bundle: args.out,
        release: w.release,
        robot: spec.robot,
        board: spec.board,
        files: w.manifest.files.len(),
        release_bytes: w.manifest.total_size(),
        bundle_bytes: w.bytes,
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
    }
    Ok(Exit::Ok)
}
