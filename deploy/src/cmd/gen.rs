//! `deploy gen --lang rust|c|python|ros2 FILE.msg... [--out DIR]`: a message
//! type in each language from its description (`messages`), all carrying
//! the layout hash a channel records, so that Rust, C, C++ and Python
//! processes made from one description share a channel and any other is
//! refused. Every description given is one set (they may use one
//! another); one file is written per description (`name.rs`, holding its
//! own struct and naming those it uses, which go in the same module;
//! `Name.h` and `name.py`, each whole with what it uses), or, without
//! `--out`, all of them to standard output (Rust: one module, each type
//! once).
//! Exit: 0 written, 2 a description refused (with its line and column).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use messages::{Description, Set};

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Lang {
    /// `controller::shm_struct!`, its hash checked at compile time.
    Rust,
    /// A C11 (and C++) header: the struct, its layout checked by the
    /// compiler, its `rtd_type` for `rtdeploy.h`.
    C,
    /// A `ctypes.Structure` with a numpy dtype, its layout checked on import.
    Python,
    /// What ROS 2 knows the type by (JSON): `package/msg/Name`, the DDS
    /// name, the RIHS01 type hash, the ros2msg schema and the type
    /// description the hash is over.
    Ros2,
}

#[derive(Debug, Args)]
pub struct GenArgs {
    /// The language to write.
    #[arg(long, value_enum)]
    pub lang: Lang,
    /// Where to write one file per description (standard output when absent).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The descriptions (`.msg`), one set: each may use the others by name.
    #[arg(required = true, value_name = "FILE.msg")]
    pub files: Vec<PathBuf>,
}

pub fn run(_ctx: &Ctx, args: GenArgs) -> anyhow::Result<Exit> {
    let mut descriptions = Vec::new();
    for f in &args.files {
        let text = units::bounded::Bound::regular(messages::MAX_TEXT as u64)
            .read_lossy(f)
            .with_context(|| format!("cannot read {}", f.display()))?;
        match Description::parse(&f.to_string_lossy(), &text) {
            Ok(d) => descriptions.push(d),
            Err(e) => {
                eprintln!("deploy gen: {e}");
                return Ok(Exit::Error);
            }
        }
    }
    let names: Vec<String> = descriptions.iter().map(|d| d.name.clone()).collect();
    let set = match Set::new(descriptions) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("deploy gen: {e}");
            return Ok(Exit::Error);
        }
    };
    // Rust to standard output: one module, each type once.
    if args.out.is_none() && matches!(args.lang, Lang::Rust) {
        return match messages::rust_set(&set) {
            Ok(t) => {
                crate::ctx::write_stdout(&t)?;
                Ok(Exit::Ok)
            }
            Err(e) => {
                eprintln!("deploy gen: {e}");
                Ok(Exit::Error)
            }
        };
    }
    let mut all = String::new();
    for name in &names {
        let text = match args.lang {
            Lang::Rust => messages::rust(&set, name),
            Lang::C => messages::c(&set, name),
            Lang::Python => messages::python(&set, name),
            Lang::Ros2 => set.ros2_json(name),
        };
        let text = match text {
            Ok(t) => t,
            Err(e) => {
                eprintln!("deploy gen: {e}");
                return Ok(Exit::Error);
            }
        };
        match &args.out {
            Some(dir) => {
                let file = dir.join(match args.lang {
                    Lang::Rust => format!("{}.rs", name.to_ascii_lowercase()),
                    Lang::C => format!("{name}.h"),
                    Lang::Python => format!("{}.py", name.to_ascii_lowercase()),
                    Lang::Ros2 => format!("{name}.ros2.json"),
                });
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                std::fs::write(&file, text)
                    .with_context(|| format!("cannot write {}", file.display()))?;
                eprintln!("deploy gen: {}", file.display());
            }
            None => all.push_str(&text),
        }
    }
    if args.out.is_none() {
        crate::ctx::write_stdout(&all)?;
    }
    Ok(Exit::Ok)
}
