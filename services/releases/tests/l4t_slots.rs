//! The Jetson rootfs A/B slot logic against a fake `nvbootctrl` and fake
//! UEFI variables that follow NVIDIA's documented behaviour (see
//! `releases::l4t_slots`): [`Firmware`] plays L4TLauncher at each boot
//! (the retry count of the slot booted taken down by one, at zero the slot
//! marked 0xFF in `RootfsStatusSlot*` and the boot chain switched to the
//! other slot, whose count the cleared register restores), writes the
//! efivarfs files and the text `nvbootctrl -t rootfs dump-slots-info`
//! prints; the fake `nvbootctrl` prints that text and records the other
//! commands it is given, which the firmware then carries out as the real
//! tool would (`verify`: the running slot's count back to the maximum;
//! `set-active-boot-slot N`: the next boot from N).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use releases::l4t_slots::{Nvbootctrl, SlotOutcome, SlotsInfo, Variables, EFIVARS, NVIDIA_GUID};

/// One test at a time: a script written while another test's thread
/// forks stays open for writing in that child until it execs, and
/// running the script then fails with ETXTBSY.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// L4TLauncher's part, as NVIDIA's `ValidateRootfsStatus` does it.
struct Firmware {
    root: PathBuf,
    max: u32,
    /// The scratch register: valid, the slot, the counts.
    register: Option<[u32; 2]>,
    next: usize,
    running: usize,
    unbootable: [bool; 2],
}

impl Firmware {
    fn new(root: &Path, max: u32) -> Firmware {
        let mut f = Firmware {
            root: root.to_path_buf(),
            max,
            register: None,
            next: 0,
            running: 0,
            unbootable: [false; 2],
        };
        f.boot();
        f
    }

    /// A warm reset (the watchdog's) and the boot after it. Returns the
    /// slot booted.
    fn boot(&mut self) -> usize {
        self.apply_commands();
        let mut cur = self.next;
        loop {
            let counts = self.register.get_or_insert_with(|| {
                [0, 1].map(|s| if self.unbootable[s] { 0 } else { self.max })
            });
            if counts[cur] > 0 {
                counts[cur] -= 1;
                break;
            }
            self.unbootable[cur] = true;
            let other = 1 - cur;
            assert!(
                !self.unbootable[other],
                "both slots unbootable: the recovery kernel"
            );
            // Switch the boot chain, clear the register, cold reset.
            cur = other;
            self.register = None;
        }
        self.running = cur;
        self.next = cur;
        self.publish();
        cur
    }

    /// What the fake nvbootctrl was asked, carried out.
    fn apply_commands(&mut self) {
        let log = self.root.join("commands");
        for l in fs::read_to_string(&log).unwrap_or_default().lines() {
            match l.split_whitespace().collect::<Vec<_>>()[..] {
                ["verify"] => {
                    let (cur, max) = (self.running, self.max);
                    if let Some(c) = &mut self.register {
                        c[cur] = max;
                    }
                }
                ["-t", "rootfs", "set-active-boot-slot", n] => {
                    self.next = n.parse().unwrap();
                    self.register = None;
                }
                ref other => panic!("unexpected nvbootctrl {other:?}"),
            }
        }
        let _ = fs::remove_file(log);
        self.publish();
    }

    fn publish(&self) {
        let dir = self.root.join(EFIVARS);
        fs::create_dir_all(&dir).unwrap();
        let var = |name: &str, v: u32| {
            let mut b = vec![7, 0, 0, 0];
            b.extend_from_slice(&v.to_le_bytes());
            fs::write(dir.join(format!("{name}-{NVIDIA_GUID}")), b).unwrap();
        };
        var("RootfsRedundancyLevel", 1);
        var("RootfsRetryCountMax", self.max);
        var(
            "RootfsStatusSlotA",
            if self.unbootable[0] { 0xff } else { 0 },
        );
        var(
            "RootfsStatusSlotB",
            if self.unbootable[1] { 0xff } else { 0 },
        );
        let counts = self.register.unwrap_or([self.max; 2]);
        let name = |s: usize| if s == 0 { "A" } else { "B" };
        let mut dump = format!(
            "Current rootfs slot: {}\nActive rootfs slot: {}\nnum_slots: 2\n",
            name(self.running),
            name(self.next)
        );
        for (s, (count, bad)) in counts.iter().zip(self.unbootable).enumerate() {
            dump.push_str(&format!(
                "slot: {s},             retry_count: {count},             status: {}\n",
                if bad { "unbootable" } else { "normal" }
            ));
        }
        fs::write(self.root.join("dump"), dump).unwrap();
    }
}

