//! `/boot/extlinux/extlinux.conf`, as Jetson Linux's UEFI boot loader reads
//! it: the planned command line merged into the `APPEND` line of the
//! default `LABEL`, a fallback `LABEL` that boots the original line, and a
//! lint against what the boot loader accepts.
//!
//! Every line the merge does not change is kept byte for byte (comments,
//! indentation, other labels), so the result diffs cleanly against the
//! base.

use cpusets::cmdline::{merge, Token};

/// The name of the label rtdeploy adds with the original command line.
pub const FALLBACK_LABEL: &str = "rtdeploy-original";

/// The kernel's command line buffer on arm64 (`COMMAND_LINE_SIZE`).
pub const MAX_CMDLINE: usize = 2048;

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
/// each naming its line.
pub fn lint(text: &str) -> Vec<String> {
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
    for (i, line) in lines.iter().enumerate() {
        let Some((kw, arg)) = keyword(line) else {
            continue;
        };
        let n = i + 1;
        match kw.as_str() {
            "FDTDIR" => problems.push(format!(
                "line {n}: FDTDIR is not supported by the Jetson boot loader (name the file with FDT /boot/....dtb)"
            )),
            "LINUX" | "KERNEL" | "INITRD" | "FDT" if !arg.starts_with('/') => {
                problems.push(format!("line {n}: {kw} path `{arg}` is not absolute (expected /boot/...)"))
            }
            "APPEND" if arg.len() > MAX_CMDLINE => problems.push(format!(
                "line {n}: APPEND is {} bytes, over the kernel's {MAX_CMDLINE}-byte command line",
                arg.len()
            )),
            _ => {}
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
            .filter(|&i| keyword(lines[i]).is_some_and(|(k, _)| k == "LINUX" || k == "KERNEL"))
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

    #[test]
    fn adds_an_append_line_when_the_label_has_none() {
        let m = merge_conf("LABEL only\n  LINUX /boot/Image\n", &[tok("nohz_full=2-3")]).unwrap();
        assert_eq!(append_of(&m.text, "only").unwrap(), "nohz_full=2-3");
        assert_eq!(append_of(&m.text, FALLBACK_LABEL).unwrap(), "");
    }
}
