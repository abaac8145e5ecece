//! Jetson rootfs A/B slots as Linux sees them: what L4TLauncher (NVIDIA's
//! UEFI boot application) decided at this boot, read from its UEFI
//! variables and from `nvbootctrl -t rootfs dump-slots-info`, and the one
//! command that marks a boot good (`nvbootctrl verify`).
//!
//! What this follows, from NVIDIA's own sources (not copied):
//! - the variables, UINT32 under the vendor GUID
//!   `781e084c-a330-417c-b678-38e696380cb9` (`gNVIDIAPublicVariableGuid`,
//!   edk2-nvidia `Silicon/NVIDIA/NVIDIA.dec`): `RootfsStatusSlotA`,
//!   `RootfsStatusSlotB` (0 normal, 0xFF unbootable), `RootfsRedundancyLevel`
//!   (0 boot loader only, 1 boot loader and rootfs) and
//!   `RootfsRetryCountMax` (edk2-nvidia r36.4.3
//!   `Silicon/NVIDIA/Application/L4TLauncher/L4TRootfsValidation.c`,
//!   `Silicon/NVIDIA/Include/NVIDIAConfiguration.h`); the redundancy level
//!   and the retry maximum are set at flash time (`ROOTFS_AB=1`,
//!   `ROOTFS_RETRY_COUNT_MAX` 1 to 3, Linux_for_Tegra `flash.sh` R35.3.1
//!   and R36.2) and locked at run time, so Linux only reads them;
//! - the per-slot retry count lives in a scratch register (two bits a
//!   slot, so at most 3): at each boot L4TLauncher takes one from the
//!   current slot's count; at zero it writes 0xFF to that slot's status and
//!   switches the boot chain to the other slot if its count is above zero
//!   (`ValidateRootfsStatus`, same file); a cold boot sets the counts back
//!   to the maximum, a warm reset (the watchdog's) keeps them;
//! - `nvbootctrl -t rootfs dump-slots-info` prints `Current rootfs slot:`,
//!   `Active rootfs slot:`, `num_slots:` and one `slot: N, retry_count: N,
//!   status: normal|unbootable` line a slot, or `RootFS A/B is not
//!   enabled.` (strings of `nvbootctrl` in `nvidia-l4t-tools` R35.3.1);
//!   `nvbootctrl verify` is what `nv-l4t-bootloader-config.service` runs
//!   once the rootfs validation passed, and resets the retry count
//!   (`nvidia-l4t-init` R35.3.1; NVIDIA's answer in its forum thread
//!   "Logic for retry count").
//!
//! The efivarfs files begin with the variable's 4-byte attributes, then
//! the value (the kernel's efivarfs documentation): each is read as
//! exactly 8 bytes, anything else refused, naming the file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// NVIDIA's public variable GUID, as efivarfs names the files.
pub const NVIDIA_GUID: &str = "781e084c-a330-417c-b678-38e696380cb9";

/// Where efivarfs is mounted, relative to the system root.
pub const EFIVARS: &str = "sys/firmware/efi/efivars";

/// A slot status that L4TLauncher gave up on.
pub const UNBOOTABLE: u32 = 0xFF;

/// The longest `nvbootctrl` output read (a few lines a slot).
const MAX_OUTPUT: usize = 16 << 10;

/// How long `nvbootctrl` may take, by default.
pub const NVBOOTCTRL_TIMEOUT: Duration = Duration::from_secs(20);

/// The rootfs slots as the firmware's variables say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variables {
    /// `RootfsRedundancyLevel` is 1: rootfs A/B is on.
    pub rootfs_ab: bool,
    /// `RootfsRetryCountMax` (absent: the firmware's default).
    pub retry_max: Option<u32>,
    /// `RootfsStatusSlotA` and `B` is 0xFF.
    pub unbootable: [bool; 2],
}