/// The fake tool: prints the firmware's dump, records other commands.
fn fake_nvbootctrl(root: &Path) -> Nvbootctrl {
    let path = root.join("nvbootctrl");
    fs::write(
        &path,
        format!(
            "#!/bin/sh\nif [ \"$*\" = \"-t rootfs dump-slots-info\" ]; then exec cat {dump}; fi\necho \"$*\" >>{log}\n",
            dump = root.join("dump").display(),
            log = root.join("commands").display()
        ),
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    Nvbootctrl::new(path)
}

fn outcome(root: &Path, tool: &Nvbootctrl, target: usize) -> SlotOutcome {
    let info = tool.slots().unwrap().expect("rootfs A/B enabled");
    let vars = Variables::read(root).unwrap();
    assert!(vars.rootfs_ab);
    SlotOutcome::of(&info, &vars, target)
}

#[test]
fn a_slot_whose_boots_hang_is_given_up_and_the_other_slot_boots() {
    let _one = one_at_a_time();
    let d = tempfile::tempdir().unwrap();
    let mut fw = Firmware::new(d.path(), 3);
    let tool = fake_nvbootctrl(d.path());
    assert_eq!(tool.slots().unwrap().unwrap().current, 0);
    // The update went to slot B: the next boot from it.
    tool.set_active(1).unwrap();
    // Three boots of B that hang (each reset by the watchdog, no verify).
    for left in [2, 1, 0] {
        assert_eq!(fw.boot(), 1);
        assert_eq!(
            outcome(d.path(), &tool, 1),
            SlotOutcome::Booted {
                slot: 'B',
                retries_left: left
            }
        );
    }
    // The fourth: B is given up, A boots.
    assert_eq!(fw.boot(), 0);
    let o = outcome(d.path(), &tool, 1);
    assert_eq!(o, SlotOutcome::FellBack { from: 'B', to: 'A' });
    assert_eq!(
        o.describe(),
        "the firmware marked rootfs slot B unbootable after its retries and booted slot A"
    );
    assert!(Variables::read(d.path()).unwrap().unbootable[1]);
    // And stays on A.
    assert_eq!(fw.boot(), 0);
}

#[test]
fn a_good_boot_is_marked_and_keeps_its_retries() {
    let _one = one_at_a_time();
    let d = tempfile::tempdir().unwrap();
    let mut fw = Firmware::new(d.path(), 3);
    let tool = fake_nvbootctrl(d.path());
    tool.set_active(1).unwrap();
    assert_eq!(fw.boot(), 1);
    assert_eq!(
        outcome(d.path(), &tool, 1),
        SlotOutcome::Booted {
            slot: 'B',
            retries_left: 2
        }
    );
    // The supervisor's verdict: good.
    tool.mark_good().unwrap();
    fw.apply_commands();
    let info: SlotsInfo = tool.slots().unwrap().unwrap();
    assert_eq!(info.slots[1].retry_count, 3);
    // Many resets later it is still B: every good boot is marked.
    for _ in 0..10 {
        assert_eq!(fw.boot(), 1);
        tool.mark_good().unwrap();
    }
    // Not activated: the update's slot was never booted, and is not bad.
    let d2 = tempfile::tempdir().unwrap();
    let mut fw2 = Firmware::new(d2.path(), 3);
    let tool2 = fake_nvbootctrl(d2.path());
    assert_eq!(fw2.boot(), 0);
    assert_eq!(
        outcome(d2.path(), &tool2, 1),
        SlotOutcome::NotBooted {
            slot: 'B',
            running: 'A'
        }
    );
}

#[test]
fn a_tool_that_hangs_fails_or_lies_is_refused_in_bounded_time() {
    let _one = one_at_a_time();
    let d = tempfile::tempdir().unwrap();
    let script = |name: &str, body: &str| {
        let p = d.path().join(name);
        fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        Nvbootctrl {
            path: p,
            timeout: Duration::from_secs(1),
        }
    };
    let e = script("hangs", "exec sleep 60").slots().unwrap_err();
    assert!(e.contains("no answer within 1s: killed"), "{e}");
    let e = script("fails", "echo 'cannot open /dev/mem' >&2; exit 3")
        .mark_good()
        .unwrap_err();
    assert!(e.contains("cannot open /dev/mem"), "{e}");
    let e = script("lies", "printf 'Current rootfs slot: Z\\n'")
        .slots()
        .unwrap_err();
    assert!(e.contains("not in its format"), "{e}");
    // A flood is read up to its bound: it blocks in the pipe and is
    // killed, or ends and is refused; never held whole.
    let e = script(
        "floods",
        "exec yes 'slot: 0, retry_count: 1, status: normal'",
    )
    .slots()
    .unwrap_err();
    assert!(!e.is_empty());
    let absent = Nvbootctrl::new(d.path().join("absent"));
    assert!(absent.slots().is_err());
    assert_eq!(
        SlotsInfo::parse("RootFS A/B is not enabled.\n").unwrap(),
        None
    );
}
