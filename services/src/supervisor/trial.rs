//! The release trial as the supervisor runs it ([`crate::release`] holds
//! the store, the state file and the health verdict).
//!
//! At start-up [`recover`] rolls back a trial that a reboot or crash
//! interrupted (a system update's trial after its reboot excepted). While the supervisor runs, [`ReleaseWatch`] looks at
//! `state.json` and the `current` link once a second (and at once on a
//! `release-changed` request, which `deploy install` sends): a new trial
//! restarts every process from the new `current`, then
//! [`TrialHealth`] judges them once a second until [`release::commit`] or
//! [`release::rollback`] (which restarts them again, from the restored
//! release). A `current` moved by hand (`deploy rollback`) restarts the
//! processes too; a trial whose installer died before switching `current`
//! is undone. A shutdown during a trial leaves it on disk, so the next
//! start rolls it back, as after a crash. A process restarted during a
//! trial (after a crash or by request) fails it; one stopped by request is
//! no longer judged.
//!
//! Before the processes restart from another release (a trial, a
//! rollback, a `current` moved by hand) whose robot.yaml differs, it is
//! loaded with [`Boot::release_config`](super::Boot::release_config): each
//! process's command, CPUs, limits, restart policy and budgets, and the
//! channels' budgets. Processes and channels themselves are set up at the
//! supervisor's start, so a robot.yaml that adds, removes or renames one,
//! or changes a channel's geometry, is loaded by starting the supervisor
//! again (with [`Options::restart_to_reload`](super::Options): the
//! processes stop, a marker names the trial for the next start, which
//! takes it up; without it the status says why it was not loaded). The
//! boot check, the logger and `power` are not reloaded in a running
//! supervisor (a system update's reboot brings those, and the CPU plan).
//!
//! A system update's trial ([`release::system`]) waits for its reboot
//! with the processes left alone (`reboot-pending`); the start after the
//! reboot takes it up if the kernel runs its line, and it is judged only
//! when the CPU plan applied at that start.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::startup::step;
use super::startup::ConfigHook;
use super::table::{Followers, PState, Proc, Table};
use super::Stderr;
use crate::release::{self, HealthVerdict, ReleaseState, TrialHealth};
use crate::status::{ReleaseStatus, StepStatus};

/// How often `state.json` and `current` are looked at, and a trial's
/// health judged.
const RELEASE_POLL: Duration = Duration::from_secs(1);

/// Why the CPU plan did not apply at start: a system update's trial is
/// not committed without the plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum CpuPlanNotApplied {
    /// The start-up step says so: its result (`failed`, `skipped`) and
    /// detail.
    #[error("{result}: {detail}")]
    Step { result: String, detail: String },
    /// The start-up had no CPU plan step.
    #[error("no CPU plan step")]
    NoStep,
}

impl CpuPlanNotApplied {
    /// What the start-up steps say of the CPU plan.
    pub(super) fn of_steps(steps: &[crate::status::StepStatus]) -> Result<(), CpuPlanNotApplied> {
        match steps.iter().find(|st| st.step == "cpu plan") {
            Some(st) if st.result == "ok" => Ok(()),
            Some(st) => Err(CpuPlanNotApplied::Step {
                result: st.result.clone(),
                detail: st.detail.clone(),
            }),
            None => Err(CpuPlanNotApplied::NoStep),
        }
    }
}

/// A release in trial, as the supervisor follows it.
struct Trial {
    release: String,
    /// From `state.json`: identifies this trial (a second install of the
    /// same release is a new trial).
    since: u64,
    previous: String,
    began: Instant,
    phase: TrialPhase,
    /// Set when the new release's robot.yaml differs from the previous
    /// one's: whether it was loaded, or why not.
    config_note: Option<String>,
    /// A system update's trial, taken up at start after its reboot: judged
    /// only once the CPU plan applied.
    system: bool,
}