/// Reads one UINT32 variable under `dir`: `None` when absent.
fn read_u32(dir: &Path, name: &str) -> Result<Option<u32>, String> {
    let path = dir.join(format!("{name}-{NVIDIA_GUID}"));
    let b = match units::bounded::Bound::pseudo(64).read(&path) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    // 4 bytes of attributes, then the UINT32, little-endian.
    if b.len() != 8 {
        return Err(format!(
            "{}: {} bytes, not the 4 of its attributes and the 4 of a UINT32",
            path.display(),
            b.len()
        ));
    }
    Ok(Some(u32::from_le_bytes([b[4], b[5], b[6], b[7]])))
}

impl Variables {
    /// From efivarfs under `sysroot`; `Err` names the file that is not a
    /// UINT32 variable.
    pub fn read(sysroot: &Path) -> Result<Variables, String> {
        Variables::read_efivars(&sysroot.join(EFIVARS))
    }

    /// From the efivarfs directory `dir` (`/sys/firmware/efi/efivars`).
    pub fn read_efivars(dir: &Path) -> Result<Variables, String> {
        let dir = dir.to_path_buf();
        let status = |n| -> Result<bool, String> {
            Ok(match read_u32(&dir, n)? {
                None | Some(0) => false,
                Some(UNBOOTABLE) => true,
                Some(v) => {
                    return Err(format!(
                        "{n} is {v:#x}, neither 0 (normal) nor 0xff (unbootable)"
                    ))
                }
            })
        };
        Ok(Variables {
            rootfs_ab: read_u32(&dir, "RootfsRedundancyLevel")? == Some(1),
            retry_max: read_u32(&dir, "RootfsRetryCountMax")?,
            unbootable: [status("RootfsStatusSlotA")?, status("RootfsStatusSlotB")?],
        })
    }
}

/// One slot of `dump-slots-info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    pub retry_count: u32,
    pub unbootable: bool,
}

/// `nvbootctrl -t rootfs dump-slots-info`, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotsInfo {
    /// The slot this boot runs from (0 is A).
    pub current: usize,
    /// The slot the next boot starts from.
    pub active: usize,
    pub slots: Vec<Slot>,
}

fn slot_index(s: &str) -> Option<usize> {
    match s.trim() {
        "A" | "a" | "0" => Some(0),
        "B" | "b" | "1" => Some(1),
        _ => None,
    }
}

/// The slot's letter.
pub fn slot_name(i: usize) -> char {
    if i == 0 {
        'A'
    } else {
        'B'
    }
}

impl SlotsInfo {
    /// Parses the dump; `Ok(None)`: rootfs A/B is not enabled. Anything
    /// that is not the format is refused, naming the line.
    pub fn parse(text: &str) -> Result<Option<SlotsInfo>, String> {
        if text
            .lines()
            .any(|l| l.trim() == "RootFS A/B is not enabled.")
        {
            return Ok(None);
        }
        let (mut current, mut active, mut num) = (None, None, None);
        let mut slots: Vec<(usize, Slot)> = Vec::new();
        let bad = |l: &str| {
            format!(
                "nvbootctrl: a line not in its format: `{}`",
                l.escape_debug()
            )
        };
        for l in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(v) = l.strip_prefix("Current rootfs slot:") {
                current = Some(slot_index(v).ok_or_else(|| bad(l))?);
            } else if let Some(v) = l.strip_prefix("Active rootfs slot:") {
                active = Some(slot_index(v).ok_or_else(|| bad(l))?);
            } else if let Some(v) = l.strip_prefix("num_slots:") {
                num = Some(v.trim().parse::<usize>().map_err(|_| bad(l))?);
            } else if l.starts_with("slot:") {
                let mut idx = None;
                let mut retry = None;
                let mut status = None;
                for part in l.split(',') {
                    let (k, v) = part.split_once(':').ok_or_else(|| bad(l))?;
                    match k.trim() {
                        "slot" => idx = v.trim().parse::<usize>().ok(),
                        "retry_count" => retry = v.trim().parse::<u32>().ok(),
                        "status" => {
                            status = match v.trim() {
                                "normal" => Some(false),
                                "unbootable" => Some(true),
                                _ => None,
                            }
                        }
                        _ => return Err(bad(l)),
                    }
                }
                match (idx, retry, status) {
                    (Some(i @ 0..=1), Some(r @ 0..=3), Some(u)) => slots.push((
                        i,
                        Slot {
                            retry_count: r,
                            unbootable: u,
                        },
                    )),
                    _ => return Err(bad(l)),
                }
            }
            // Other lines (a version, a note of the tool's) are not ours.
        }
        let (Some(current), Some(active), Some(2)) = (current, active, num) else {
            return Err("nvbootctrl: no current and active rootfs slot of two".into());
        };
        slots.sort_by_key(|s| s.0);
        if slots.iter().map(|s| s.0).collect::<Vec<_>>() != [0, 1] {
            return Err("nvbootctrl: not one line for each of slots 0 and 1".into());
        }
        Ok(Some(SlotsInfo {
            current,
            active,
            slots: slots.into_iter().map(|s| s.1).collect(),
        }))
    }
}

