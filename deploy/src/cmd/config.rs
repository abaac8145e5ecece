//! `deploy config check`: validate robot.yaml.

use clap::Subcommand;
use serde::Serialize;

use crate::ctx::{Ctx, Exit};
use services::robot::{self as robot_config, Diagnostic, RobotLoadError, Severity};

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Check robot.yaml: every error with file:line:column, the field and
    /// what would be accepted. Exit 0 valid (warnings allowed), 2 invalid.
    Check,
}

#[derive(Serialize)]
struct CheckReport<'a> {
    file: String,
    valid: bool,
    errors: usize,
    warnings: usize,
    diagnostics: &'a [Diagnostic],
}

pub fn run(ctx: &Ctx, cmd: ConfigCommand) -> anyhow::Result<Exit> {
    match cmd {
        ConfigCommand::Check => check(ctx),
    }
}

fn check(ctx: &Ctx) -> anyhow::Result<Exit> {
    let (valid, diagnostics) = match robot_config::load(&ctx.config_path) {
        Ok(loaded) => (true, loaded.warnings),
        Err(RobotLoadError::Invalid { diagnostics, .. }) => (false, diagnostics),
        Err(e) => return Err(e.into()),
    };
    let errors = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let warnings = diagnostics.len() - errors;
    if ctx.json {
        ctx.print_json(&CheckReport {
            file: ctx.config_path.display().to_string(),
            valid,
            errors,
            warnings,
            diagnostics: &diagnostics,
        })?;
    } else {
        for d in &diagnostics {
            if d.severity == Severity::Error || !ctx.quiet {
                eprintln!("{d}");
            }
        }
        if valid {
            ctx.note(format!(
                "{}: valid ({warnings} warning{})",
                ctx.config_path.display(),
                if warnings == 1 { "" } else { "s" }
            ));
        } else {
            eprintln!(
                "deploy: {}: {errors} error{}, {warnings} warning{}",
                ctx.config_path.display(),
                if errors == 1 { "" } else { "s" },
                if warnings == 1 { "" } else { "s" }
            );
        }
    }
    Ok(if valid { Exit::Ok } else { Exit::Error })
}
