//! Boot attempts counted below the kernel, on boards that boot through
//! U-Boot: a system update's new extlinux.conf label is booted at most
//! `limit` times without a verdict; the next boot is the previous label's.
//!
//! Why not U-Boot's own `bootcount`: Debian's U-Boot (`u-boot-qemu`,
//! 2023.01 in bookworm and 2025.01 in trixie) is built without
//! `CONFIG_BOOTCOUNT_LIMIT`, and keeps its environment in the board's
//! flash, which Linux cannot write on the machines it runs on (Debian's
//! arm64 kernel has no `MTD_PHYSMAP`). Both have what a boot script needs:
//! `load` and `save` on a FAT file system, `env import -t`/`env export -t`,
//! `setexpr`, and `pxe_label_override`, which the extlinux boot honours.
//! So the count lives in a small FAT partition that both U-Boot and Linux
//! write (the board's *boot partition*, scanned first: it holds
//! [`SCRIPT_FILE`] and the state), and [`script`] is the boot script that
//! counts: no U-Boot to build, none to maintain.
//!
//! The state is two copies of a few `name=value` lines
//! ([`STATE_FILES`]), written one after the other, each with a generation
//! and a check line repeating its fields: a copy cut short by a power
//! cut fails its check and the other copy is read; of two whole copies
//! the newer generation wins, the first on a tie. Linux writes both with
//! the next generation (an install arms a trial, a verdict clears it);
//! U-Boot rewrites both with the same generation when it counts an
//! attempt.
//!
//! What U-Boot does with it at each boot ([`script`]):
//! - no trial: the extlinux.conf `DEFAULT` label boots, nothing is
//!   written;
//! - a trial with `attempts` below `limit`: `attempts + 1` is written, then
//!   the trial's label boots (through `pxe_label_override`);
//! - `attempts` at `limit`: `limit + 1` is written, then the fallback label
//!   boots, and does so at every boot after until Linux clears the trial;
//! - a count that is not one this code writes (0 to 9): taken as a first
//!   attempt, and said on the console;
//! - neither copy whole: the `DEFAULT` label boots, and the console says
//!   why (neither there at all: a partition never armed, as no trial);
//! - the attempt cannot be written (a full or read-only partition): the
//!   fallback label boots, so that a count that does not move never keeps
//!   a hanging label booting.
//!
//! Linux reads the state with [`read_state`] (what the boot loader did:
//! the attempts used, a fallback), and writes it with [`write_state`]:
//! the install arms the trial before extlinux.conf names the new label
//! `DEFAULT` ([`crate::switch::begin_system_trial`]), and the verdict
//! clears it before the release is committed or after extlinux.conf is
//! put back ([`crate::switch::commit`], [`crate::switch::rollback`]).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{ioe, ReleaseError};
use crate::fault::fault_point;

/// The boot script, at the root of the boot partition, where U-Boot's
/// script boot (`bootmeth script`, or `distro_bootcmd` before it) finds it.
pub const SCRIPT_FILE: &str = "boot.scr";

/// Where an image holds the boot partition's files
/// ([`partition_files`]), for whoever makes the board's disk: not the
/// mount point, which stays empty until the partition is mounted there (a
/// state written into the bare directory would be one U-Boot never
/// reads, so [`write_state`] refuses a directory without the script).
pub const PARTITION_TEMPLATE: &str = "usr/lib/rtdeploy/boot-partition";

/// The two copies of the state, relative to the boot partition, in the
/// order they are read and written.
pub const STATE_FILES: [&str; 2] = ["rtdeploy/state-a.txt", "rtdeploy/state-b.txt"];

/// The largest state copy read (U-Boot loads at most this much: `load
/// ... 1000`, hex). A whole copy is under 600 bytes.
pub const MAX_STATE: u64 = 0x1000;

/// The largest attempt limit: the count written is one digit (U-Boot's
/// `setexpr` computes in hexadecimal, which is decimal below 10).
pub const MAX_LIMIT: u8 = 8;

/// The longest label kept in the state.
pub const MAX_LABEL: usize = 128;

/// Boot attempts as a system update records them: where the boot
/// partition is mounted (relative to the prefix) and the limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootAttempts {
    /// The boot partition's mount point, relative to the prefix
    /// (`boot/rtboot`).
    pub dir: String,
    /// Boots of the new label without a verdict before the fallback boots.
    pub limit: u8,
}