/// `nvbootctrl`, at a path (`/usr/sbin/nvbootctrl` on Jetson Linux).
#[derive(Debug, Clone)]
pub struct Nvbootctrl {
    pub path: PathBuf,
    /// How long one command may take before it is killed.
    pub timeout: Duration,
}

impl Nvbootctrl {
    pub fn new(path: impl Into<PathBuf>) -> Nvbootctrl {
        Nvbootctrl {
            path: path.into(),
            timeout: NVBOOTCTRL_TIMEOUT,
        }
    }

    fn run(&self, args: &[&str]) -> Result<String, String> {
        let mut child = Command::new(&self.path)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        // Bounded in time: a tool that hangs (it reads /dev/mem) is killed.
        let started = std::time::Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if started.elapsed() > self.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "{} {}: no answer within {:?}: killed",
                        self.path.display(),
                        args.join(" "),
                        self.timeout
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("{}: {e}", self.path.display())),
            }
        };
        // At most MAX_OUTPUT of each (a tool that writes more than a pipe
        // holds blocks, and is killed at the timeout above).
        fn read(r: Option<impl std::io::Read>) -> String {
            let mut b = Vec::new();
            if let Some(r) = r {
                let _ = std::io::Read::read_to_end(&mut r.take(MAX_OUTPUT as u64), &mut b);
            }
            String::from_utf8_lossy(&b).into_owned()
        }
        let out = read(child.stdout.take());
        let err = read(child.stderr.take());
        if !status.success() {
            return Err(format!(
                "{} {}: {status}: {}",
                self.path.display(),
                args.join(" "),
                err.trim()
            ));
        }
        Ok(out)
    }

    /// The rootfs slots (`None`: rootfs A/B is not enabled).
    pub fn slots(&self) -> Result<Option<SlotsInfo>, String> {
        SlotsInfo::parse(&self.run(&["-t", "rootfs", "dump-slots-info"])?)
    }

    /// Marks this boot good: the retry count of the slot booted is reset.
    /// Only once the boot is good (the supervisor's verdict).
    pub fn mark_good(&self) -> Result<(), String> {
        self.run(&["verify"]).map(|_| ())
    }

    /// Makes `slot` the one the next boot starts from.
    pub fn set_active(&self, slot: usize) -> Result<(), String> {
        self.run(&["-t", "rootfs", "set-active-boot-slot", &slot.to_string()])
            .map(|_| ())
    }
}

/// What the firmware did with a system update written to slot `target`:
/// booted it (with the retries left), or gave up on it and booted the
/// other one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SlotOutcome {
    /// This boot runs from the target slot.
    Booted { slot: char, retries_left: u32 },
    /// The target slot was marked unbootable and the other slot booted.
    FellBack { from: char, to: char },
    /// This boot runs from the other slot and the target is not marked
    /// unbootable: the switch to it never happened (not activated, or a
    /// cold boot chose otherwise).
    NotBooted { slot: char, running: char },
}

