//! Resolving a task's futex address to the file and offset it maps
//! (`/proc/<tid>/maps`), and a `futex_waitv` vector to its words
//! (`/proc/<tid>/mem`), while the task lives.

use super::*;

pub(super) type Maps = Vec<(u64, u64, u64, String)>;

/// The most read of one `/proc/<pid>/maps`: the default
/// `vm.max_map_count` (65530) mappings of 256 bytes a line (73 before the
/// path). A process whose maps hold more is not resolved.
pub(super) const MAX_MAPS: u64 = 16 << 20;

pub(super) fn read_maps(path: &Path) -> Option<Maps> {
    // Lossy: a mapped file's name may hold any byte.
    let text = units::bounded::Bound::pseudo(MAX_MAPS)
        .read_lossy(path)
        .ok()?;
    Some(
        text.lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let (a, b) = it.next()?.split_once('-')?;
                let _perms = it.next()?;
                let off = u64::from_str_radix(it.next()?, 16).ok()?;
                let _dev = it.next()?;
                let _inode = it.next()?;
                let path: String = it.collect::<Vec<_>>().join(" ");
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                    off,
                    path,
                ))
            })
            .collect(),
    )
}

/// The address spaces of the robot's processes, kept after they exit:
/// the reader of the trace runs behind the kernel, and a low-priority
/// process of the check lives two seconds.
#[derive(Default)]
pub struct MapsCache {
    /// tid -> its process.
    pub(super) process_of: HashMap<i32, i32>,
    pub(super) maps: HashMap<i32, Maps>,
}

impl MapsCache {
    /// Reads the maps of every process whose comm is a robot task's
    /// (`rtd-*`), and the thread ids of each (bounded: 4096 processes).
    pub fn snapshot(&mut self, proc_root: &Path) {
        let Ok(rd) = std::fs::read_dir(proc_root) else {
            return;
        };
        for e in rd.filter_map(|e| e.ok()).take(65_536) {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            // A comm is at most 16 bytes.
            let comm = units::bounded::Bound::pseudo(64).read_lossy(&e.path().join("comm"));
            if !comm.is_ok_and(|c| c.starts_with(ROBOT_PREFIX)) {
                continue;
            }
            if self.maps.len() >= MAX_TASKS && !self.maps.contains_key(&pid) {
                continue;
            }
            // An exiting process shows no mappings: keep what it had.
            if let Some(m) = read_maps(&e.path().join("maps")).filter(|m| !m.is_empty()) {
                self.maps.insert(pid, m);
            }
            if let Ok(tasks) = std::fs::read_dir(e.path().join("task")) {
                for t in tasks.filter_map(|t| t.ok()).take(1024) {
                    if let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) {
                        if self.process_of.len() < 16 * MAX_TASKS {
                            self.process_of.insert(tid, pid);
                        }
                    }
                }
            }
        }
    }

    pub(super) fn find(&self, tid: i32, addr: u64) -> Option<(String, u64)> {
        let pid = self.process_of.get(&tid).copied().unwrap_or(tid);
        let (a, _, off, path) = self
            .maps
            .get(&pid)?
            .iter()
            .find(|(a, b, _, _)| *a <= addr && addr < *b)?;
        Some(if path.is_empty() || path.starts_with('[') {
            // Memory of the process's own (heap, stack, anonymous).
            (format!("memory of process {pid}"), addr)
        } else {
            (path.clone(), addr - a + off)
        })
    }
}

/// Resolves through the [`MapsCache`] a snapshot thread keeps, then
/// `/proc/<tid>/maps` of a task still alive; `futex_waitv` vectors through
/// `/proc/<tid>/mem` (root, or the same user with ptrace permission).
pub struct ProcResolver {
    pub(super) proc_root: PathBuf,
    pub(super) cache: Arc<Mutex<MapsCache>>,
}

impl ProcResolver {
    pub fn new(proc_root: &Path, cache: Arc<Mutex<MapsCache>>) -> Self {
        ProcResolver {
            proc_root: proc_root.into(),
            cache,
        }
    }
}

impl Resolver for ProcResolver {
    fn resolve(&mut self, tid: i32, addr: u64) -> Option<(String, u64)> {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = c.find(tid, addr) {
            return Some(hit);
        }
        // A task the snapshot did not see yet (or a mapping made since).
        let m = read_maps(&self.proc_root.join(tid.to_string()).join("maps"));
        let m = m.filter(|m| !m.is_empty())?;
        let pid = c.process_of.get(&tid).copied().unwrap_or(tid);
        if c.maps.len() < MAX_TASKS || c.maps.contains_key(&pid) {
            c.maps.insert(pid, m);
        }
        c.find(tid, addr)
    }

    fn waitv(&mut self, tid: i32, ptr: u64, nr: u64) -> Vec<(u64, bool)> {
        // struct futex_waitv { u64 val; u64 uaddr; u32 flags; u32 reserved; }
        let mut buf = vec![0u8; (nr as usize) * 24];
        let p = self.proc_root.join(tid.to_string()).join("mem");
        // Opened through units::bounded (a pseudo file: no wait on a FIFO
        // in a fake tree); read only where the vector is, its size bounded
        // by the caller (128 entries).
        let ok = units::bounded::Bound::pseudo(buf.len() as u64)
            .open(&p)
            .map_err(units::bounded::FileReadError::into_io)
            .and_then(|f| f.read_exact_at(&mut buf, ptr))
            .is_ok();
        if !ok {
            return vec![];
        }
        buf.chunks_exact(24)
            .map(|c| {
                let uaddr = u64::from_ne_bytes(c[8..16].try_into().expect("8 bytes"));
                let flags = u32::from_ne_bytes(c[16..20].try_into().expect("4 bytes"));
                (uaddr, flags as u64 & PRIVATE != 0)
            })
            .collect()
    }

    fn process(&mut self, tid: i32) -> i32 {
        let c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        c.process_of.get(&tid).copied().unwrap_or(tid)
    }
}
