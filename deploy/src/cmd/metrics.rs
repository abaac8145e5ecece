//! `deploy metrics`: the supervisor's status and timing-report metrics in
//! the Prometheus text exposition format (what the supervisor writes to
//! robot.yaml's `metrics.textfile` for node_exporter's textfile
//! collector), on stdout.
//!
//! Exit codes: 0 printed; 2 the supervisor does not answer.

use anyhow::Context as _;
use clap::Args;
use services::control::{self, Request};

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Args)]
pub struct MetricsArgs {}

pub fn run(ctx: &Ctx, _args: MetricsArgs) -> anyhow::Result<Exit> {
    let sock = control::socket_path(&ctx.prefix);
    let reply = control::request(&sock, &Request::Status)?;
    if !reply.ok {
        anyhow::bail!("{}", reply.error.unwrap_or_default());
    }
    let status = reply.status.context("the supervisor sent no status")?;
    crate::ctx::write_stdout(&services::metrics::exposition(&status))?;
    Ok(Exit::Ok)
}
