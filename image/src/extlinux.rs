//! `/boot/extlinux/extlinux.conf`, as Jetson Linux's UEFI boot loader reads
//! it: the planned command line merged into the `APPEND` line of the
//! default `LABEL`, a fallback `LABEL` that boots the original line, and a
//! lint against what the boot loader accepts.
//!
//! Every line the merge does not change is kept byte for byte (comments,
//! indentation, other labels), so the result diffs cleanly against the
//! base.
//!
//! The boot loader is NVIDIA's L4TLauncher (edk2-nvidia,
//! `Silicon/NVIDIA/Application/L4TLauncher/L4TLauncher.c`,
//! `ProcessExtLinuxConfig`, branches r35.3.1-updates to r36.4.3-updates:
//! https://github.com/NVIDIA/edk2-nvidia/blob/r36.4.3-updates/Silicon/NVIDIA/Application/L4TLauncher/L4TLauncher.c).
//! What it does with a line, and so what the lint refuses:
//! - it cuts the line at the first `#` (anywhere, an `APPEND` argument
//!   too) and trims spaces and tabs;
//! - it compares the start of the line with each keyword it knows, case
//!   sensitively (`StrnCmp`): TIMEOUT, DEFAULT, MENU TITLE, LABEL, MENU
//!   LABEL, LINUX, INITRD, FDT, APPEND, and OVERLAYS (read from R36 on;
//!   R35's launcher ignores it). Any other line, `KERNEL` or a lower case
//!   `linux` included, is skipped without a word, so a label whose kernel
//!   is given by `KERNEL` has none and does not boot;
//! - it keeps at most 10 labels (`MAX_EXTLINUX_OPTIONS`): an 11th `LABEL`
//!   is dropped and the lines after it overwrite the 10th label's kernel,
//!   initrd and arguments;
//! - lines of a label before the first `LABEL` are skipped.

use cpusets::cmdline::{merge, Token};

/// The name of the label rtdeploy adds with the original command line.
pub const FALLBACK_LABEL: &str = "rtdeploy-original";

/// The keywords L4TLauncher reads, as it spells them.
pub const L4T_KEYWORDS: &[&str] = &[
    "TIMEOUT",
    "DEFAULT",
    "MENU TITLE",
    "LABEL",
    "MENU LABEL",
    "LINUX",
    "INITRD",
    "FDT",
    "APPEND",
    "OVERLAYS",
];

/// The most labels L4TLauncher keeps (`MAX_EXTLINUX_OPTIONS`).
pub const MAX_LABELS: usize = 10;

/// The kernel's command line buffer on arm64 (`COMMAND_LINE_SIZE`).
pub const MAX_CMDLINE: usize = 2048;

/// The largest extlinux.conf taken (read, linted, merged, kept for a
/// rollback): [`releases::system::MAX_BOOT_FILE`]. L4TLauncher keeps
/// [`MAX_LABELS`] labels of a few lines each, an APPEND at most
/// [`MAX_CMDLINE`] bytes: what it boots is a few KiB.
pub const MAX_FILE_BYTES: usize = releases::system::MAX_BOOT_FILE as usize;

/// Problems [`lint`] lists in words; more are counted in one last line.
pub const MAX_PROBLEMS: usize = 20;

/// One non-blank, non-comment line: its keyword (upper case) and argument.
fn keyword(line: &str) -> Option<(String, &str)> {
    let t = line.trim_start();
    if t.is_empty() || t.starts_with('#') {
        return None;
    }
    let (kw, rest) = t.split_once(|c: char| c.is_whitespace()).unwrap_or((t, ""));
    let mut kw = kw.to_ascii_uppercase();
    let mut rest = rest.trim();
    if kw == "MENU" {
        let (sub, r) = rest
            .split_once(|c: char| c.is_whitespace())
            .unwrap_or((rest, ""));
        kw = format!("MENU {}", sub.to_ascii_uppercase());
        rest = r.trim();
    }
    Some((kw, rest))
}

/// A label and the line range it spans (its `LABEL` line to the line
/// before the next `LABEL`, trailing blank and comment lines excluded).
#[derive(Debug)]
struct Label {
    name: String,
    start: usize,
    end: usize,
}

