//! What an image needs to know of the programs it carries, read from
//! their ELF headers: the machine they run on, the interpreter and the
//! libraries a dynamically linked one needs from the base; and their
//! debug information, split off so that the robot gets them stripped.
//!
//! Every field comes from a file the user gave and is hostile: every
//! offset, size and count is checked against the file before it is used,
//! strings and tables are bounded, and a file that does not hold together
//! is an error naming what is wrong, never a panic.
//!
//! Stripping keeps every byte a loaded program uses: the file is kept up
//! to the end of its last segment and of its last kept section; the
//! sections after that which only a debugger reads (`.debug_*`,
//! `.symtab`, `.strtab`) go, and a `.gnu_debuglink` section names the
//! file they were split into, with its CRC-32, as `objcopy
//! --add-gnu-debuglink` writes it (see gdb's "Separate Debug Files").

use std::fmt;

const MAGIC: &[u8; 4] = b"\x7fELF";
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const SHDR_SIZE: usize = 64;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;
const SHT_NOBITS: u32 = 8;
const SHT_RELA: u32 = 4;
const SHT_REL: u32 = 9;
const SHF_ALLOC: u64 = 0x2;
const SHF_INFO_LINK: u64 = 0x40;
const SHN_XINDEX: u16 = 0xffff;

/// The most program headers, dynamic entries and library names read:
/// far above what linkers write.
const MAX_PHDRS: usize = 4096;
const MAX_DYNAMIC: usize = 1 << 16;
const MAX_NEEDED: usize = 1024;
/// The longest interpreter path or library name read.
const MAX_NAME: usize = 4096;

/// The machines boards run, by `e_machine`.
pub fn machine_name(machine: u16) -> String {
    match machine {
        3 => "i386".into(),
        40 => "arm".into(),
        62 => "x86_64".into(),
        183 => "aarch64".into(),
        243 => "riscv".into(),
        m => format!("machine {m}"),
    }
}

/// The `e_machine` of a board architecture name (`cpusets::board`'s).
pub fn machine_of(arch: &str) -> Option<u16> {
    match arch {
        "x86_64" => Some(62),
        "aarch64" => Some(183),
        _ => None,
    }
}

/// A program's ELF facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Elf {
    /// `e_machine`.
    pub machine: u16,
    /// 64-bit little-endian (what aarch64 and x86_64 run); the fields below
    /// are read only for those.
    pub class64_le: bool,
    /// PT_INTERP: the dynamic loader, absolute, for a dynamically linked
    /// program; `None` for a static one.
    pub interp: Option<String>,
    /// DT_NEEDED, in order.
    pub needed: Vec<String>,
    /// DT_RUNPATH (or DT_RPATH), split at `:`.
    pub runpath: Vec<String>,
}

/// Why a file's ELF structure cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfFormatError(pub String);

impl fmt::Display for ElfFormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad(what: impl Into<String>) -> ElfFormatError {
    ElfFormatError(what.into())
}

/// Whether `bytes` starts like an ELF file.
pub fn is_elf(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && &bytes[..4] == MAGIC
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, ElfFormatError> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or_else(|| bad(format!("cut short at byte {at}")))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, ElfFormatError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
        .ok_or_else(|| bad(format!("cut short at byte {at}")))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, ElfFormatError> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
        .ok_or_else(|| bad(format!("cut short at byte {at}")))
}

/// `[off, off + len)` of `b`, or why not.
fn range(
    b: &[u8],
    off: u64,
    len: u64,
    what: &str,
) -> Result<std::ops::Range<usize>, ElfFormatError> {
    let end = off
        .checked_add(len)
        .filter(|&e| e <= b.len() as u64)
        .ok_or_else(|| {
            bad(format!(
                "{what} at byte {off} ({len} bytes) runs past the end of the {}-byte file",
                b.len()
            ))
        })?;
    Ok(off as usize..end as usize)
}

/// A NUL-terminated string at `off` of `b`, within `limit` bytes.
fn c_str(b: &[u8], off: usize, limit: usize, what: &str) -> Result<String, ElfFormatError> {
    let tail = b
        .get(off..)
        .ok_or_else(|| bad(format!("{what} starts past the end of its table")))?;
    let tail = &tail[..tail.len().min(limit.min(MAX_NAME + 1))];
    let n = tail
        .iter()
        .position(|&c| c == 0)
        .ok_or_else(|| bad(format!("{what} is not terminated within {MAX_NAME} bytes")))?;
    String::from_utf8(tail[..n].to_vec()).map_err(|_| bad(format!("{what} is not UTF-8")))
}