enum TrialPhase {
    /// Every process is being restarted from the new release.
    Restarting,
    /// All started: health judged once a second from `began`.
    Watching {
        health: TrialHealth,
        began: Instant,
        next: Instant,
    },
}

/// The installed release as the supervisor follows it, and the trial in
/// progress.
pub(super) struct ReleaseWatch {
    prefix: PathBuf,
    /// `update.health_window`.
    health_window: Duration,
    /// `update.keep`.
    keep: u32,
    /// The release `current` named when the processes were last
    /// (re)started from it.
    running_release: Option<String>,
    trial: Option<Trial>,
    /// A trial whose commit or rollback failed (release, since): not taken
    /// up again; the next start's recovery deals with it.
    abandoned: Option<(String, u64)>,
    status: ReleaseStatus,
    /// What the boot loader counted at this boot (from the recovery).
    boot_loader: Option<releases::boot_attempts::BootLoaderSaw>,
    next_check: Instant,
    stderr: Stderr,
    /// Whether the CPU plan applied at start (`Err`: why not): a system
    /// update's trial is not committed without it.
    plan: Result<(), CpuPlanNotApplied>,
    /// Loads a release's robot.yaml (`deploy supervise` gives it when the
    /// configuration in force is the current release's).
    load_config: Option<ConfigHook>,
    /// The release whose robot.yaml the processes run with.
    config_release: Option<String>,
    /// [`Options::restart_to_reload`](super::Options).
    restart_to_reload: bool,
    /// Why the supervisor should start again to load a robot.yaml (see
    /// [`ReleaseWatch::take_restart`]).
    restart: Option<String>,
}

impl ReleaseWatch {
    /// Follows the release `status` (from [`recover`]) says is current.
    /// A system update's trial that the start-up recovery kept (the
    /// robot rebooted into its command line) is taken up at once: the
    /// processes start from it, and it is judged like any trial once the
    /// CPU plan (`plan`, the start-up step's outcome) applied.
    pub(super) fn new(
        prefix: &Path,
        health_window: Duration,
        keep: u32,
        status: ReleaseStatus,
        plan: Result<(), CpuPlanNotApplied>,
        load_config: Option<ConfigHook>,
        stderr: Stderr,
    ) -> ReleaseWatch {
        let now = Instant::now();
        let trial = match release::read_state(prefix) {
            Ok(Some(ReleaseState::Trial {
                release,
                since,
                previous,
                system: Some(s),
                ..
            })) if status.state == "trial" && s.judged_boot.is_some() => Some(Trial {
                release,
                since,
                previous,
                began: now,
                phase: TrialPhase::Restarting,
                config_note: None,
                system: true,
            }),
            // A trial the supervisor restarted itself for (to load its
            // robot.yaml), taken up by the recovery.
            Ok(Some(ReleaseState::Trial {
                release,
                since,
                previous,
                system: None,
                ..
            })) if status.state == "trial" => Some(Trial {
                release,
                since,
                previous,
                began: now,
                phase: TrialPhase::Restarting,
                config_note: Some(RESTARTED.into()),
                system: false,
            }),
            _ => None,
        };
        let config_release = status.current.clone();
        ReleaseWatch {
            prefix: prefix.to_path_buf(),
            health_window,
            keep,
            running_release: status.current.clone(),
            trial,
            abandoned: None,
            boot_loader: status.boot_loader.clone(),
            status,
            next_check: now,
            stderr,
            plan,
            load_config,
            config_release,
            restart_to_reload: false,
            restart: None,
        }
    }

    /// With [`Options::restart_to_reload`](super::Options).
    pub(super) fn restarting_to_reload(mut self, on: bool) -> ReleaseWatch {
        self.restart_to_reload = on;
        self
    }