fn labels(lines: &[&str]) -> Vec<Label> {
    let mut out: Vec<Label> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if let Some((kw, arg)) = keyword(line) {
            if kw == "LABEL" {
                out.push(Label {
                    name: arg.to_string(),
                    start: i,
                    end: i + 1,
                });
            } else if let Some(l) = out.last_mut() {
                l.end = i + 1;
            }
        }
    }
    out
}

/// The `DEFAULT` label's name; the first label when there is no `DEFAULT`
/// (as the boot loader does).
fn default_label(lines: &[&str]) -> Option<String> {
    lines
        .iter()
        .filter_map(|l| keyword(l))
        .find(|(kw, _)| kw == "DEFAULT")
        .map(|(_, a)| a.to_string())
        .or_else(|| labels(lines).first().map(|l| l.name.clone()))
}

/// The result of merging: the new file, and the APPEND line before and
/// after (arguments only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    pub text: String,
    pub label: String,
    pub original: String,
    pub append: String,
}

/// Checks `text` against the boot loader's limits; one message per problem,
/// each naming its line: the first [`MAX_PROBLEMS`], then how many more. A
/// file over [`MAX_FILE_BYTES`] is one problem, without a look inside.
pub fn lint(text: &str) -> Vec<String> {
    if text.len() > MAX_FILE_BYTES {
        return vec![format!(
            "the file is {} bytes, over the {} KiB an extlinux.conf may be here (the boot loader keeps {MAX_LABELS} labels; what it boots is a few KiB)",
            text.len(),
            MAX_FILE_BYTES >> 10
        )];
    }
    let mut problems = lint_lines(text);
    if problems.len() > MAX_PROBLEMS {
        let more = problems.len() - MAX_PROBLEMS;
        problems.truncate(MAX_PROBLEMS);
        problems.push(format!("and {more} more problem(s)"));
    }
    problems
}

fn lint_lines(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut problems = Vec::new();
    let all = labels(&lines);
    if all.is_empty() {
        problems.push("no LABEL (expected at least one boot entry)".to_string());
    }
    if let Some(d) = lines
        .iter()
        .filter_map(|l| keyword(l))
        .find(|(k, _)| k == "DEFAULT")
    {
        if !all.iter().any(|l| l.name == d.1) {
            problems.push(format!(
                "DEFAULT names label `{}`, which does not exist",
                d.1
            ));
        }
    }
    if all.len() > MAX_LABELS {
        problems.push(format!(
            "{} LABEL entries, over the {MAX_LABELS} the boot loader (L4TLauncher) keeps: it drops `{}` and later ones and applies their lines to `{}`",
            all.len(),
            all[MAX_LABELS].name,
            all[MAX_LABELS - 1].name
        ));
    }
    let mut seen_label = false;
    for (i, line) in lines.iter().enumerate() {
        let Some((kw, arg)) = keyword(line) else {
            continue;
        };
        let n = i + 1;
        let known = L4T_KEYWORDS.contains(&kw.as_str());
        match kw.as_str() {
            "KERNEL" => problems.push(format!(
                "line {n}: the boot loader (L4TLauncher) does not read KERNEL, so the label would have no kernel (use LINUX)"
            )),
            "FDTDIR" => problems.push(format!(
                "line {n}: FDTDIR is not supported by the Jetson boot loader (name the file with FDT /boot/....dtb)"
            )),
            _ if !known => problems.push(format!(
                "line {n}: `{kw}` is not a keyword the boot loader (L4TLauncher) reads, it would skip the line (expected {})",
                L4T_KEYWORDS.join(", ")
            )),
            _ if !line.trim_start().starts_with(kw.as_str()) => problems.push(format!(
                "line {n}: the boot loader (L4TLauncher) reads `{kw}` only as written here, in upper case with one space; it would skip `{}`",
                line.trim()
            )),
            "LINUX" | "INITRD" | "FDT" if !arg.starts_with('/') => {
                problems.push(format!("line {n}: {kw} path `{arg}` is not absolute (expected /boot/...)"))
            }
            "APPEND" if arg.len() > MAX_CMDLINE => problems.push(format!(
                "line {n}: APPEND is {} bytes, over the kernel's {MAX_CMDLINE}-byte command line",
                arg.len()
            )),
            _ => {}
        }
        if kw == "LABEL" {
            seen_label = true;
        } else if known
            && !seen_label
            && !matches!(kw.as_str(), "TIMEOUT" | "DEFAULT" | "MENU TITLE")
        {
            problems.push(format!(
                "line {n}: {kw} before the first LABEL belongs to no entry; the boot loader (L4TLauncher) skips it"
            ));
        }
        if let Some(at) = line.find('#').filter(|_| kw == "APPEND") {
            problems.push(format!(
                "line {n}: `#` starts a comment for the boot loader (L4TLauncher) anywhere in a line; it would drop `{}` from the command line",
                &line[at..]
            ));
        }
    }
    for l in &all {
        let appends = (l.start..l.end)
            .filter(|&i| keyword(lines[i]).is_some_and(|(k, _)| k == "APPEND"))
            .count();
        if appends > 1 {
            problems.push(format!(
                "line {}: label `{}` has {appends} APPEND lines (expected one)",
                l.start + 1,
                l.name
            ));
        }
        let kernels = (l.start..l.end)
            .filter(|&i| keyword(lines[i]).is_some_and(|(k, _)| k == "LINUX"))
            .count();
        if kernels != 1 {
            problems.push(format!(
                "line {}: label `{}` has {kernels} LINUX lines (expected one)",
                l.start + 1,
                l.name
            ));
        }
    }
    problems
}