struct Phdr {
    kind: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

fn phdrs(b: &[u8]) -> Result<Vec<Phdr>, ElfFormatError> {
    let phoff = u64_at(b, 32)?;
    let phentsize = u16_at(b, 54)? as usize;
    let phnum = u16_at(b, 56)? as usize;
    if phnum == 0 {
        return Ok(Vec::new());
    }
    if phentsize != PHDR_SIZE {
        return Err(bad(format!(
            "program headers of {phentsize} bytes (expected {PHDR_SIZE})"
        )));
    }
    if phnum > MAX_PHDRS {
        return Err(bad(format!(
            "{phnum} program headers (at most {MAX_PHDRS})"
        )));
    }
    let r = range(b, phoff, (phnum * PHDR_SIZE) as u64, "the program headers")?;
    (0..phnum)
        .map(|i| {
            let at = r.start + i * PHDR_SIZE;
            Ok(Phdr {
                kind: u32_at(b, at)?,
                offset: u64_at(b, at + 8)?,
                vaddr: u64_at(b, at + 16)?,
                filesz: u64_at(b, at + 32)?,
            })
        })
        .collect()
}

/// Reads what an image checks of the ELF file `b`.
pub fn inspect(b: &[u8]) -> Result<Elf, ElfFormatError> {
    if !is_elf(b) {
        return Err(bad("not an ELF file"));
    }
    if b.len() < EHDR_SIZE {
        return Err(bad(format!(
            "an ELF header of {} bytes (expected {EHDR_SIZE})",
            b.len()
        )));
    }
    let class64_le = b[4] == ELFCLASS64 && b[5] == ELFDATA2LSB;
    let machine = if b[5] == ELFDATA2LSB {
        u16_at(b, 18)?
    } else {
        u16::from_be_bytes([b[18], b[19]])
    };
    let mut elf = Elf {
        machine,
        class64_le,
        interp: None,
        needed: Vec::new(),
        runpath: Vec::new(),
    };
    if !class64_le {
        return Ok(elf);
    }
    let ph = phdrs(b)?;
    if let Some(p) = ph.iter().find(|p| p.kind == PT_INTERP) {
        let r = range(b, p.offset, p.filesz, "the interpreter path")?;
        elf.interp = Some(c_str(b, r.start, r.len(), "the interpreter path")?);
    }
    let Some(dynamic) = ph.iter().find(|p| p.kind == PT_DYNAMIC) else {
        return Ok(elf);
    };
    let r = range(b, dynamic.offset, dynamic.filesz, "the dynamic section")?;
    let (mut strtab, mut strsz) = (None, None);
    let mut needed_at = Vec::new();
    let mut runpath_at = None;
    for i in 0..(r.len() / 16).min(MAX_DYNAMIC) {
        let at = r.start + i * 16;
        let (tag, val) = (u64_at(b, at)?, u64_at(b, at + 8)?);
        match tag {
            DT_NULL => break,
            DT_NEEDED if needed_at.len() < MAX_NEEDED => needed_at.push(val),
            DT_STRTAB => strtab = Some(val),
            DT_STRSZ => strsz = Some(val),
            DT_RUNPATH => runpath_at = Some(val),
            DT_RPATH if runpath_at.is_none() => runpath_at = Some(val),
            _ => {}
        }
    }
    if needed_at.is_empty() && runpath_at.is_none() {
        return Ok(elf);
    }
    let (Some(addr), Some(size)) = (strtab, strsz) else {
        return Err(bad("a dynamic section without its string table"));
    };
    // The string table is named by its address: the load segment that
    // holds it says where it is in the file.
    let load = ph
        .iter()
        .find(|p| p.kind == PT_LOAD && addr >= p.vaddr && addr - p.vaddr < p.filesz)
        .ok_or_else(|| {
            bad(format!(
                "the string table at address {addr:#x} is in no segment"
            ))
        })?;
    let table = range(
        b,
        load.offset + (addr - load.vaddr),
        size,
        "the string table",
    )?;
    let s = &b[table];
    for off in needed_at {
        elf.needed
            .push(c_str(s, off as usize, s.len(), "a library name")?);
    }
    if let Some(off) = runpath_at {
        elf.runpath = c_str(s, off as usize, s.len(), "the run path")?
            .split(':')
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect();
    }
    Ok(elf)
}

/// A section header, as read.
#[derive(Debug, Clone)]
struct Shdr {
    name: String,
    kind: u32,
    flags: u64,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    raw: [u8; SHDR_SIZE],
}

fn shdrs(b: &[u8]) -> Result<Option<(Vec<Shdr>, usize)>, ElfFormatError> {
    let shoff = u64_at(b, 40)?;
    let shentsize = u16_at(b, 58)? as usize;
    let shnum = u16_at(b, 60)? as usize;
    let shstrndx = u16_at(b, 62)?;
    if shnum == 0 || shoff == 0 {
        // No sections, or more than 65279 (extended numbering): nothing
        // this strips.
        return Ok(None);
    }
    if shstrndx == SHN_XINDEX {
        return Ok(None);
    }
    if shentsize != SHDR_SIZE {
        return Err(bad(format!(
            "section headers of {shentsize} bytes (expected {SHDR_SIZE})"
        )));
    }
    let r = range(b, shoff, (shnum * SHDR_SIZE) as u64, "the section headers")?;
    let raw: Vec<[u8; SHDR_SIZE]> = (0..shnum)
        .map(|i| {
            let at = r.start + i * SHDR_SIZE;
            b[at..at + SHDR_SIZE].try_into().expect("a whole header")
        })
        .collect();
    let shstrndx = shstrndx as usize;
    let names = raw
        .get(shstrndx)
        .ok_or_else(|| bad(format!("section name table {shstrndx} of {shnum} sections")))?;
    let names = range(
        b,
        u64_at(names, 24)?,
        u64_at(names, 32)?,
        "the section name table",
    )?;
    let names = &b[names];
    let headers = raw
        .into_iter()
        .map(|h| {
            Ok(Shdr {
                name: c_str(
                    names,
                    u32_at(&h, 0)? as usize,
                    names.len(),
                    "a section name",
                )?,
                kind: u32_at(&h, 4)?,
                flags: u64_at(&h, 8)?,
                offset: u64_at(&h, 24)?,
                size: u64_at(&h, 32)?,
                link: u32_at(&h, 40)?,
                info: u32_at(&h, 44)?,
                raw: h,
            })
        })
        .collect::<Result<Vec<_>, ElfFormatError>>()?;
    Ok(Some((headers, shstrndx)))
}

/// What only a debugger reads: the DWARF sections (`.debug_*`, compressed
/// `.zdebug_*`) and the static symbol table with its strings.
fn is_debug(s: &Shdr) -> bool {
    s.flags & SHF_ALLOC == 0
        && (s.name.starts_with(".debug")
            || s.name.starts_with(".zdebug")
            || s.name == ".symtab"
            || s.name == ".strtab"
            || s.name == ".gnu_debuglink")
}

/// `b` without its debug sections, with a `.gnu_debuglink` naming
/// `debug_name` (the file the caller keeps `b` in) and `debug_crc` (its
/// CRC-32); `None` when `b` has no debug section (nothing to strip) or is
/// not a 64-bit little-endian ELF. The same input gives the same bytes.
pub fn strip(
    b: &[u8],
    debug_name: &str,
    debug_crc: u32,
) -> Result<Option<Vec<u8>>, ElfFormatError> {
    if !is_elf(b) || b.len() < EHDR_SIZE || b[4] != ELFCLASS64 || b[5] != ELFDATA2LSB {
        return Ok(None);
    }
    let Some((sections, shstrndx)) = shdrs(b)? else {
        return Ok(None);
    };
    let mut drop: Vec<bool> = sections
        .iter()
        .enumerate()
        .map(|(i, s)| i != 0 && i != shstrndx && is_debug(s))
        .collect();
    // Relocations of a dropped section go with it.
    for (i, s) in sections.iter().enumerate() {
        if (s.kind == SHT_RELA || s.kind == SHT_REL)
            && s.flags & SHF_ALLOC == 0
            && drop.get(s.info as usize).copied().unwrap_or(false)
        {
            drop[i] = true;
        }
    }
    let debug_info = sections.iter().enumerate().any(|(i, s)| {
        drop[i]
            && (s.name.starts_with(".debug")
                || s.name.starts_with(".zdebug")
                || s.name == ".symtab")
    });
    if !debug_info {
        return Ok(None);
    }
    // Everything a loader reads, and every kept section, stays where it is.
    let mut end = EHDR_SIZE as u64;
    let phoff = u64_at(b, 32)?;
    let phnum = u16_at(b, 56)? as u64;
    end = end.max(phoff.saturating_add(phnum * PHDR_SIZE as u64));
    for p in phdrs(b)? {
        end = end.max(range(b, p.offset, p.filesz, "a segment")?.end as u64);
    }
    for (i, s) in sections.iter().enumerate() {
        if !drop[i] && i != shstrndx && s.kind != SHT_NOBITS && i != 0 {
            end = end.max(range(b, s.offset, s.size, &format!("section {}", s.name))?.end as u64);
        }
    }
    let mut out = b[..end as usize].to_vec();
    let pad = |out: &mut Vec<u8>, align: usize| {
        while out.len() % align != 0 {
            out.push(0);
        }
    };
    // .gnu_debuglink: the name, NUL, padding to 4, the CRC.
    pad(&mut out, 4);
    let link_at = out.len();
    out.extend_from_slice(debug_name.as_bytes());
    out.push(0);
    pad(&mut out, 4);
    out.extend_from_slice(&debug_crc.to_le_bytes());
    let link_size = out.len() - link_at;
    // The new section name table.
    let kept: Vec<usize> = (0..sections.len()).filter(|&i| !drop[i]).collect();
    let new_index = |old: u32| -> u32 {
        kept.iter()
            .position(|&k| k == old as usize)
            .map_or(0, |n| n as u32)
    };
    let mut names = vec![0u8];
    let mut name_at = Vec::new();
    for &i in &kept {
        if i == 0 {
            name_at.push(0);
            continue;
        }
        name_at.push(names.len() as u32);
        names.extend_from_slice(sections[i].name.as_bytes());
        names.push(0);
    }
    let link_name = names.len() as u32;
    names.extend_from_slice(b".gnu_debuglink\0");
    let names_at = out.len();
    out.extend_from_slice(&names);
    pad(&mut out, 8);
    let shoff = out.len();
    for (n, &i) in kept.iter().enumerate() {
        let s = &sections[i];
        let mut h = s.raw;
        h[0..4].copy_from_slice(&name_at[n].to_le_bytes());
        if i != 0 {
            h[40..44].copy_from_slice(&new_index(s.link).to_le_bytes());
            if s.kind == SHT_RELA || s.kind == SHT_REL || s.flags & SHF_INFO_LINK != 0 {
                h[44..48].copy_from_slice(&new_index(s.info).to_le_bytes());
            }
        }
        if i == shstrndx {
            h[24..32].copy_from_slice(&(names_at as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(names.len() as u64).to_le_bytes());
        }
        out.extend_from_slice(&h);
    }
    let mut h = [0u8; SHDR_SIZE];
    h[0..4].copy_from_slice(&link_name.to_le_bytes());
    h[4..8].copy_from_slice(&1u32.to_le_bytes()); // SHT_PROGBITS
    h[24..32].copy_from_slice(&(link_at as u64).to_le_bytes());
    h[32..40].copy_from_slice(&(link_size as u64).to_le_bytes());
    h[48..56].copy_from_slice(&4u64.to_le_bytes());
    out.extend_from_slice(&h);
    let shnum = kept.len() + 1;
    if shnum > 0xff00 {
        return Ok(None);
    }
    out[40..48].copy_from_slice(&(shoff as u64).to_le_bytes());
    out[60..62].copy_from_slice(&(shnum as u16).to_le_bytes());
    out[62..64].copy_from_slice(&(new_index(shstrndx as u32) as u16).to_le_bytes());
    Ok(Some(out))
}

/// The sections of `b` by name, for tests and reports.
pub fn section_names(b: &[u8]) -> Result<Vec<String>, ElfFormatError> {
    Ok(shdrs(b)?
        .map(|(s, _)| s.into_iter().map(|s| s.name).collect())
        .unwrap_or_default())
}

/// The `.gnu_debuglink` of `b`: the debug file's name and CRC-32.
pub fn debuglink(b: &[u8]) -> Result<Option<(String, u32)>, ElfFormatError> {
    let Some((sections, _)) = shdrs(b)? else {
        return Ok(None);
    };
    let Some(s) = sections.iter().find(|s| s.name == ".gnu_debuglink") else {
        return Ok(None);
    };
    let r = range(b, s.offset, s.size, "the debug link")?;
    let d = &b[r];
    let name = c_str(d, 0, d.len(), "the debug file name")?;
    let crc_at = (name.len() + 1).div_ceil(4) * 4;
    Ok(Some((name, u32_at(d, crc_at)?)))
}

/// CRC-32 (IEEE, as zlib and `.gnu_debuglink` use it) of `b`.
pub fn crc32(b: &[u8]) -> u32 {
    let mut c = flate2::Crc::new();
    c.update(b);
    c.sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-byte static ELF header for `machine`.
    pub fn header(machine: u16) -> Vec<u8> {
        let mut h = vec![0u8; EHDR_SIZE];
        h[..4].copy_from_slice(MAGIC);
        h[4] = ELFCLASS64;
        h[5] = ELFDATA2LSB;
        h[6] = 1;
        h[16..18].copy_from_slice(&2u16.to_le_bytes());
        h[18..20].copy_from_slice(&machine.to_le_bytes());
        h[20..24].copy_from_slice(&1u32.to_le_bytes());
        h[52..54].copy_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
        h
    }

    #[test]
    fn this_test_program_is_read_as_the_linker_wrote_it() {
        let b = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let e = inspect(&b).unwrap();
        assert!(e.class64_le);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(machine_name(e.machine), "x86_64");
        #[cfg(target_arch = "aarch64")]
        assert_eq!(machine_name(e.machine), "aarch64");
        // Built against glibc, dynamically.
        assert!(
            e.interp.as_deref().is_some_and(|i| i.starts_with('/')),
            "{e:?}"
        );
        assert!(e.needed.iter().any(|n| n.starts_with("libc.so")), "{e:?}");
    }

    #[test]
    fn a_static_header_has_its_machine_and_nothing_else() {
        let e = inspect(&header(183)).unwrap();
        assert_eq!(
            e,
            Elf {
                machine: 183,
                class64_le: true,
                interp: None,
                needed: Vec::new(),
                runpath: Vec::new(),
            }
        );
        assert!(strip(&header(183), "x.debug", 0).unwrap().is_none());
    }

    #[test]
    fn a_cut_or_garbled_file_is_an_error_never_a_panic() {
        let b = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(inspect(&b[..40]).is_err());
        assert!(inspect(b"not elf").is_err());
        // Cut at every 997th byte of the first 64 KiB, and flipped bytes
        // in the headers: any outcome but a panic.
        for cut in (0..b.len().min(64 << 10)).step_by(997) {
            let _ = inspect(&b[..cut]);
            let _ = strip(&b[..cut], "d", 0);
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut g = b[..b.len().min(1 << 20)].to_vec();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x as usize) % 128;
                g[at] = (x >> 40) as u8;
            }
            let _ = inspect(&g);
            let _ = strip(&g, "d", 0);
            let _ = section_names(&g);
        }
    }

