//! `deploy status [--json]`: what the supervisor runs, as the kernel sees
//! it.
//!
//! Exit codes: 0 every process is running (or exited as its policy
//! allows) and within budget; 1 a process is failed, refused or degraded;
//! 2 the supervisor does not answer, or answers that it is busy (every
//! control connection taken; the message says so and trying again later
//! may succeed).

use anyhow::Context as _;
use clap::Args;
use services::control::{self, Request};
use services::status::render_table;

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Args)]
pub struct StatusArgs {}

pub fn run(ctx: &Ctx, _args: StatusArgs) -> anyhow::Result<Exit> {
    let sock = control::socket_path(&ctx.prefix);
    let reply = control::request(&sock, &Request::Status)?;
    if !reply.ok {
        anyhow::bail!("{}", reply.error.unwrap_or_default());
    }
    let status = reply.status.context("the supervisor sent no status")?;
    let bad = status
        .processes
        .iter()
        .any(|p| matches!(p.state.as_str(), "failed" | "refused") || p.degraded);
    if ctx.json {
        ctx.print_json(&status)?;
    } else {
        print!("{}", render_table(&status));
    }
    Ok(if bad { Exit::Failed } else { Exit::Ok })
}