    /// Whether the supervisor should stop its processes and start again,
    /// and why: a release's robot.yaml needs a start to be loaded. For a
    /// trial, [`release::system::ask_restart`] first names it for the next
    /// start (in this boot, read from `proc_root`); when that cannot be
    /// written the supervisor goes on with the configuration it has
    /// (restarting would roll the trial back as interrupted).
    pub(super) fn take_restart(&mut self, proc_root: &Path) -> Option<String> {
        let why = self.restart.take()?;
        if let Some(t) = &self.trial {
            let boot = release::system::Boot::read(proc_root);
            if let Err(e) = release::system::ask_restart(&self.prefix, &t.release, &boot.id) {
                self.stderr.say(format!(
                    "release {}: {why}, but the restart marker could not be written ({e}): the processes keep the configuration of the start",
                    t.release
                ));
                return None;
            }
        }
        Some(why)
    }

    /// Before the processes restart from `release`: when its robot.yaml
    /// differs from the one they run with, loads it (with the hook) into
    /// the table. Returns what happened, for the status; `None` when
    /// nothing differs.
    fn follow_config(&mut self, release: &str, table: &mut Table) -> Option<String> {
        let layout = release::Layout::new(&self.prefix);
        let from = self.config_release.clone()?;
        if from == release {
            return None;
        }
        let read = |r: &str| {
            units::bounded::Bound::regular(crate::config::MAX_ROBOT_YAML)
                .read(&layout.release(r).join("robot.yaml"))
                .ok()
        };
        if read(&from) == read(release) {
            self.config_release = Some(release.to_string());
            return None;
        }
        let Some(load) = &self.load_config else {
            return Some(KEPT.to_string());
        };
        let path = layout.release(release).join("robot.yaml");
        let not_loaded = |why: &dyn std::fmt::Display| {
            format!(
                "its robot.yaml differs from {from}'s and was not loaded ({why}): the processes run the new binaries with {from}'s configuration until the supervisor restarts"
            )
        };
        let note = match load(&path).map(|cfg| table.reconfigure(&cfg)) {
            Ok(Ok(())) => {
                self.config_release = Some(release.to_string());
                format!("its robot.yaml differs from {from}'s: loaded (commands, CPUs, limits, restart policies, budgets)")
            }
            Ok(Err(why)) if self.restart_to_reload => {
                self.restart = Some(format!(
                    "release {release}'s robot.yaml needs a start: {why}"
                ));
                format!("its robot.yaml differs from {from}'s in what only a start sets up ({why}): the supervisor starts again to load it")
            }
            Ok(Err(why)) => not_loaded(&why),
            Err(why) => not_loaded(&why),
        };
        self.stderr.say(format!("release {release}: {note}"));
        Some(note)
    }

    /// The release line of the status, with what the boot loader counted
    /// at this boot (from the start-up recovery) whatever happened since.
    pub(super) fn status(&self) -> ReleaseStatus {
        ReleaseStatus {
            boot_loader: self.boot_loader.clone(),
            ..self.status.clone()
        }
    }

    /// When to look again: the next poll, or the next health judgement.
    pub(super) fn next_deadline(&self) -> Instant {
        match &self.trial {
            Some(Trial {
                phase: TrialPhase::Watching { next, .. },
                ..
            }) => self.next_check.min(*next),
            _ => self.next_check,
        }
    }

    /// [`Self::check`] once every `RELEASE_POLL`.
    pub(super) fn check_if_due(
        &mut self,
        now: Instant,
        table: &mut Table,
        out: &mut impl Followers,
    ) {
        if now >= self.next_check {
            self.next_check = now + RELEASE_POLL;
            self.check(now, table, out);
        }
    }