/// Merges `planned` into the default label's APPEND line and adds the
/// fallback label (once: a file that already has it keeps the one it has).
pub fn merge_conf(text: &str, planned: &[Token]) -> Result<Merged, Vec<String>> {
    let lines: Vec<&str> = text.lines().collect();
    let problems = lint(text);
    if !problems.is_empty() {
        return Err(problems);
    }
    let name = default_label(&lines).ok_or_else(|| vec!["no LABEL to boot".to_string()])?;
    let all = labels(&lines);
    let label = all
        .iter()
        .find(|l| l.name == name)
        .ok_or_else(|| vec![format!("default label `{name}` does not exist")])?;
    let append_at =
        (label.start..label.end).find(|&i| keyword(lines[i]).is_some_and(|(k, _)| k == "APPEND"));
    let original = append_at
        .and_then(|i| keyword(lines[i]))
        .map(|(_, a)| a.to_string())
        .unwrap_or_default();
    let append = merge(&original, planned);
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    match append_at {
        Some(i) => {
            let indent: String = lines[i].chars().take_while(|c| c.is_whitespace()).collect();
            out[i] = format!("{indent}APPEND {append}");
        }
        None => {
            let indent: String = lines[label.start + 1..label.end]
                .iter()
                .find_map(|l| {
                    keyword(l).map(|_| l.chars().take_while(|c| c.is_whitespace()).collect())
                })
                .unwrap_or_else(|| "      ".to_string());
            out.insert(label.end, format!("{indent}APPEND {append}"));
        }
    }
    if !all.iter().any(|l| l.name == FALLBACK_LABEL) {
        if all.len() >= MAX_LABELS {
            return Err(vec![format!(
                "the fallback label `{FALLBACK_LABEL}` would be entry {} of extlinux.conf, over the {MAX_LABELS} the boot loader (L4TLauncher) keeps; remove an entry from the base's /boot/extlinux/extlinux.conf",
                all.len() + 1
            )]);
        }
        let mut block = Vec::new();
        block.push(String::new());
        block.push(format!("LABEL {FALLBACK_LABEL}"));
        block.push(format!(
            "      MENU LABEL {name} with the command line it had before rtdeploy"
        ));
        for line in &lines[label.start + 1..label.end] {
            match keyword(line) {
                Some((k, _)) if k == "MENU LABEL" => {}
                Some(_) => block.push(line.to_string()),
                None => {}
            }
        }
        if append_at.is_none() {
            block.push("      APPEND".to_string());
        }
        while out.last().is_some_and(|l| l.trim().is_empty()) {
            out.pop();
        }
        out.extend(block);
    }
    let mut text_out = out.join("\n");
    text_out.push('\n');
    let problems = lint(&text_out);
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Merged {
        text: text_out,
        label: name,
        original,
        append,
    })
}

/// The labels of system updates start with this (`rtdeploy-release-<release>`);
/// only these are pruned.
pub const SYSTEM_LABEL_PREFIX: &str = "rtdeploy-release-";

