//! Simulation: a robot's event loops in one process on one virtual clock,
//! deterministic and as fast as the CPU allows.
//!
//! A [`Sim`] makes loops ([`Sim::make_loop`]) that are the real
//! [`EventLoop`] with a virtual clock ([`crate::time::Clock`]), so a
//! controller's code (its watchers, senders, fetchers, timers, phased
//! loops, `Ctx` times and timing reports) is the same in a test as on the
//! robot. The channels are the real shared-memory channels, in a
//! directory of the simulation's own.
//!
//! How time moves ([`Sim::run_until`]): at each virtual instant, every
//! loop with something due (a timer whose deadline has come, a message on
//! a watched channel) takes a turn, in an order drawn from the seed; a
//! turn handles everything the loop has ready. Messages published in a
//! turn are delivered at the same virtual time, so the loops take turns
//! at that instant until none has anything left; then the clock jumps to
//! the earliest deadline of any loop. Nothing reads `CLOCK_MONOTONIC`:
//! send times, event times, `Ctx::now` and reports are virtual, and a
//! handler takes no virtual time (its latency is zero). The same loops
//! and seed give the same events in the same order.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::channel::{
    Channel, ChannelCreateError, ChannelGeometry, ChannelOpenError, CreateOutcome,
};
use crate::event_loop::{
    EventLoop, EventLoopCreateError, EventLoopRunError, LoopOptions, TimingOptions, TurnEnd,
};
use crate::time::{Clock, Monotonic, VirtualClock};

/// Where a simulation's clock starts: one second, so that instants before
/// it (a phased loop's offset, a deadline a test sets a little early)
/// stay representable.
pub const START: Monotonic = Monotonic::from_nanos(1_000_000_000);

/// Turns one virtual instant may take before the simulation calls it a
/// livelock: loops that keep publishing to each other without time
/// passing.
const MAX_ROUNDS_PER_INSTANT: u64 = 1 << 16;

/// A loop of a simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoopId(usize);

/// A simulation failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot create the simulation's channel directory {dir}")]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("loop `{name}` failed at virtual time {at}")]
    Loop {
        name: String,
        at: Monotonic,
        #[source]
        source: Box<EventLoopRunError>,
    },
    #[error("at virtual time {at}, the loops took {rounds} rounds of turns without time passing (they keep publishing to each other): stopped")]
    Livelock { at: Monotonic, rounds: u64 },
}

/// What a run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimRun {
    /// Turns the loops took.
    pub turns: u64,
    /// Virtual instants at which some loop took a turn.
    pub instants: u64,
    /// The virtual time the run ended at.
    pub now: Monotonic,
    /// The run ended because no loop had anything left to do.
    pub idle: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Running,
    Exited,
    Done,
}

struct SimLoop {
    name: String,
    lp: EventLoop,
    state: State,
}

/// Event loops on one virtual clock (see the module's documentation).
pub struct Sim {
    clock: VirtualClock,
    shm_dir: PathBuf,
    /// The directory is the simulation's own (removed with it).
    owned_dir: bool,
    proc_root: PathBuf,
    loops: Vec<SimLoop>,
    /// The order of turns at one instant.
    order: TurnOrder,
    seed: u64,
}

impl Sim {
    /// A simulation with seed 0, its channels in a fresh directory under
    /// `/dev/shm` (removed when it is dropped).
    pub fn new() -> Result<Sim, SimError> {
        Sim::with_seed(0)
    }

    /// A simulation whose turn order at each instant is drawn from `seed`.
    pub fn with_seed(seed: u64) -> Result<Sim, SimError> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = PathBuf::from(format!(
            "/dev/shm/rtdeploy-sim-{}-{n}",
            crate::sys::getpid()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|source| SimError::Dir {
            dir: dir.clone(),
            source,
        })?;
        let mut sim = Sim::in_dir(&dir, seed);
        sim.owned_dir = true;
        Ok(sim)
    }