    /// Looks at `state.json` and `current`: a new trial restarts every
    /// process from it; a trial that ended elsewhere (`deploy rollback`)
    /// and a `current` moved by hand restart them from the new `current`.
    pub(super) fn check(&mut self, now: Instant, table: &mut Table, out: &mut impl Followers) {
        let prefix = self.prefix.clone();
        let layout = release::Layout::new(&prefix);
        let current = release::link_target(&layout.current());
        let state = match release::read_state(&prefix) {
            Ok(s) => s,
            Err(e) => {
                let msg = e.to_string();
                if self.status.detail.as_deref() != Some(msg.as_str()) {
                    self.stderr.say(format!("release: {msg}"));
                }
                self.status = ReleaseStatus {
                    state: "error".into(),
                    current,
                    detail: Some(msg),
                    ..Default::default()
                };
                return;
            }
        };
        match state {
            Some(ReleaseState::Trial {
                release,
                since,
                previous,
                system,
                ..
            }) => {
                if self
                    .abandoned
                    .as_ref()
                    .is_some_and(|(r, s)| *r == release && *s == since)
                {
                    return;
                }
                if current.as_deref() != Some(release.as_str()) {
                    // The installer wrote the state and has not switched
                    // `current` yet (look again at the next poll), or it
                    // died before the switch: then nobody holds the
                    // update lock, and the half-begun trial is undone.
                    self.undo_unswitched_trial(&release, since);
                    return;
                }
                if self
                    .trial
                    .as_ref()
                    .is_some_and(|t| t.release == release && t.since == since)
                {
                    return;
                }
                if let Some(sys) = system.filter(|s| s.judged_boot.is_none()) {
                    // A system update waits for its reboot: the processes
                    // keep running on the plan the kernel booted with.
                    if self.status.phase.as_deref() != Some("reboot-pending")
                        || self.status.current.as_deref() != Some(release.as_str())
                    {
                        let detail = format!(
                            "changes the system ({}): waits for a reboot{}; the processes keep running until then",
                            sys.changes.join("; "),
                            sys.boot_entry
                                .as_ref()
                                .map(|e| format!(" into boot label {}", e.label))
                                .unwrap_or_default()
                        );
                        self.stderr.event(
                            "trial",
                            None,
                            format!(
                                "release {release} in trial (rollback to {previous}): {detail}"
                            ),
                        );
                        self.status = ReleaseStatus {
                            state: "trial".into(),
                            current: Some(release),
                            other: Some(previous),
                            since: Some(since),
                            phase: Some("reboot-pending".into()),
                            detail: Some(detail),
                            ..Default::default()
                        };
                    }
                    return;
                }
                self.stderr.event(
                    "trial",
                    None,
                    format!("release {release} in trial (rollback to {previous}): restarting every process from it"),
                );
                let config_note = self.follow_config(&release, table);
                table.restart_all(&format!("release {release} in trial"), out);
                self.running_release = Some(release.clone());
                self.trial = Some(Trial {
                    release,
                    since,
                    previous,
                    began: now,
                    phase: TrialPhase::Restarting,
                    config_note,
                    system: false,
                });
                self.update_status(now);
            }
            other => {
                if let Some(t) = self.trial.take() {
                    self.stderr.say(format!(
                        "release {}: trial ended outside the supervisor",
                        t.release
                    ));
                    self.status = ReleaseStatus {
                        state: "committed".into(),
                        current: current.clone(),
                        detail: Some(format!("trial of {} ended by another command", t.release)),
                        ..Default::default()
                    };
                }
                if current != self.running_release {
                    self.stderr.say(format!(
                        "release: current is now {}: restarting every process from it",
                        current.as_deref().unwrap_or("(none)")
                    ));
                    if let Some(c) = &current {
                        self.follow_config(c, table);
                    }
                    table.restart_all("current release changed", out);
                    self.running_release = current.clone();
                    self.status = ReleaseStatus {
                        state: if other.is_some() { "committed" } else { "none" }.into(),
                        current,
                        ..Default::default()
                    };
                }
            }
        }
    }