/// A system update's entry: the new file, and what it was made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemEntry {
    pub text: String,
    /// The new label, `DEFAULT` in `text`.
    pub label: String,
    /// The label that was `DEFAULT`, kept as the fallback.
    pub previous_label: String,
    /// The new label's APPEND arguments.
    pub append: String,
    /// System update labels removed (older than the previous `DEFAULT`).
    pub pruned: Vec<String>,
}

/// Adds a label for `release` that boots the `DEFAULT` label's kernel with
/// its APPEND line changed from the `old` plan to the `new` one (every
/// token whose key either plan sets is the new plan's; the rest is kept),
/// and makes it `DEFAULT`. The previous `DEFAULT` label stays as it is, the
/// fallback a rollback makes `DEFAULT` again; labels of earlier system
/// updates (other than that one) are removed, so the file stays within
/// the boot loader's [`MAX_LABELS`]. The result passes [`lint`].
pub fn add_system_entry(
    text: &str,
    release: &str,
    old: &[Token],
    new: &[Token],
) -> Result<SystemEntry, Vec<String>> {
    let problems = lint(text);
    if !problems.is_empty() {
        return Err(problems);
    }
    let lines: Vec<&str> = text.lines().collect();
    let previous = default_label(&lines).ok_or_else(|| vec!["no LABEL to boot".to_string()])?;
    let label_name = format!("{SYSTEM_LABEL_PREFIX}{release}");
    if label_name.chars().any(|c| c.is_whitespace() || c == '#') {
        return Err(vec![format!(
            "release name `{release}` cannot be part of a label"
        )]);
    }
    let all = labels(&lines);
    let base = all
        .iter()
        .find(|l| l.name == previous)
        .ok_or_else(|| vec![format!("default label `{previous}` does not exist")])?;
    let original = (base.start..base.end)
        .filter_map(|i| keyword(lines[i]))
        .find(|(k, _)| k == "APPEND")
        .map(|(_, a)| a.to_string())
        .unwrap_or_default();
    // The old plan's keys go (a token the new plan no longer has, such as
    // nohz_full turned off, must not stay), then the new plan is merged.
    let old_keys: Vec<&str> = old.iter().map(|t| t.key()).collect();
    let kept: Vec<String> = cpusets::cmdline::split(&original)
        .into_iter()
        .filter(|t| !old_keys.contains(&cpusets::cmdline::key_of(t)))
        .collect();
    let append = merge(&kept.join(" "), new);
    let mut block = vec![
        format!("LABEL {label_name}"),
        format!("      MENU LABEL release {release} (rtdeploy system update)"),
    ];
    let mut indent = "      ".to_string();
    for line in &lines[base.start + 1..base.end] {
        match keyword(line) {
            Some((k, _)) if k == "MENU LABEL" || k == "APPEND" => {
                indent = line.chars().take_while(|c| c.is_whitespace()).collect();
            }
            Some(_) => block.push(line.to_string()),
            None => {}
        }
    }
    block.push(format!("{indent}APPEND {append}"));
    // Drop earlier system update labels (not the previous DEFAULT) and a
    // label of this name from an earlier attempt.
    let mut drop = vec![false; lines.len()];
    let mut pruned = Vec::new();
    for l in &all {
        if l.name == label_name || (l.name.starts_with(SYSTEM_LABEL_PREFIX) && l.name != previous) {
            for d in drop.iter_mut().take(l.end).skip(l.start) {
                *d = true;
            }
            if l.name != label_name {
                pruned.push(l.name.clone());
            }
        }
    }
    let mut out: Vec<String> = Vec::new();
    let mut has_default = false;
    for (i, line) in lines.iter().enumerate() {
        if drop[i] {
            continue;
        }
        match keyword(line) {
            Some((k, _)) if k == "DEFAULT" => {
                let ind: String = line.chars().take_while(|c| c.is_whitespace()).collect();
                out.push(format!("{ind}DEFAULT {label_name}"));
                has_default = true;
            }
            _ => out.push(line.to_string()),
        }
    }
    if !has_default {
        let at = out
            .iter()
            .position(|l| keyword(l).is_some_and(|(k, _)| k == "LABEL"))
            .unwrap_or(0);
        out.insert(at, format!("DEFAULT {label_name}"));
        out.insert(at + 1, String::new());
    }
    // No runs of blank lines where labels were removed.
    out.dedup_by(|a, b| a.trim().is_empty() && b.trim().is_empty());
    while out.last().is_some_and(|l| l.trim().is_empty()) {
        out.pop();
    }
    out.push(String::new());
    out.extend(block);
    let mut text_out = out.join("\n");
    text_out.push('\n');
    let problems = lint(&text_out);
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(SystemEntry {
        text: text_out,
        label: label_name,
        previous_label: previous,
        append,
        pruned,
    })
}