    /// A simulation whose channels live in `shm_dir` (kept when it is
    /// dropped).
    pub fn in_dir(shm_dir: &Path, seed: u64) -> Sim {
        Sim {
            clock: VirtualClock::new(START),
            shm_dir: shm_dir.to_path_buf(),
            owned_dir: false,
            proc_root: PathBuf::from("/proc"),
            loops: Vec::new(),
            order: TurnOrder::new(seed),
            seed,
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The virtual time now.
    pub fn now(&self) -> Monotonic {
        self.clock.now()
    }

    /// The simulation's clock (for a publisher made outside its loops).
    pub fn clock(&self) -> &VirtualClock {
        &self.clock
    }

    /// Where its channels are.
    pub fn shm_dir(&self) -> &Path {
        &self.shm_dir
    }

    /// Creates channel `name` in the simulation's directory.
    pub fn create_channel(
        &self,
        name: &str,
        geom: &ChannelGeometry,
    ) -> Result<(Channel, CreateOutcome), ChannelCreateError> {
        Channel::create(&self.shm_dir, name, geom, None, &self.proc_root)
    }

    /// Opens channel `name` of the simulation, to look at what was
    /// published.
    pub fn open_channel(&self, name: &str) -> Result<Channel, ChannelOpenError> {
        Channel::open(&self.shm_dir, name)
    }

    /// A loop named `name` (its timing report is published once a virtual
    /// second on `/rtdeploy/timing/<name>`, as under the supervisor).
    pub fn make_loop(&mut self, name: &str) -> Result<LoopId, EventLoopCreateError> {
        let opts = LoopOptions {
            timing: Some(TimingOptions {
                shm_dir: self.shm_dir.clone(),
                process: name.into(),
                period: Duration::from_secs(1),
            }),
            ..LoopOptions::default()
        };
        self.make_loop_with(name, opts)
    }

    /// A loop with `opts`, on the simulation's clock and in its directory
    /// (those two and the backend are the simulation's, whatever `opts`
    /// says).
    pub fn make_loop_with(
        &mut self,
        name: &str,
        mut opts: LoopOptions,
    ) -> Result<LoopId, EventLoopCreateError> {
        opts.clock = Clock::Virtual(self.clock.clone());
        opts.backend = None;
        opts.shm_dir = self.shm_dir.clone();
        opts.proc_root = self.proc_root.clone();
        let lp = EventLoop::new(opts)?;
        self.loops.push(SimLoop {
            name: name.into(),
            lp,
            state: State::Running,
        });
        Ok(LoopId(self.loops.len() - 1))
    }

    /// Loop `id`, to set up (watch, send, add timers) or to look at.
    pub fn event_loop(&mut self, id: LoopId) -> &mut EventLoop {
        &mut self.loops[id.0].lp
    }

    /// Whether loop `id` still runs (no handler called `exit`, something
    /// left to wait for).
    pub fn is_running(&self, id: LoopId) -> bool {
        self.loops[id.0].state == State::Running
    }

    /// Runs for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) -> Result<SimRun, SimError> {
        let until = self.now() + d;
        self.run_until_time(until, |_| false)
    }

    /// Runs until `done` holds (asked after each virtual instant) or no
    /// loop has anything left to do.
    pub fn run_until(&mut self, done: impl FnMut(&Sim) -> bool) -> Result<SimRun, SimError> {
        self.run_until_time(Monotonic::from_nanos(u64::MAX), done)
    }

    /// Runs until virtual time `until`, until `done` holds (asked after
    /// each instant) or until no loop has anything left to do.
    pub fn run_until_time(
        &mut self,
        until: Monotonic,
        mut done: impl FnMut(&Sim) -> bool,
    ) -> Result<SimRun, SimError> {
        let mut run = SimRun {
            turns: 0,
            instants: 0,
            now: self.now(),
            idle: false,
        };
        let mut ready = Vec::with_capacity(self.loops.len());
        loop {
            let now = self.clock.now().as_nanos();
            let mut rounds = 0u64;
            loop {
                ready.clear();
                for (i, l) in self.loops.iter_mut().enumerate() {
                    if l.state == State::Running && l.lp.sim_next_event() == Some(now) {
                        ready.push(i);
                    }
                }
                if ready.is_empty() {
                    break;
                }
                if rounds == 0 {
                    run.instants += 1;
                }
                rounds += 1;
                if rounds > MAX_ROUNDS_PER_INSTANT {
                    return Err(SimError::Livelock {
                        at: self.now(),
                        rounds,
                    });
                }
                self.shuffle(&mut ready);
                for &i in &ready {
                    run.turns += 1;
                    self.turn(i)?;
                }
            }
            if done(self) {
                break;
            }
            let next = self
                .loops
                .iter_mut()
                .filter(|l| l.state == State::Running)
                .filter_map(|l| l.lp.sim_next_event())
                .min();
            match next {
                None => {
                    run.idle = true;
                    break;
                }
                Some(t) if t > until.as_nanos() => {
                    self.clock.advance_to(until);
                    break;
                }
                Some(t) => {
                    self.clock.advance_to(Monotonic::from_nanos(t));
                }
            }
        }
        run.now = self.now();
        Ok(run)
    }

    /// Gives loop `i` a turn at the time now.
    fn turn(&mut self, i: usize) -> Result<(), SimError> {
        let at = self.now();
        let l = &mut self.loops[i];
        match l.lp.sim_turn() {
            Ok(TurnEnd::Waiting) => {}
            Ok(TurnEnd::Exited) => l.state = State::Exited,
            Ok(TurnEnd::Done) => l.state = State::Done,
            Err(source) => {
                return Err(SimError::Loop {
                    name: l.name.clone(),
                    at,
                    source: Box::new(source),
                })
            }
        }
        Ok(())
    }

    fn shuffle(&mut self, v: &mut [usize]) {
        self.order.shuffle(v);
    }
}

/// The order of turns at one virtual instant, drawn from a seed alone:
/// the same seed gives the same sequence of orders (this simulation's and
/// `deploy sim`'s coordinator's).
#[derive(Debug, Clone)]
pub struct TurnOrder {
    /// xorshift64* state.
    rng: u64,
}

impl TurnOrder {
    pub fn new(seed: u64) -> TurnOrder {
        TurnOrder {
            rng: splitmix64(seed),
        }
    }

    /// Orders `v` (the loops due at one instant): a Fisher-Yates shuffle,
    /// one draw per element beyond the first.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for k in (1..v.len()).rev() {
            let j = (self.next_random() % (k as u64 + 1)) as usize;
            v.swap(k, j);
        }
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64* (Vigna): fast, and enough to order turns.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        // The loops first: their publishers and subscribers release their
        // entries in the channel files.
        self.loops.clear();
        if self.owned_dir {
            let _ = std::fs::remove_dir_all(&self.shm_dir);
        }
    }
}

/// A seed spread over all 64 bits, never 0 (xorshift's one fixed point).
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    if z == 0 {
        0x9e37_79b9_7f4a_7c15
    } else {
        z
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_turn_order_depends_on_the_seed_alone() {
        let order = |seed| {
            let mut s = Sim::in_dir(Path::new("/nonexistent"), seed);
            let mut v: Vec<usize> = (0..8).collect();
            s.shuffle(&mut v);
            v
        };
        assert_eq!(order(7), order(7));
        assert_ne!(order(7), order(8));
        let mut sorted = order(7);
        sorted.sort_unstable();
        assert_eq!(sorted, (0..8).collect::<Vec<_>>(), "a permutation");
    }
}