    /// A trial in `state.json` whose release `current` does not name, with
    /// the update lock free: the installer died between writing the state
    /// and switching. [`release::rollback`] puts `state.json` and
    /// `previous` back; `current` never moved, so nothing restarts (unless
    /// it moved after all, which [`Self::check`] sees next time).
    fn undo_unswitched_trial(&mut self, release: &str, since: u64) {
        let prefix = self.prefix.clone();
        let lock = match release::UpdateLock::try_acquire(&prefix, "supervisor") {
            Ok(Some(l)) => l,
            // An install or a lock holder is at work: look again later.
            Ok(None) => return,
            Err(e) => {
                self.stderr.say(format!("release: {e}"));
                return;
            }
        };
        // Under the lock: still the same half-begun trial?
        let layout = release::Layout::new(&prefix);
        let still = matches!(
            release::read_state(&prefix),
            Ok(Some(ReleaseState::Trial { release: r, .. })) if r == release
        ) && release::link_target(&layout.current()).as_deref() != Some(release);
        if !still {
            return;
        }
        let reason = format!("the install of {release} stopped before it switched current");
        match release::rollback(&prefix) {
            Ok(rb) => {
                self.stderr.event(
                    "rollback",
                    None,
                    format!("release: {reason}: trial undone, {} stays", rb.to),
                );
                self.status = rolled_back(Some(rb.to), rb.from, reason);
            }
            Err(e) => {
                self.stderr
                    .say(format!("release: {reason}; undoing it failed: {e}"));
                self.abandoned = Some((release.to_string(), since));
                self.status = ReleaseStatus {
                    state: "error".into(),
                    current: release::link_target(&layout.current()),
                    detail: Some(format!("{reason}; undoing it failed: {e}")),
                    ..Default::default()
                };
            }
        }
        drop(lock);
    }

    /// Advances the trial: waits for the restarts, then asks
    /// [`TrialHealth`] once a second and commits or rolls back.
    pub(super) fn judge(&mut self, now: Instant, table: &mut Table, out: &mut impl Followers) {
        let Some(mut t) = self.trial.take() else {
            return;
        };
        let window = self.health_window;
        let verdict = match (&mut t.phase, &self.plan) {
            // After a system update's reboot, the new plan must hold
            // before anything else counts.
            (_, Err(why)) if t.system => HealthVerdict::Rollback(format!(
                "the CPU plan of the system update did not apply after the reboot: {why}"
            )),
            (TrialPhase::Restarting, _) => {
                let judged: Vec<&Proc> = table.procs().iter().filter(|p| p.judged()).collect();
                if let Some(p) = judged.iter().find(|p| {
                    matches!(p.state(), PState::Failed | PState::Backoff | PState::Exited)
                }) {
                    HealthVerdict::Rollback(format!(
                        "process {} is {} while restarting from the new release: {}",
                        p.name(),
                        p.state().name(),
                        p.reason().or(p.last_exit()).unwrap_or_default()
                    ))
                } else if judged.iter().all(|p| p.state() == PState::Running) {
                    t.phase = TrialPhase::Watching {
                        health: TrialHealth::new(window),
                        began: now,
                        next: now,
                    };
                    HealthVerdict::Wait
                } else if now.duration_since(t.began) >= window {
                    let p = judged
                        .iter()
                        .find(|p| p.state() != PState::Running)
                        .expect("not all running");
                    HealthVerdict::Rollback(format!(
                        "process {} not started {:?} into the trial: {}",
                        p.name(),
                        window,
                        p.reason().unwrap_or(p.state().name())
                    ))
                } else {
                    HealthVerdict::Wait
                }
            }
            (TrialPhase::Watching { .. }, _) => HealthVerdict::Wait,
        };
        // Health is judged once a second, and at once when a process is
        // down (a crash rolls back without waiting for the next look).
        let down = table.procs().iter().any(|p| p.judged() && !p.is_up());
        let verdict = match (&mut t.phase, verdict) {
            (
                TrialPhase::Watching {
                    health,
                    began,
                    next,
                },
                HealthVerdict::Wait,
            ) if now >= *next || down => {
                *next = now + RELEASE_POLL;
                let sup_now = table.uptime();
                let procs: Vec<_> = table
                    .procs()
                    .iter()
                    .filter(|p| p.judged())
                    .map(|p| p.trial_health(sup_now))
                    .collect();
                health.observe(now.duration_since(*began), &procs)
            }
            (_, v) => v,
        };
        match verdict {
            HealthVerdict::Wait => {
                self.trial = Some(t);
                self.update_status(now);
            }
            HealthVerdict::Commit => match release::commit(&self.prefix, self.keep) {
                Ok(r) => {
                    self.stderr.event(
                        "commit",
                        None,
                        format!("release {r}: healthy for {window:?}: committed"),
                    );
                    self.status = ReleaseStatus {
                        state: "committed".into(),
                        current: Some(r),
                        detail: Some(match &t.config_note {
                            Some(n) => format!("healthy for {window:?}; {n}"),
                            None => format!("healthy for {window:?}"),
                        }),
                        ..Default::default()
                    };
                }
                Err(e) => self.failed(&t, format!("commit failed: {e}")),
            },
            HealthVerdict::Rollback(reason) => {
                self.stderr.event(
                    "rollback",
                    None,
                    format!(
                        "release {}: {reason}: rolling back to {}",
                        t.release, t.previous
                    ),
                );
                match release::rollback(&self.prefix) {
                    Ok(rb) => {
                        self.follow_config(&rb.to, table);
                        table.restart_all(&format!("rolled back to {}", rb.to), out);
                        self.running_release = Some(rb.to.clone());
                        let reason = if rb.reboot {
                            let r = format!("{reason}; {REBOOT_BACK}");
                            self.stderr.event(
                                "rollback",
                                None,
                                format!("release {}: {r}", rb.from),
                            );
                            r
                        } else {
                            reason
                        };
                        self.status = rolled_back(Some(rb.to), rb.from, reason);
                    }
                    Err(e) => self.failed(&t, format!("{reason}; rollback failed: {e}")),
                }
            }
        }
    }