/// What the boot loader had done when Linux read its state at the trial's
/// boot: kept with the trial (status, the rollback's reason).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootLoaderSaw {
    /// The trial's label (the new one).
    pub label: String,
    /// Boots of the new label it started, this one included (when it
    /// booted the new label); `limit + 1` once it gave up.
    pub attempts: u8,
    pub limit: u8,
    /// It booted the fallback label: the limit was used up.
    pub fell_back: bool,
    /// What it found wrong (a copy cut short, a count not one this code
    /// writes, no trial armed), as said on its console too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl BootLoaderSaw {
    /// What [`read_state`] under `dir` says of the trial of `label`.
    pub fn read(dir: &Path, label: &str, limit: u8) -> BootLoaderSaw {
        if let Some(why) = not_the_boot_partition(dir) {
            return BootLoaderSaw {
                label: label.to_string(),
                attempts: 0,
                limit,
                fell_back: false,
                notes: vec![why],
            };
        }
        match read_state(dir) {
            Ok(BootState {
                trial: Some(t),
                notes,
                ..
            }) if t.label == label => BootLoaderSaw {
                fell_back: t.fell_back(),
                label: t.label,
                attempts: t.attempts,
                limit: t.limit,
                notes,
            },
            Ok(s) => BootLoaderSaw {
                label: label.to_string(),
                attempts: 0,
                limit,
                fell_back: false,
                notes: s
                    .notes
                    .into_iter()
                    .chain([match s.trial {
                        Some(t) => format!(
                            "the boot loader counts label {} instead, not this trial's {label}",
                            t.label
                        ),
                        None => format!(
                            "the boot loader held no trial of label {label} (never armed, or cleared)"
                        ),
                    }])
                    .collect(),
            },
            Err(mut notes) => {
                notes.push("neither copy of the boot state is whole: the boot loader booted the default label without counting".into());
                BootLoaderSaw {
                    label: label.to_string(),
                    attempts: 0,
                    limit,
                    fell_back: false,
                    notes,
                }
            }
        }
    }

    /// One line: `boot attempt 2 of 3 of label ...`, or the fallback.
    pub fn describe(&self) -> String {
        let label = &self.label;
        let mut s = if self.fell_back {
            format!(
                "the boot loader gave up on label {label} after {} boot{} without a verdict and booted the previous label",
                self.limit,
                if self.limit == 1 { "" } else { "s" }
            )
        } else if self.attempts > 0 {
            format!(
                "boot attempt {} of {} of label {label}",
                self.attempts, self.limit
            )
        } else {
            format!("label {label} not counted by the boot loader")
        };
        for n in &self.notes {
            s.push_str(&format!(" ({n})"));
        }
        s
    }
}

/// A trial as the boot loader counts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrialBoot {
    /// The new label, booted while attempts remain.
    pub label: String,
    /// The label booted once they are used up.
    pub fallback: String,
    /// Boots of `label` started so far; `limit + 1` once the fallback
    /// booted.
    pub attempts: u8,
    pub limit: u8,
}

impl TrialBoot {
    /// Whether the boot loader has given up on the new label.
    pub fn fell_back(&self) -> bool {
        self.attempts > self.limit
    }
}

/// The state as read: its generation, and the trial if one is armed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootState {
    pub generation: u64,
    pub trial: Option<TrialBoot>,
    /// What was wrong with what was read (a copy cut short, a count this
    /// code does not write), as the boot loader would have said it; empty
    /// when both copies were whole and agreed.
    pub notes: Vec<String>,
}

/// Why a state could not be written.
fn bad_label(label: &str) -> Option<String> {
    if label.is_empty() || label.len() > MAX_LABEL {
        return Some(format!(
            "label `{}` is empty or longer than {MAX_LABEL} bytes",
            label.escape_debug()
        ));
    }
    // The label goes through U-Boot's shell and its environment: nothing
    // that quotes, expands, separates or ends a line there.
    label
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.+@".contains(*c)))
        .map(|c| {
            format!(
                "label `{}` holds `{}`, which the boot script cannot carry (letters, digits and -_.+@ only)",
                label.escape_debug(),
                c.escape_debug()
            )
        })
}

