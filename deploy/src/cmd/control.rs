//! `deploy start|stop|restart NAME`, `deploy stop --all`, `deploy logs
//! NAME [-f]`: requests on the supervisor's control socket.
//!
//! Exit codes: 0 done; 1 the supervisor refused (unknown process, already
//! running, start failed), or `logs` of a process that never started (it
//! says why); 2 the supervisor does not answer, or answers
//! that it is busy (every control connection taken; the message says so
//! and trying again later may succeed).

use clap::Args;
use services::control::{self, Client, Reply, Request};

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Args)]
pub struct StartArgs {
    /// The process, as named in robot.yaml.
    pub name: String,
}

#[derive(Debug, Args)]
pub struct StopArgs {
    /// The process, as named in robot.yaml.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub name: Option<String>,
    /// Stop every process in reverse dependency order, then the supervisor
    /// (as PID 1 it then powers off or reboots when told to).
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct RestartArgs {
    /// The process, as named in robot.yaml.
    pub name: String,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The process, as named in robot.yaml.
    pub name: String,
    /// Keep printing new output until interrupted.
    #[arg(short, long)]
    pub follow: bool,
    /// How many of the last lines to print first.
    #[arg(short = 'n', long, default_value_t = 50)]
    pub lines: usize,
}

fn finish(ctx: &Ctx, reply: Reply) -> anyhow::Result<Exit> {
    if ctx.json {
        ctx.print_json(&reply)?;
    } else if let Some(m) = &reply.message {
        ctx.note(m);
    }
    if reply.ok {
        Ok(Exit::Ok)
    } else {
        eprintln!("deploy: {}", reply.error.unwrap_or_default());
        Ok(Exit::Failed)
    }
}

pub fn run_start(ctx: &Ctx, args: StartArgs) -> anyhow::Result<Exit> {
    let r = control::request(
        &control::socket_path(&ctx.prefix),
        &Request::Start { name: args.name },
    )?;
    finish(ctx, r)
}

pub fn run_stop(ctx: &Ctx, args: StopArgs) -> anyhow::Result<Exit> {
    let req = match args.name {
        Some(name) => Request::Stop { name },
        None => Request::StopAll,
    };
    let r = control::request(&control::socket_path(&ctx.prefix), &req)?;
    finish(ctx, r)
}

pub fn run_restart(ctx: &Ctx, args: RestartArgs) -> anyhow::Result<Exit> {
    let r = control::request(
        &control::socket_path(&ctx.prefix),
        &Request::Restart { name: args.name },
    )?;
    finish(ctx, r)
}

pub fn run_logs(ctx: &Ctx, args: LogsArgs) -> anyhow::Result<Exit> {
    let mut c = Client::connect(&control::socket_path(&ctx.prefix))?;
    let first = c.request(&Request::Logs {
        name: args.name.clone(),
        lines: args.lines,
        follow: args.follow,
    })?;
    if !first.ok {
        eprintln!("deploy: {}", first.error.unwrap_or_default());
        return Ok(Exit::Failed);
    }
    if let Some(m) = &first.message {
        ctx.note(m);
    }
    let lines = first.lines.unwrap_or_default();
    if lines.is_empty() {
        // Nothing to show: say why, from the process's state.
        let status = control::request(&control::socket_path(&ctx.prefix), &Request::Status)
            .ok()
            .and_then(|r| r.status);
        let p = status.and_then(|s| s.processes.into_iter().find(|p| p.name == args.name));
        if let Some(p) = p {
            let why = p
                .reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            if p.pid.is_none() && p.restarts == 0 && p.last_exit.is_none() {
                eprintln!(
                    "deploy: `{}` has no output: it never started (state {}{why}; `deploy status` says more)",
                    args.name, p.state
                );
                if !args.follow {
                    return Ok(Exit::Failed);
                }
            } else if !args.follow {
                ctx.note(format!(
                    "`{}` has printed nothing yet (state {}{why})",
                    args.name, p.state
                ));
            }
        }
    }
    for line in lines {
        println!("{line}");
    }
    if args.follow {
        use std::io::Write as _;
        c.no_timeout()?;
        let mut out = std::io::stdout();
        while let Some(r) = c.next_reply()? {
            if let Some(d) = r.data {
                out.write_all(d.as_bytes())?;
                out.flush()?;
            }
        }
    }
    Ok(Exit::Ok)
}