    /// A commit or rollback that failed: said, shown, and the trial is no
    /// longer judged (the next start's recovery rolls it back).
    fn failed(&mut self, t: &Trial, msg: String) {
        self.stderr.say(format!("release {}: {msg}", t.release));
        self.abandoned = Some((t.release.clone(), t.since));
        self.status = ReleaseStatus {
            state: "error".into(),
            current: Some(t.release.clone()),
            other: Some(t.previous.clone()),
            since: Some(t.since),
            detail: Some(msg),
            ..Default::default()
        };
    }

    fn update_status(&mut self, now: Instant) {
        let Some(t) = &self.trial else { return };
        let (phase, left) = match &t.phase {
            TrialPhase::Restarting => ("restarting", None),
            TrialPhase::Watching { health, began, .. } => (
                "watching",
                health
                    .window_left(now.duration_since(*began))
                    .map(|d| d.as_secs_f64()),
            ),
        };
        self.status = ReleaseStatus {
            state: "trial".into(),
            current: Some(t.release.clone()),
            other: Some(t.previous.clone()),
            since: Some(t.since),
            for_s: Some(now.duration_since(t.began).as_secs_f64()),
            phase: Some(phase.into()),
            window_left_s: left,
            detail: t.config_note.clone(),
            boot_loader: None,
        };
    }
}

/// The note of a trial taken up after the supervisor started again for it.
const RESTARTED: &str =
    "the supervisor started again to load its robot.yaml (processes or channels changed)";

/// The note when a release's robot.yaml differs and no loader was given.
const KEPT: &str = "its robot.yaml differs from the previous release's: the processes run the new binaries with the configuration loaded at the supervisor's start until the supervisor restarts";

/// What a rollback of a system update that ran says is left to do.
const REBOOT_BACK: &str = "extlinux.conf boots the previous label again; reboot to run the previous kernel command line and CPU plan (run/rtdeploy/reboot-required)";