/// One copy's text.
fn render(generation: u64, trial: Option<&TrialBoot>) -> String {
    let (label, fallback, attempts, limit) = match trial {
        Some(t) => (
            t.label.as_str(),
            t.fallback.as_str(),
            t.attempts.to_string(),
            t.limit.to_string(),
        ),
        None => ("", "", String::new(), String::new()),
    };
    format!(
        "rtd_attempts={attempts}\nrtd_check={generation}:{label}:{fallback}:{limit}\nrtd_fallback={fallback}\nrtd_gen={generation}\nrtd_limit={limit}\nrtd_trial={label}\n"
    )
}

/// One copy, parsed: `Err` says why it is not whole.
fn parse(bytes: &[u8]) -> Result<(u64, Option<TrialBoot>, Option<String>), String> {
    // U-Boot's `env export -t` ends the text with a NUL.
    let bytes = bytes.strip_suffix(&[0]).unwrap_or(bytes);
    let text = std::str::from_utf8(bytes).map_err(|_| "not text".to_string())?;
    let mut vars = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("a line without `=`: `{}`", cut(line)));
        };
        if !matches!(
            k,
            "rtd_attempts" | "rtd_check" | "rtd_fallback" | "rtd_gen" | "rtd_limit" | "rtd_trial"
        ) {
            return Err(format!("an unknown name `{}`", cut(k)));
        }
        if vars.insert(k, v).is_some() {
            return Err(format!("`{k}` twice"));
        }
    }
    let get = |k: &str| vars.get(k).copied().unwrap_or("");
    let (gen_text, label, fallback, limit_text) = (
        get("rtd_gen"),
        get("rtd_trial"),
        get("rtd_fallback"),
        get("rtd_limit"),
    );
    if get("rtd_check") != format!("{gen_text}:{label}:{fallback}:{limit_text}") {
        return Err("its check line does not repeat its fields (a copy cut short?)".into());
    }
    let generation: u64 = gen_text
        .parse()
        .map_err(|_| format!("generation `{}` is not a number", cut(gen_text)))?;
    if label.is_empty() {
        return Ok((generation, None, None));
    }
    if let Some(why) = bad_label(label).or_else(|| bad_label(fallback)) {
        return Err(why);
    }
    let limit = match limit_text.parse::<u8>() {
        Ok(l @ 1..=MAX_LIMIT) => l,
        _ => {
            return Err(format!(
                "attempt limit `{}` is not 1 to {MAX_LIMIT}",
                cut(limit_text)
            ))
        }
    };
    let attempts_text = get("rtd_attempts");
    let (attempts, note) = match attempts_text.parse::<u8>() {
        Ok(n) if attempts_text.len() == 1 && n <= 9 => (n.min(limit + 1), None),
        _ => (
            0,
            Some(format!(
                "boot attempt count `{}` is not one rtdeploy writes: taken as a first attempt",
                cut(attempts_text)
            )),
        ),
    };
    Ok((
        generation,
        Some(TrialBoot {
            label: label.to_string(),
            fallback: fallback.to_string(),
            attempts,
            limit,
        }),
        note,
    ))
}

fn cut(s: &str) -> String {
    let mut out: String = s.chars().take(40).collect::<String>();
    if out.len() < s.len() {
        out.push('…');
    }
    out.escape_debug().to_string()
}

/// Reads the state under `dir` (the boot partition as mounted) as U-Boot
/// does: the whole copy of the newer generation, the first on a tie.
/// `Err` only when neither copy is whole (its reasons); a partition with
/// no state at all reads as no trial.
pub fn read_state(dir: &Path) -> Result<BootState, Vec<String>> {
    let mut whole = Vec::new();
    let mut notes = Vec::new();
    let mut missing = 0;
    for name in STATE_FILES {
        let path = dir.join(name);
        match units::bounded::Bound::regular(MAX_STATE).read(&path) {
            Ok(b) => match parse(&b) {
                Ok(c) => whole.push(c),
                Err(why) => notes.push(format!("{}: {why}", path.display())),
            },
            Err(e) if e.is_not_found() => {
                missing += 1;
                notes.push(format!("{}: missing", path.display()));
            }
            Err(e) => notes.push(format!("{}: {e}", path.display())),
        }
    }
    if missing == STATE_FILES.len() {
        return Ok(BootState {
            generation: 0,
            trial: None,
            notes: Vec::new(),
        });
    }
    // max_by_key keeps the last of equals: reversed, the first copy wins a tie.
    let Some((generation, trial, note)) = whole.into_iter().rev().max_by_key(|c| c.0) else {
        return Err(notes);
    };
    notes.extend(note);
    Ok(BootState {
        generation,
        trial,
        notes,
    })
}