impl SlotOutcome {
    /// From the slots and the variables at this boot, for an update
    /// written to slot `target`.
    pub fn of(info: &SlotsInfo, vars: &Variables, target: usize) -> SlotOutcome {
        if info.current == target {
            SlotOutcome::Booted {
                slot: slot_name(target),
                retries_left: info.slots[target].retry_count,
            }
        } else if info.slots[target].unbootable || vars.unbootable[target] {
            SlotOutcome::FellBack {
                from: slot_name(target),
                to: slot_name(info.current),
            }
        } else {
            SlotOutcome::NotBooted {
                slot: slot_name(target),
                running: slot_name(info.current),
            }
        }
    }

    pub fn describe(&self) -> String {
        match self {
            SlotOutcome::Booted { slot, retries_left } => {
                format!("booted rootfs slot {slot} ({retries_left} retries left)")
            }
            SlotOutcome::FellBack { from, to } => format!(
                "the firmware marked rootfs slot {from} unbootable after its retries and booted slot {to}"
            ),
            SlotOutcome::NotBooted { slot, running } => {
                format!("rootfs slot {slot} was not booted: this boot runs from slot {running}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "Current rootfs slot: B\nActive rootfs slot: B\nnum_slots: 2\nslot: 0,             retry_count: 3,             status: normal\nslot: 1,             retry_count: 2,             status: normal\n";

    #[test]
    fn the_dump_is_read_and_anything_else_refused() {
        let s = SlotsInfo::parse(DUMP).unwrap().unwrap();
        assert_eq!((s.current, s.active), (1, 1));
        assert_eq!(s.slots[1].retry_count, 2);
        assert_eq!(
            SlotsInfo::parse("RootFS A/B is not enabled.\n").unwrap(),
            None
        );
        for bad in [
            DUMP.replace("status: normal", "status: weird"),
            DUMP.replace("retry_count: 2", "retry_count: 9"),
            DUMP.replace("num_slots: 2", "num_slots: 3"),
            DUMP.replace("slot: 1,", "slot: 0,"),
            DUMP.replace("Current rootfs slot: B", "Current rootfs slot: C"),
            String::new(),
            "\u{1b}[2J".repeat(10),
        ] {
            assert!(SlotsInfo::parse(&bad).is_err(), "{bad:?}");
        }
    }

    fn var(dir: &Path, name: &str, bytes: &[u8]) {
        std::fs::create_dir_all(dir.join(EFIVARS)).unwrap();
        std::fs::write(
            dir.join(EFIVARS).join(format!("{name}-{NVIDIA_GUID}")),
            bytes,
        )
        .unwrap();
    }

    #[test]
    fn the_variables_are_read_as_attributes_and_a_uint32() {
        let d = tempfile::tempdir().unwrap();
        var(d.path(), "RootfsRedundancyLevel", &[7, 0, 0, 0, 1, 0, 0, 0]);
        var(d.path(), "RootfsRetryCountMax", &[7, 0, 0, 0, 3, 0, 0, 0]);
        var(d.path(), "RootfsStatusSlotB", &[7, 0, 0, 0, 0xff, 0, 0, 0]);
        let v = Variables::read(d.path()).unwrap();
        assert_eq!(
            v,
            Variables {
                rootfs_ab: true,
                retry_max: Some(3),
                unbootable: [false, true]
            }
        );
        var(d.path(), "RootfsStatusSlotA", &[7, 0, 0, 0, 5, 0, 0, 0]);
        assert!(Variables::read(d.path())
            .unwrap_err()
            .contains("RootfsStatusSlotA is 0x5"));
        var(d.path(), "RootfsStatusSlotA", &[7, 0, 0, 0, 0]);
        assert!(Variables::read(d.path()).unwrap_err().contains("5 bytes"));
        let empty = tempfile::tempdir().unwrap();
        assert!(!Variables::read(empty.path()).unwrap().rootfs_ab);
    }
}