/// [`release::recover_at_boot`] as a start-up step, and the release
/// status it leaves. Run before robot.yaml is loaded when the caller can
/// (`deploy supervise`), so that the configuration read is the release's
/// that stays.
pub fn recover(prefix: &Path, proc_root: &Path) -> (StepStatus, ReleaseStatus) {
    let layout = release::Layout::new(prefix);
    if !layout.opt().exists() && !layout.state().exists() {
        return (
            step(
                "release recovery",
                "skipped",
                format!("no release installed under {}", layout.opt().display()),
            ),
            ReleaseStatus {
                state: "none".into(),
                ..Default::default()
            },
        );
    }
    match release::recover_at_boot(prefix, proc_root) {
        Ok(r) => {
            let mut done = Vec::new();
            let why = r
                .reason
                .clone()
                .unwrap_or_else(|| "trial interrupted by a reboot, a crash or a shutdown".into());
            if let Some(rb) = &r.rolled_back {
                done.push(match &r.reason {
                    Some(why) => {
                        format!("system update {} rolled back to {}: {why}", rb.from, rb.to)
                    }
                    None => format!(
                        "trial of {} interrupted (reboot, crash or shutdown): rolled back to {}",
                        rb.from, rb.to
                    ),
                });
                if rb.reboot {
                    done.push(REBOOT_BACK.into());
                }
            }
            if let Some(t) = &r.system_trial {
                done.push(format!(
                    "system update {t}: booted with its kernel command line; its trial is judged once the CPU plan applied"
                ));
            }
            if let Some(b) = &r.boot_loader {
                done.push(format!("boot loader: {}", b.describe()));
            }
            if let Some(t) = &r.restarted_trial {
                done.push(format!(
                    "trial of {t} taken up again: the supervisor started again to load its robot.yaml"
                ));
            }
            if r.repaired {
                done.push("current put back to the committed release".into());
            }
            if !r.cleaned.is_empty() {
                done.push(format!("removed {}", r.cleaned.join(", ")));
            }
            let detail = if done.is_empty() {
                format!(
                    "current {}: nothing to recover",
                    r.current.as_deref().unwrap_or("(none)")
                )
            } else {
                done.join("; ")
            };
            let status = match (&r.rolled_back, &r.system_trial) {
                (Some(rb), _) => rolled_back(
                    r.current.clone(),
                    rb.from.clone(),
                    if rb.reboot {
                        format!("{why}; {REBOOT_BACK}")
                    } else {
                        why
                    },
                ),
                (None, Some(t)) => ReleaseStatus {
                    state: "trial".into(),
                    current: Some(t.clone()),
                    phase: Some("restarting".into()),
                    detail: Some("system update: booted with its kernel command line".into()),
                    ..Default::default()
                },
                (None, None) if r.restarted_trial.is_some() => ReleaseStatus {
                    state: "trial".into(),
                    current: r.restarted_trial.clone(),
                    phase: Some("restarting".into()),
                    detail: Some(RESTARTED.into()),
                    ..Default::default()
                },
                (None, None) => ReleaseStatus {
                    state: if r.current.is_some() {
                        "committed"
                    } else {
                        "none"
                    }
                    .into(),
                    current: r.current.clone(),
                    ..Default::default()
                },
            };
            let status = ReleaseStatus {
                boot_loader: r.boot_loader.clone(),
                ..status
            };
            (step("release recovery", "ok", detail), status)
        }
        Err(e) => (
            step("release recovery", "failed", e.to_string()),
            ReleaseStatus {
                state: "error".into(),
                current: release::link_target(&layout.current()),
                detail: Some(format!("recovery at start failed: {e}")),
                ..Default::default()
            },
        ),
    }
}

/// The status after a rollback: `current` runs again, `from` was undone,
/// and why.
fn rolled_back(current: Option<String>, from: String, why: String) -> ReleaseStatus {
    ReleaseStatus {
        state: "rolled-back".into(),
        current,
        other: Some(from),
        detail: Some(why),
        ..Default::default()
    }
}