/// Writes both copies under `dir` with the generation after the newest
/// read: `trial` armed (attempts 0), or none. Each copy is written in
/// place and fsync'd before the next (a FAT rename is not atomic: the
/// other copy is what survives a cut).
pub fn write_state(dir: &Path, trial: Option<(&str, &str, u8)>) -> Result<u64, ReleaseError> {
    let trial = match trial {
        Some((label, fallback, limit)) => {
            if let Some(why) = bad_label(label).or_else(|| bad_label(fallback)) {
                return Err(ReleaseError::BootAttempts { why });
            }
            if !(1..=MAX_LIMIT).contains(&limit) {
                return Err(ReleaseError::BootAttempts {
                    why: format!("attempt limit {limit} is not 1 to {MAX_LIMIT}"),
                });
            }
            Some(TrialBoot {
                label: label.into(),
                fallback: fallback.into(),
                attempts: 0,
                limit,
            })
        }
        None => None,
    };
    if let Some(why) = not_the_boot_partition(dir) {
        return Err(ReleaseError::BootAttempts { why });
    }
    let generation = match read_state(dir) {
        Ok(s) => s.generation,
        // Neither copy whole: the highest generation either line names.
        Err(_) => 0,
    }
    .max(max_generation_named(dir))
    .saturating_add(1);
    let text = render(generation, trial.as_ref());
    let sub = dir.join("rtdeploy");
    fs::create_dir_all(&sub).map_err(ioe(&sub))?;
    for (i, name) in STATE_FILES.iter().enumerate() {
        let path = dir.join(name);
        let existed = path.exists();
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(ioe(&path))?;
        f.write_all(text.as_bytes()).map_err(ioe(&path))?;
        f.sync_all().map_err(ioe(&path))?;
        if !existed {
            fs::File::open(&sub)
                .and_then(|d| d.sync_all())
                .map_err(ioe(&sub))?;
        }
        if i == 0 {
            fault_point("attempts-first-copy");
        }
    }
    Ok(generation)
}

/// Why `dir` is not the boot partition as mounted: it holds no
/// [`SCRIPT_FILE`] (a state written there would be one U-Boot never
/// reads).
fn not_the_boot_partition(dir: &Path) -> Option<String> {
    (!dir.join(SCRIPT_FILE).is_file()).then(|| {
        format!(
            "{} holds no {SCRIPT_FILE}: the boot partition is not mounted there",
            dir.display()
        )
    })
}

