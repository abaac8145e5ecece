//! What a run found: every assertion printed as it is decided (PASS, FAIL
//! or SKIP with its reason), the phases timed, and at the end the serial
//! consoles of the boots that failed an assertion.

use std::path::{Path, PathBuf};
use std::time::Instant;

/// The run's assertions and phases.
pub struct Report {
    name: &'static str,
    passed: usize,
    failed: usize,
    skipped: usize,
    /// The failed assertions' names, repeated after the counts: a log
    /// cut to its head and tail still says what failed.
    failures: Vec<String>,
    /// Consoles to print at the end, each once, in the order they failed.
    failed_logs: Vec<PathBuf>,
    phases: Vec<(String, f64)>,
    phase: Option<(String, Instant)>,
    start: Instant,
}

impl Report {
    pub fn new(name: &'static str) -> Report {
        Report {
            name,
            passed: 0,
            failed: 0,
            skipped: 0,
            failures: Vec::new(),
            failed_logs: Vec::new(),
            phases: Vec::new(),
            phase: None,
            start: Instant::now(),
        }
    }

    pub fn pass(&mut self, what: impl AsRef<str>) {
        self.passed += 1;
        println!("PASS: {}", what.as_ref());
    }

    /// A failed assertion; `log` is the console to show at the end.
    pub fn fail(&mut self, what: impl AsRef<str>, why: impl AsRef<str>, log: Option<&Path>) {
        self.failed += 1;
        let why_short: String = why.as_ref().chars().take(400).collect();
        self.failures
            .push(format!("{}: {why_short}", what.as_ref()));
        println!("FAIL: {}: {}", what.as_ref(), why.as_ref());
        if let Some(l) = log {
            self.log_failed(l);
        }
    }

    pub fn skip(&mut self, what: impl AsRef<str>, why: impl AsRef<str>) {
        self.skipped += 1;
        println!("SKIP: {}: {}", what.as_ref(), why.as_ref());
    }

    /// PASS when `got` is `want` (naming it), else FAIL with both.
    pub fn check(&mut self, what: &str, want: &str, got: &str, log: Option<&Path>) {
        if want == got {
            self.pass(format!("{what} ({got})"));
        } else {
            self.fail(what, format!("expected '{want}', got '{got}'"), log);
        }
    }

    /// PASS when `ok`, else FAIL with `why`.
    pub fn assert(
        &mut self,
        ok: bool,
        what: impl AsRef<str>,
        why: impl AsRef<str>,
        log: Option<&Path>,
    ) {
        if ok {
            self.pass(what);
        } else {
            self.fail(what, why, log);
        }
    }

    pub fn log_failed(&mut self, log: &Path) {
        if !self.failed_logs.iter().any(|l| l == log) {
            self.failed_logs.push(log.to_path_buf());
        }
    }

    #[cfg(test)]
    pub fn failed(&self) -> usize {
        self.failed
    }

    /// Starts timing a phase (ending the one before).
    pub fn phase(&mut self, name: &str) {
        self.end_phase();
        crate::say(format!("phase {name}"));
        self.phase = Some((name.to_string(), Instant::now()));
    }

    pub fn end_phase(&mut self) {
        if let Some((name, t)) = self.phase.take() {
            self.phases.push((name, t.elapsed().as_secs_f64()));
        }
    }

    /// Prints the failing boots' consoles (through `show`), the phase
    /// timings and the counts; the exit status: 0 when nothing failed.
    pub fn finish(mut self, show: impl Fn(&Path)) -> u8 {
        self.end_phase();
        for l in &self.failed_logs {
            show(l);
        }
        println!("\nphase timings:");
        let width = self
            .phases
            .iter()
            .map(|(n, _)| n.len())
            .max()
            .unwrap_or(5)
            .max(5);
        for (n, s) in &self.phases {
            println!("  {n:<width$} {s:>7.1} s");
        }
        println!(
            "  {:<width$} {:>7.1} s",
            "total",
            self.start.elapsed().as_secs_f64()
        );
        println!(
            "{}: {} passed, {} failed, {} skipped",
            self.name, self.passed, self.failed, self.skipped
        );
        for f in &self.failures {
            println!("  failed: {f}");
        }
        u8::from(self.failed > 0)
    }
}