/// The `DEFAULT` label of `text` (the first label without one), as the
/// boot loader picks it.
pub fn default_of(text: &str) -> Option<String> {
    default_label(&text.lines().collect::<Vec<_>>())
}

/// The names of the labels of `text`, in order.
pub fn label_names(text: &str) -> Vec<String> {
    labels(&text.lines().collect::<Vec<_>>())
        .into_iter()
        .map(|l| l.name)
        .collect()
}

/// The APPEND arguments of `label` in `text`, for checks.
pub fn append_of(text: &str, label: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let l = labels(&lines).into_iter().find(|l| l.name == label)?;
    (l.start..l.end)
        .filter_map(|i| keyword(lines[i]))
        .find(|(k, _)| k == "APPEND")
        .map(|(_, a)| a.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const JETSON: &str = "TIMEOUT 30\nDEFAULT primary\n\nMENU TITLE L4T boot options\n\nLABEL primary\n      MENU LABEL primary kernel\n      LINUX /boot/Image\n      FDT /boot/dtb/kernel_tegra234-p3768-0000+p3767-0005-nv.dtb\n      INITRD /boot/initrd\n      APPEND ${cbootargs} root=/dev/mmcblk0p1 rw rootwait rootfstype=ext4 console=ttyTCU0,115200 isolcpus=3\n\n# a backup entry, commented out\n# LABEL backup\n#    LINUX /boot/Image.backup\n\nLABEL recovery\n      MENU LABEL recovery kernel\n      LINUX /boot/Image.recovery\n      APPEND ${cbootargs} root=/dev/mmcblk0p1 ro\n";

    fn tok(t: &str) -> Token {
        Token {
            token: t.into(),
            reason: "test".into(),
        }
    }

    #[test]
    fn merges_the_default_label_only_and_adds_a_fallback() {
        let planned = [tok("isolcpus=managed_irq,domain,4-5"), tok("rcu_nocb_poll")];
        let m = merge_conf(JETSON, &planned).unwrap();
        assert_eq!(m.label, "primary");
        assert_eq!(
            m.append,
            "${cbootargs} root=/dev/mmcblk0p1 rw rootwait rootfstype=ext4 console=ttyTCU0,115200 isolcpus=managed_irq,domain,4-5 rcu_nocb_poll"
        );
        assert_eq!(append_of(&m.text, "primary").unwrap(), m.append);
        assert_eq!(
            append_of(&m.text, "recovery").unwrap(),
            "${cbootargs} root=/dev/mmcblk0p1 ro"
        );
        assert_eq!(append_of(&m.text, FALLBACK_LABEL).unwrap(), m.original);
        assert!(m.text.contains("# LABEL backup\n"));
        assert!(m.text.contains("      FDT /boot/dtb/kernel_tegra234"));
        // Merging the result again changes nothing and adds no second fallback.
        let again = merge_conf(&m.text, &planned).unwrap();
        assert_eq!(again.text, m.text);
    }

    #[test]
    fn lint_names_each_problem() {
        let bad = "DEFAULT a\nLABEL a\n  LINUX Image\n  FDTDIR /boot/dtb\n  APPEND x\n  APPEND y\nLABEL b\n  APPEND z\n";
        let p = lint(bad);
        assert!(
            p.iter()
                .any(|p| p.contains("line 3") && p.contains("not absolute")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|p| p.contains("line 4") && p.contains("FDTDIR")),
            "{p:?}"
        );
        assert!(p.iter().any(|p| p.contains("`a` has 2 APPEND")), "{p:?}");
        assert!(p.iter().any(|p| p.contains("`b` has 0 LINUX")), "{p:?}");
        assert!(lint(JETSON).is_empty());
        assert!(merge_conf(bad, &[]).is_err());
        let p = lint("DEFAULT nope\nLABEL a\n LINUX /boot/Image\n");
        assert!(p.iter().any(|p| p.contains("`nope`")), "{p:?}");
    }

    /// One test per rule of L4TLauncher's parser (see the module
    /// documentation), each on NVIDIA's own extlinux.conf with one change.
    #[test]
    fn lint_follows_l4t_launcher() {
        // Jetson Linux's bootloader/extlinux.conf (R35.3.1 and R36.2).
        let nvidia = "TIMEOUT 30\nDEFAULT primary\n\nMENU TITLE L4T boot options\n\nLABEL primary\n      MENU LABEL primary kernel\n      LINUX /boot/Image\n      INITRD /boot/initrd\n      APPEND ${cbootargs}\n";
        assert_eq!(lint(nvidia), Vec::<String>::new());
        let with_overlays = format!("{nvidia}      OVERLAYS /boot/a.dtbo\n      FDT /boot/k.dtb\n");
        assert_eq!(lint(&with_overlays), Vec::<String>::new());

        // KERNEL is not read: refused, pointing at LINUX.
        let kernel = nvidia.replace("LINUX /boot/Image", "KERNEL /boot/Image");
        assert_eq!(
            lint(&kernel),
            [
                "line 8: the boot loader (L4TLauncher) does not read KERNEL, so the label would have no kernel (use LINUX)",
                "line 6: label `primary` has 0 LINUX lines (expected one)",
            ]
        );
        assert!(merge_conf(&kernel, &[]).is_err());

        // Keywords are read in upper case only, and unknown ones skipped.
        let lower = nvidia.replace("LINUX /boot/Image", "linux /boot/Image");
        let p = lint(&lower);
        assert!(
            p.iter().any(|p| p.starts_with(
                "line 8: the boot loader (L4TLauncher) reads `LINUX` only as written here"
            )),
            "{p:?}"
        );
        let two_spaces = nvidia.replace("MENU LABEL", "MENU  LABEL");
        assert_eq!(lint(&two_spaces).len(), 1, "{:?}", lint(&two_spaces));
        let unknown = nvidia.replace("TIMEOUT 30", "PROMPT 1");
        let p = lint(&unknown);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with(
                "line 1: `PROMPT` is not a keyword the boot loader (L4TLauncher) reads"
            ),
            "{p:?}"
        );
        assert!(
            lint(&nvidia.replace("MENU TITLE", "MENU BACKGROUND"))[0].contains("`MENU BACKGROUND`")
        );

        // A label's line before the first LABEL belongs to no entry.
        let early = nvidia.replace("DEFAULT primary", "DEFAULT primary\nAPPEND quiet");
        assert!(
            lint(&early)[0].starts_with("line 3: APPEND before the first LABEL"),
            "{:?}",
            lint(&early)
        );

        // `#` cuts an APPEND line.
        let hash = nvidia.replace("APPEND ${cbootargs}", "APPEND ${cbootargs} quiet # debug");
        assert!(
            lint(&hash)[0].contains("would drop `# debug` from the command line"),
            "{:?}",
            lint(&hash)
        );
        assert!(lint(&nvidia.replace("LINUX /boot/Image", "LINUX /boot/Image # ours")).is_empty());
    }

    fn entries(n: usize) -> String {
        let mut t = String::from("TIMEOUT 30\nDEFAULT l0\n");
        for i in 0..n {
            t.push_str(&format!(
                "\nLABEL l{i}\n      LINUX /boot/Image\n      APPEND ${{cbootargs}}\n"
            ));
        }
        t
    }

    #[test]
    fn at_most_ten_entries() {
        assert!(lint(&entries(10)).is_empty());
        assert_eq!(
            lint(&entries(11)),
            ["11 LABEL entries, over the 10 the boot loader (L4TLauncher) keeps: it drops `l10` and later ones and applies their lines to `l9`"]
        );
        // Nine entries and the fallback make ten.
        let m = merge_conf(&entries(9), &[tok("nohz_full=4-5")]).unwrap();
        assert_eq!(labels(&m.text.lines().collect::<Vec<_>>()).len(), 10);
        // Ten entries leave no room for the fallback: refused, nothing made.
        assert_eq!(
            merge_conf(&entries(10), &[tok("nohz_full=4-5")]).unwrap_err(),
            ["the fallback label `rtdeploy-original` would be entry 11 of extlinux.conf, over the 10 the boot loader (L4TLauncher) keeps; remove an entry from the base's /boot/extlinux/extlinux.conf"]
        );
        // A file that has the fallback already is merged again as before.
        let again = merge_conf(&m.text, &[tok("nohz_full=4-5")]).unwrap();
        assert_eq!(again.text, m.text);
    }

    #[test]
    fn a_system_update_adds_a_default_label_and_prunes_older_ones() {
        let old = [tok("isolcpus=managed_irq,domain,4-5"), tok("nohz_full=4-5")];
        let merged = merge_conf(JETSON, &old).unwrap().text;
        let new = [tok("isolcpus=managed_irq,domain,5"), tok("rcu_nocbs=5")];
        let e = add_system_entry(&merged, "2.0-aaaaaaaa", &old, &new).unwrap();
        assert_eq!(e.previous_label, "primary");
        assert_eq!(e.label, "rtdeploy-release-2.0-aaaaaaaa");
        assert_eq!(default_of(&e.text).unwrap(), e.label);
        assert_eq!(
            label_names(&e.text),
            [
                "primary",
                "recovery",
                FALLBACK_LABEL,
                "rtdeploy-release-2.0-aaaaaaaa"
            ]
        );
        // nohz_full was the old plan's and is not the new one's: gone.
        assert_eq!(
            append_of(&e.text, &e.label).unwrap(),
            "${cbootargs} root=/dev/mmcblk0p1 rw rootwait rootfstype=ext4 console=ttyTCU0,115200 isolcpus=managed_irq,domain,5 rcu_nocbs=5"
        );
        assert_eq!(
            append_of(&e.text, "primary").unwrap(),
            append_of(&merged, "primary").unwrap()
        );
        assert!(e.text.contains("      FDT /boot/dtb/kernel_tegra234"));
        assert!(lint(&e.text).is_empty());
        // The next update keeps 2.0 (the DEFAULT now) and the base's labels.
        let e3 = add_system_entry(&e.text, "3.0-bbbbbbbb", &new, &old).unwrap();
        assert_eq!(e3.previous_label, "rtdeploy-release-2.0-aaaaaaaa");
        assert!(e3.pruned.is_empty());
        // ...and the one after removes 2.0: never more than two of ours.
        let e4 = add_system_entry(&e3.text, "4.0-cccccccc", &old, &new).unwrap();
        assert_eq!(e4.pruned, ["rtdeploy-release-2.0-aaaaaaaa"]);
        assert_eq!(
            label_names(&e4.text),
            [
                "primary",
                "recovery",
                FALLBACK_LABEL,
                "rtdeploy-release-3.0-bbbbbbbb",
                "rtdeploy-release-4.0-cccccccc"
            ]
        );
        for _ in 0..20 {
            let again = add_system_entry(&e4.text, "5.0-dddddddd", &new, &old).unwrap();
            assert!(label_names(&again.text).len() <= MAX_LABELS);
        }
        assert!(!e4.text.contains("\n\n\n"), "{}", e4.text);
    }

    #[test]
    fn a_system_update_refuses_a_full_file() {
        let e =
            add_system_entry(&entries(10), "2-aaaaaaaa", &[], &[tok("nohz_full=1")]).unwrap_err();
        assert!(e[0].starts_with("11 LABEL entries"), "{e:?}");
        // Nine and ours make ten.
        let e = add_system_entry(&entries(9), "2-aaaaaaaa", &[], &[tok("nohz_full=1")]).unwrap();
        assert_eq!(default_of(&e.text).unwrap(), "rtdeploy-release-2-aaaaaaaa");
        assert_eq!(label_names(&e.text).len(), 10);
    }

    #[test]
    fn adds_an_append_line_when_the_label_has_none() {
        let m = merge_conf("LABEL only\n  LINUX /boot/Image\n", &[tok("nohz_full=2-3")]).unwrap();
        assert_eq!(append_of(&m.text, "only").unwrap(), "nohz_full=2-3");
        assert_eq!(append_of(&m.text, FALLBACK_LABEL).unwrap(), "");
    }
}