    #[test]
    fn a_stripped_program_runs_keeps_no_debug_section_and_links_its_debug_file() {
        let exe = std::env::current_exe().unwrap();
        let b = std::fs::read(&exe).unwrap();
        assert!(
            section_names(&b)
                .unwrap()
                .iter()
                .any(|n| n == ".debug_info"),
            "a test build carries debug information"
        );
        let crc = crc32(&b);
        let s = strip(&b, "prog.debug", crc)
            .unwrap()
            .expect("something to strip");
        assert!(s.len() < b.len() / 2, "{} of {} bytes", s.len(), b.len());
        let names = section_names(&s).unwrap();
        // What only a debugger reads is gone (`.debug_gdb_scripts` is
        // loaded, and stays).
        for gone in [
            ".debug_info",
            ".debug_line",
            ".debug_str",
            ".symtab",
            ".strtab",
        ] {
            assert!(!names.iter().any(|n| n == gone), "{gone}: {names:?}");
        }
        assert!(names.iter().any(|n| n == ".text") && names.iter().any(|n| n == ".dynsym"));
        assert_eq!(
            debuglink(&s).unwrap(),
            Some(("prog.debug".to_string(), crc))
        );
        assert_eq!(inspect(&s).unwrap(), inspect(&b).unwrap());
        // The same bytes every time.
        assert!(strip(&b, "prog.debug", crc).unwrap().unwrap() == s);
        // Nothing left to strip the second time.
        assert!(strip(&s, "prog.debug", crc).unwrap().is_none());
        // And it runs: this test binary, stripped, lists its tests.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("stripped");
        std::fs::write(&p, &s).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = std::process::Command::new(&p)
            .arg("--list")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("elf::tests::"));
    }
}
