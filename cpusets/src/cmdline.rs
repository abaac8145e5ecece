//! The kernel command line that isolates the real-time CPUs.
//!
//! The plan is a list of tokens, each with the reason it is there, so that
//! `deploy plan` can explain the line and `deploy verify` can check each
//! token against `/proc/cmdline`.

use serde::{Deserialize, Serialize};

use crate::config::{CpusSection, KernelSection};
use units::cpu::CpuSet;

/// One planned command line token and why it is there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    pub token: String,
    pub reason: String,
}

impl Token {
    fn new(token: String, reason: &str) -> Self {
        Token {
            token,
            reason: reason.to_string(),
        }
    }

    /// The part before `=`, which names what the token sets.
    pub fn key(&self) -> &str {
        key_of(&self.token)
    }
}

/// The key of a command line token: `isolcpus` for `isolcpus=4-5`.
pub fn key_of(token: &str) -> &str {
    token.split_once('=').map_or(token, |(k, _)| k)
}

/// Command line parameters only one architecture's kernel knows, from
/// the kernel's parameter documentation
/// (Documentation/admin-guide/kernel-parameters.txt marks them `[X86]` or
/// `[ARM64]`): on the other the kernel ignores them (and says so only in
/// the boot log).
const ARCH_ONLY: &[(&str, &str)] = &[
    ("tsc", "x86_64"),
    ("intel_pstate", "x86_64"),
    ("intel_idle.max_cstate", "x86_64"),
    ("processor.max_cstate", "x86_64"),
    ("intel_iommu", "x86_64"),
    ("amd_pstate", "x86_64"),
    ("mce", "x86_64"),
    ("nopti", "x86_64"),
    ("noapic", "x86_64"),
    ("nolapic", "x86_64"),
    ("kpti", "aarch64"),
    ("arm64.nobti", "aarch64"),
    ("arm64.nopauth", "aarch64"),
    ("arm64.nomte", "aarch64"),
    ("irqchip.gicv3_pseudo_nmi", "aarch64"),
];

/// The architecture `token` belongs to when it is not `arch`'s
/// (`tsc=reliable` on an aarch64 board is x86_64's).
pub fn foreign_arch(token: &str, arch: &str) -> Option<&'static str> {
    let key = key_of(token);
    ARCH_ONLY
        .iter()
        .find(|(k, a)| *k == key && *a != arch)
        .map(|(_, a)| *a)
}

/// Plans the command line for `cpus` on a board whose CPUs are `all`.
pub fn plan(cpus: &CpusSection, kernel: &KernelSection, all: &CpuSet) -> Vec<Token> {
    let isolated = &cpus.isolated;
    let housekeeping = cpus.housekeeping(all);
    let mut tokens = vec![Token::new(
        format!("isolcpus=managed_irq,domain,{isolated}"),
        "take the isolated CPUs out of scheduler load balancing (domain) and keep managed device interrupts off them (managed_irq)",
    )];
    if cpus.nohz_full {
        tokens.push(Token::new(
            format!("nohz_full={isolated}"),
            "stop the periodic scheduler tick on isolated CPUs while they run a single task",
        ));
    }
    tokens.push(Token::new(
        format!("rcu_nocbs={isolated}"),
        "run RCU callbacks in kthreads on housekeeping CPUs instead of softirq on the isolated ones",
    ));
    tokens.push(Token::new(
        "rcu_nocb_poll".to_string(),
        "RCU callback kthreads poll for work, so isolated CPUs never wake them",
    ));
    tokens.push(Token::new(
        format!("irqaffinity={housekeeping}"),
        "default affinity of every interrupt: the housekeeping CPUs",
    ));
    for t in &kernel.cmdline {
        tokens.push(Token::new(t.clone(), "from kernel.cmdline in robot.yaml"));
    }
    tokens
}

/// The tokens joined into one line.
pub fn render(tokens: &[Token]) -> String {
    tokens
        .iter()
        .map(|t| t.token.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Merges planned tokens into an existing command line: every existing token
/// is kept in place except those whose key a planned token sets, which take
/// the planned value (once, where the first of them stood); planned tokens
/// with new keys are appended in plan order. Quoted values (`"a b"`) stay
/// whole.
pub fn merge(existing: &str, planned: &[Token]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut placed = vec![false; planned.len()];
    for tok in split(existing) {
        match planned.iter().position(|p| p.key() == key_of(&tok)) {
            Some(i) if !placed[i] => {
                placed[i] = true;
                out.push(planned[i].token.clone());
            }
            Some(_) => {}
            None => out.push(tok),
        }
    }
    for (i, p) in planned.iter().enumerate() {
        if !placed[i] {
            out.push(p.token.clone());
        }
    }
    out.join(" ")
}

/// Splits a command line into tokens the way the kernel does: on white
/// space, except inside double quotes.
pub fn split(line: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    tokens.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        tokens.push(cur);
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PartitionKind;

    fn cpus(hk: Option<&str>, iso: &str, nohz: bool) -> CpusSection {
        CpusSection {
            housekeeping: hk.map(|s| s.parse().unwrap()),
            isolated: iso.parse().unwrap(),
            nohz_full: nohz,
            partition: PartitionKind::Isolated,
        }
    }

    #[test]
    fn plans_isolation_tokens() {
        let kernel = KernelSection {
            cmdline: vec!["mitigations=off".into()],
            ..KernelSection::default()
        };
        let t = plan(&cpus(None, "4-5", true), &kernel, &CpuSet::first(6));
        let line = render(&t);
        assert_eq!(
            line,
            "isolcpus=managed_irq,domain,4-5 nohz_full=4-5 rcu_nocbs=4-5 rcu_nocb_poll irqaffinity=0-3 mitigations=off"
        );
        assert!(t.iter().all(|t| !t.reason.is_empty()));
        let t = plan(
            &cpus(Some("0"), "1", false),
            &KernelSection::default(),
            &CpuSet::first(2),
        );
        assert!(!render(&t).contains("nohz_full"));
        assert!(render(&t).contains("irqaffinity=0"));
    }

    #[test]
    fn merge_replaces_keys_and_keeps_the_rest() {
        let planned = plan(
            &cpus(None, "4-5", true),
            &KernelSection::default(),
            &CpuSet::first(6),
        );
        let existing = r#"root=/dev/mmcblk0p1 rw rootwait isolcpus=3 console=ttyTCU0,115200 fbcon=map:0 isolcpus=2 quiet"#;
        let merged = merge(existing, &planned);
        assert_eq!(
            merged,
            "root=/dev/mmcblk0p1 rw rootwait isolcpus=managed_irq,domain,4-5 console=ttyTCU0,115200 fbcon=map:0 quiet nohz_full=4-5 rcu_nocbs=4-5 rcu_nocb_poll irqaffinity=0-3"
        );
        // Merging again changes nothing.
        assert_eq!(merge(&merged, &planned), merged);
    }

    #[test]
    fn split_keeps_quotes() {
        assert_eq!(
            split(r#"a  b="x y" c"#),
            vec!["a".to_string(), "b=\"x y\"".into(), "c".into()]
        );
    }

    #[test]
    fn x86_parameters_on_an_arm64_board_and_back() {
        assert_eq!(foreign_arch("tsc=reliable", "aarch64"), Some("x86_64"));
        assert_eq!(foreign_arch("tsc=reliable", "x86_64"), None);
        assert_eq!(foreign_arch("kpti=0", "x86_64"), Some("aarch64"));
        assert_eq!(foreign_arch("nosoftlockup", "aarch64"), None);
        assert_eq!(foreign_arch("mce", "aarch64"), Some("x86_64"));
    }
}