/// The largest `rtd_gen=` either copy names, whole or not, so that a
/// write after a damaged copy still wins over it.
fn max_generation_named(dir: &Path) -> u64 {
    STATE_FILES
        .iter()
        .filter_map(|n| {
            units::bounded::Bound::regular(MAX_STATE)
                .read(&dir.join(n))
                .ok()
        })
        .flat_map(|b| {
            String::from_utf8_lossy(&b)
                .lines()
                .filter_map(|l| l.strip_prefix("rtd_gen=")?.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .max()
        .unwrap_or(0)
        .min(u64::MAX / 2)
}

/// The boot script's text: counts the trial's attempts in the state
/// beside it and boots extlinux.conf with the label it chose: U-Boot
/// 2025.01 finds it by `bootflow scan` on any bootable partition, 2023.01
/// by `sysboot` on the partition after the boot partition (the root file
/// system, `/boot/extlinux/extlinux.conf`). Runs on both alike.
pub fn script() -> String {
    let [a, b] = STATE_FILES;
    let whitelist = (0..=9).map(|n| n.to_string()).collect::<Vec<_>>().join(" ");
    format!(
        r#"# rtdeploy: boot attempts of a system update's new label, counted in
# {a} and {b} beside this script (two copies: each
# whole or refused by its check line; the newer generation wins).
# Generated; see the releases crate's boot_attempts module.
setenv rtd_dev "${{devtype}} ${{devnum}}:${{distro_bootpart}}"
setenv rtd_read 'setenv rtd_gen; setenv rtd_trial; setenv rtd_fallback; setenv rtd_attempts; setenv rtd_limit; setenv rtd_check; setenv rtd_ok; if load ${{rtd_dev}} ${{scriptaddr}} ${{rtd_file}} 1000; then setenv rtd_seen 1; env import -t ${{scriptaddr}} ${{filesize}} rtd_gen rtd_trial rtd_fallback rtd_attempts rtd_limit rtd_check; fi; if test -n "${{rtd_gen}}" && test "${{rtd_check}}" = "${{rtd_gen}}:${{rtd_trial}}:${{rtd_fallback}}:${{rtd_limit}}"; then setenv rtd_ok 1; fi'
setenv rtd_seen
setenv rtd_file {a}
run rtd_read
setenv rtd_ok_a ${{rtd_ok}}
setenv rtd_gen_a ${{rtd_gen}}
setenv rtd_file {b}
run rtd_read
if test -n "${{rtd_ok_a}}"; then
  if test -z "${{rtd_ok}}" || test ${{rtd_gen_a}} -ge ${{rtd_gen}}; then
    setenv rtd_file {a}
    run rtd_read
  fi
fi
setenv pxe_label_override
if test -z "${{rtd_ok}}"; then
  if test -n "${{rtd_seen}}"; then
    echo "rtdeploy: neither copy of the boot state is whole: booting the default label"
  fi
elif test -n "${{rtd_trial}}"; then
  setenv rtd_n
  for n in {whitelist}; do if test "${{rtd_attempts}}" = "$n"; then setenv rtd_n $n; fi; done
  if test -z "${{rtd_n}}"; then
    echo "rtdeploy: boot attempt count [${{rtd_attempts}}] is not one rtdeploy writes: taken as a first attempt"
    setenv rtd_n 0
  fi
  if test ${{rtd_n}} -ge ${{rtd_limit}}; then
    echo "rtdeploy: label ${{rtd_trial}} failed ${{rtd_limit}} boot attempts: booting label ${{rtd_fallback}}"
    setenv pxe_label_override ${{rtd_fallback}}
    setexpr rtd_next ${{rtd_limit}} + 1
  else
    setexpr rtd_next ${{rtd_n}} + 1
    echo "rtdeploy: boot attempt ${{rtd_next}} of ${{rtd_limit}} of label ${{rtd_trial}}"
    setenv pxe_label_override ${{rtd_trial}}
  fi
  if test "${{rtd_next}}" != "${{rtd_attempts}}"; then
    setenv rtd_attempts ${{rtd_next}}
    env export -t ${{scriptaddr}} rtd_attempts rtd_check rtd_fallback rtd_gen rtd_limit rtd_trial
    if save ${{rtd_dev}} ${{scriptaddr}} {a} ${{filesize}} && save ${{rtd_dev}} ${{scriptaddr}} {b} ${{filesize}}; then
      echo "rtdeploy: attempt recorded"
    else
      echo "rtdeploy: the attempt cannot be recorded: booting label ${{rtd_fallback}}"
      setenv pxe_label_override ${{rtd_fallback}}
    fi
  fi
fi
if bootmeth order extlinux; then bootflow scan -lb; fi
setexpr rtd_root ${{distro_bootpart}} + 1
sysboot ${{devtype}} ${{devnum}}:${{rtd_root}} any ${{scriptaddr}} /boot/extlinux/extlinux.conf
echo "rtdeploy: no label of extlinux.conf booted: resetting"
reset
"#
    )
}

/// `text` as a U-Boot script image (`mkimage -A arm64 -O linux -T script
/// -C none`): the legacy 64-byte header, big-endian, with the CRC-32 of
/// the header and of the data, then the data: the script's length, a
/// zero ending the list of parts, and the script.
pub fn script_image(text: &str) -> Vec<u8> {
    const MAGIC: u32 = 0x2705_1956;
    const OS_LINUX: u8 = 5;
    const ARCH_ARM64: u8 = 22;
    const TYPE_SCRIPT: u8 = 6;
    const COMP_NONE: u8 = 0;
    let mut data = Vec::with_capacity(text.len() + 8);
    data.extend_from_slice(&(text.len() as u32).to_be_bytes());
    data.extend_from_slice(&0u32.to_be_bytes());
    data.extend_from_slice(text.as_bytes());
    let mut name = [0u8; 32];
    let title = b"rtdeploy boot attempts";
    name[..title.len()].copy_from_slice(title);
    let header = |hcrc: u32| {
        let mut h = Vec::with_capacity(64);
        for w in [
            MAGIC,
            hcrc,
            0, // time: none, so the image is reproducible
            data.len() as u32,
            0, // load address
            0, // entry point
            crc32fast::hash(&data),
        ] {
            h.extend_from_slice(&w.to_be_bytes());
        }
        h.extend_from_slice(&[OS_LINUX, ARCH_ARM64, TYPE_SCRIPT, COMP_NONE]);
        h.extend_from_slice(&name);
        h
    };
    let mut out = header(crc32fast::hash(&header(0)));
    out.extend_from_slice(&data);
    out
}

/// The boot partition's files for a board counting attempts: the script
/// and an unarmed state (relative path, contents). `deploy image` puts
/// them in [`PARTITION_TEMPLATE`].
pub fn partition_files() -> Vec<(PathBuf, Vec<u8>)> {
    let idle = render(1, None).into_bytes();
    vec![
        (SCRIPT_FILE.into(), script_image(&script())),
        (STATE_FILES[0].into(), idle.clone()),
        (STATE_FILES[1].into(), idle),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A boot partition: its script, no state yet.
    fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join(SCRIPT_FILE), script_image(&script())).unwrap();
        d
    }

    #[test]
    fn a_trial_is_armed_read_and_cleared_with_rising_generations() {
        let d = dir();
        assert_eq!(read_state(d.path()).unwrap().trial, None);
        assert_eq!(
            write_state(d.path(), Some(("rtdeploy-r2", "primary", 3))).unwrap(),
            1
        );
        let s = read_state(d.path()).unwrap();
        assert_eq!(s.generation, 1);
        assert_eq!(
            s.trial,
            Some(TrialBoot {
                label: "rtdeploy-r2".into(),
                fallback: "primary".into(),
                attempts: 0,
                limit: 3
            })
        );
        assert!(s.notes.is_empty(), "{:?}", s.notes);
        assert_eq!(write_state(d.path(), None).unwrap(), 2);
        let s = read_state(d.path()).unwrap();
        assert_eq!((s.generation, s.trial), (2, None));
    }

    /// The text U-Boot writes back (`env export -t`: the same lines, a
    /// NUL at the end) reads as the count it recorded.
    #[test]
    fn the_boot_loaders_count_is_read_and_a_fallback_seen() {
        let d = dir();
        write_state(d.path(), Some(("new", "old", 2))).unwrap();
        for name in STATE_FILES {
            let p = d.path().join(name);
            let t = fs::read_to_string(&p)
                .unwrap()
                .replace("rtd_attempts=0", "rtd_attempts=3");
            fs::write(&p, format!("{t}\0")).unwrap();
        }
        let t = read_state(d.path()).unwrap().trial.unwrap();
        assert_eq!(t.attempts, 3);
        assert!(t.fell_back());
    }

    #[test]
    fn a_copy_cut_short_is_refused_and_the_other_read() {
        let d = dir();
        write_state(d.path(), Some(("new", "old", 3))).unwrap();
        write_state(d.path(), None).unwrap();
        // Copy A cut in the middle of its rewrite: B (generation 2) holds.
        let a = d.path().join(STATE_FILES[0]);
        let text = fs::read(&a).unwrap();
        fs::write(&a, &text[..text.len() / 2]).unwrap();
        let s = read_state(d.path()).unwrap();
        assert_eq!((s.generation, s.trial.is_none()), (2, true));
        assert!(s.notes[0].contains("state-a.txt"), "{:?}", s.notes);
        // The next write goes past both.
        assert_eq!(write_state(d.path(), Some(("n2", "old", 3))).unwrap(), 3);
        // Both damaged: refused, with both reasons.
        for n in STATE_FILES {
            fs::write(d.path().join(n), "rtd_gen=9\nrtd_trial=x\n").unwrap();
        }
        let why = read_state(d.path()).unwrap_err();
        assert_eq!(why.len(), 2);
        assert!(why[0].contains("check line"), "{why:?}");
        assert_eq!(write_state(d.path(), None).unwrap(), 10);
    }

    #[test]
    fn the_newer_copy_wins_and_the_first_on_a_tie() {
        let d = dir();
        write_state(d.path(), Some(("new", "old", 3))).unwrap();
        let a = d.path().join(STATE_FILES[0]);
        let b = d.path().join(STATE_FILES[1]);
        // A power cut between the two copies of a clearing write: A is
        // newer, and wins.
        fs::write(&a, render(2, None)).unwrap();
        assert_eq!(read_state(d.path()).unwrap().trial, None);
        // U-Boot counted in A, not yet in B (same generation): A wins.
        let t = |n| TrialBoot {
            label: "new".into(),
            fallback: "old".into(),
            attempts: n,
            limit: 3,
        };
        fs::write(&a, render(5, Some(&t(2)))).unwrap();
        fs::write(&b, render(5, Some(&t(1)))).unwrap();
        assert_eq!(read_state(d.path()).unwrap().trial.unwrap().attempts, 2);
    }

    #[test]
    fn garbage_is_refused_or_taken_as_a_first_attempt_and_said() {
        let d = dir();
        fs::create_dir_all(d.path().join("rtdeploy")).unwrap();
        let put = |text: &str| {
            for n in STATE_FILES {
                fs::write(d.path().join(n), text).unwrap();
            }
        };
        put("rtd_gen=4\nrtd_trial=new\nrtd_fallback=old\nrtd_limit=3\nrtd_attempts=zz\nrtd_check=4:new:old:3\n");
        let s = read_state(d.path()).unwrap();
        assert_eq!(s.trial.unwrap().attempts, 0);
        assert!(
            s.notes[0].contains("taken as a first attempt"),
            "{:?}",
            s.notes
        );
        for (text, why) in [
            ("rtd_gen=4\nrtd_trial=new\nrtd_fallback=old\nrtd_limit=77\nrtd_attempts=1\nrtd_check=4:new:old:77\n", "limit"),
            ("rtd_gen=4\nrtd_trial=n;reset\nrtd_fallback=old\nrtd_limit=3\nrtd_attempts=1\nrtd_check=4:n;reset:old:3\n", "cannot carry"),
            ("rtd_gen=4\nrtd_gen=5\n", "twice"),
            ("bootcmd=reset\n", "unknown name"),
            ("\u{fffd}\u{fffd}", "without `=`"),
        ] {
            put(text);
            let e = read_state(d.path()).unwrap_err();
            assert!(e[0].contains(why), "{text:?}: {e:?}");
        }
        fs::write(d.path().join(STATE_FILES[0]), vec![b'x'; 1 << 20]).unwrap();
        let e = read_state(d.path()).unwrap_err();
        assert!(e[0].contains("state-a.txt"), "{e:?}");
        // Nothing the script cannot carry is written.
        for (l, f, n) in [
            ("a b", "old", 3),
            ("new", "", 3),
            ("new", "old", 0),
            ("new", "old", 9),
        ] {
            assert!(
                write_state(d.path(), Some((l, f, n))).is_err(),
                "{l:?} {f:?} {n}"
            );
        }
        assert!(write_state(&d.path().join("absent"), None).is_err());
        // A directory without the script (the mount point, the partition
        // not mounted): refused, nothing written.
        let bare = tempfile::tempdir().unwrap();
        let e = write_state(bare.path(), None).unwrap_err().to_string();
        assert!(
            e.contains("holds no boot.scr: the boot partition is not mounted there"),
            "{e}"
        );
        assert!(!bare.path().join("rtdeploy").exists());
        let saw = BootLoaderSaw::read(bare.path(), "new", 3);
        assert_eq!(saw.label, "new");
        assert!(saw.notes[0].contains("not mounted"), "{saw:?}");
    }

    #[test]
    fn the_script_image_has_u_boots_header_and_checksums() {
        let text = script();
        let img = script_image(&text);
        let be = |i: usize| u32::from_be_bytes(img[i..i + 4].try_into().unwrap());
        assert_eq!(be(0), 0x2705_1956);
        assert_eq!(be(12) as usize, img.len() - 64);
        assert_eq!(be(24), crc32fast::hash(&img[64..]));
        let mut h = img[..64].to_vec();
        h[4..8].fill(0);
        assert_eq!(be(4), crc32fast::hash(&h));
        assert_eq!(&img[28..32], &[5, 22, 6, 0]);
        assert_eq!(
            u32::from_be_bytes(img[64..68].try_into().unwrap()) as usize,
            text.len()
        );
        assert_eq!(&img[72..], text.as_bytes());
        assert!(text.contains("sysboot ${devtype} ${devnum}:${rtd_root} any"));
        // U-Boot's shell reads the script: no tab, no CR, ASCII only.
        assert!(text.is_ascii() && !text.contains(['\t', '\r']));
    }
}
