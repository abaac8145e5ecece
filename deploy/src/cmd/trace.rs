//! `deploy trace show FILE`: the analysis of a traced budget miss, again,
//! from the raw text `deploy check --trace` saved (or its JSON, when the
//! text is beside it).
//!
//! Exit: 0 shown, 2 the file cannot be read or is not a saved trace.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Print the analysis of a saved miss: the verdict, what ran on the
    /// receiver's CPU, the wakeup, PI boosts.
    Show(ShowArgs),
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A saved miss (`miss-*.txt`, or its `.json`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

pub fn run(ctx: &Ctx, c: TraceCommand) -> anyhow::Result<Exit> {
    match c {
        TraceCommand::Show(a) => {
            let (_, analysis) = check::trace::load(&a.file)?;
            if ctx.json {
                ctx.print_json(&serde_json::json!({
                    "schema_version": 1,
                    "file": a.file.display().to_string(),
                    "analysis": analysis,
                }))?;
            } else {
                crate::ctx::write_stdout(&analysis.to_text())?;
            }
            Ok(Exit::Ok)
        }
    }
}
