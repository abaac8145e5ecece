//! `deploy keygen --out KEY`: an ed25519 key pair for signing bundles.
//!
//! KEY holds the secret (mode 0600, never overwritten), KEY.pub the public
//! key in base64: copy it to `/etc/rtdeploy/keys/` on the robots or into
//! `update.public_keys`. Exit: 0 written, 2 error.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use releases::bundle;
use serde::Serialize;

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// The secret key file to create (KEY.pub is written beside it).
    #[arg(long, value_name = "KEY")]
    pub out: PathBuf,
}

#[derive(Serialize)]
struct Keys {
    secret_key: PathBuf,
    public_key_file: PathBuf,
    public_key: String,
}

pub fn run(ctx: &Ctx, args: KeygenArgs) -> anyhow::Result<Exit> {
    let public =
        bundle::keygen(&args.out).with_context(|| format!("keygen {}", args.out.display()))?;
    let doc = Keys {
        public_key_file: bundle::pub_path(&args.out),
        secret_key: args.out,
        public_key: public,
    };
    if ctx.json {
        ctx.print_json(&doc)?;
    } else {
        crate::ctx::write_stdout(&format!(
            "secret key  {} (mode 0600: keep it off the robots)\npublic key  {}\n            {}\n",
            doc.secret_key.display(),
            doc.public_key_file.display(),
            doc.public_key
        ))?;
    }
    Ok(Exit::Ok)
}
