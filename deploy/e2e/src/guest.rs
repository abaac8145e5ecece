//! What a guest's test driver printed (`scripts/e2e/driver.sh`, the probe
//! init): single values as `E2E <key> <value>` lines and command outputs
//! between `E2E-BLOCK-BEGIN <name>` and `E2E-BLOCK-END <name> rc=<status>`
//! lines, read back here; JSON documents in them through our own types.

use std::path::Path;

use serde::de::DeserializeOwned;

/// A console's text, carriage returns dropped. Reading is bounded: a
/// console that grew past `MAX_CONSOLE` is read up to that.
pub struct Console {
    text: String,
}

/// The most of a console that is read (a runaway guest must not fill the
/// host's memory).
pub const MAX_CONSOLE: u64 = 64 << 20;

impl Console {
    /// The console in `path`; empty when the file is missing.
    pub fn read(path: &Path) -> Console {
        use std::io::Read as _;
        let mut bytes = Vec::new();
        if let Ok(f) = std::fs::File::open(path) {
            let _ = f.take(MAX_CONSOLE).read_to_end(&mut bytes);
        }
        Console::from_text(&String::from_utf8_lossy(&bytes))
    }

    pub fn from_text(text: &str) -> Console {
        Console {
            text: text.replace('\r', ""),
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn lines(&self) -> impl Iterator<Item = &str> {
        self.text.lines()
    }

    /// Whether some line is exactly `line`.
    pub fn has_line(&self, line: &str) -> bool {
        self.lines().any(|l| l == line)
    }

    /// Whether some line starts with `prefix`.
    pub fn has_line_starting(&self, prefix: &str) -> bool {
        self.lines().any(|l| l.starts_with(prefix))
    }

    /// The value of the first `E2E <key> <value>` line.
    pub fn value(&self, key: &str) -> Option<&str> {
        let prefix = format!("E2E {key} ");
        self.lines().find_map(|l| l.strip_prefix(prefix.as_str()))
    }

    /// The values of every `E2E <key> <value>` line.
    pub fn values<'a>(&'a self, key: &str) -> Vec<&'a str> {
        let prefix = format!("E2E {key} ");
        self.lines()
            .filter_map(|l| l.strip_prefix(prefix.as_str()))
            .collect()
    }

    /// The output of block `name` (empty when the guest never ran it).
    pub fn block(&self, name: &str) -> String {
        let begin = format!("E2E-BLOCK-BEGIN {name}");
        let end = format!("E2E-BLOCK-END {name} ");
        let mut out = String::new();
        let mut on = false;
        for l in self.lines() {
            if !on {
                on = l == begin;
            } else if l.starts_with(end.as_str()) {
                break;
            } else {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// The exit status of block `name`.
    pub fn block_rc(&self, name: &str) -> Option<i32> {
        let end = format!("E2E-BLOCK-END {name} rc=");
        self.lines().find_map(|l| {
            let rest = l.strip_prefix(end.as_str())?;
            rest.split_whitespace().next()?.parse().ok()
        })
    }

    /// The JSON document block `name` printed, as `T`.
    pub fn block_json<T: DeserializeOwned>(&self, name: &str) -> Result<T, String> {
        json_of(&self.block(name))
    }
}

/// The first line of `text` that is a JSON object of type `T`, else the
/// whole text as one (pretty-printed) document; the error says why not.
pub fn json_of<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    let mut first_error = None;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('{') && l.ends_with('}') {
            match serde_json::from_str::<T>(l) {
                Ok(v) => return Ok(v),
                Err(e) => {
                    first_error.get_or_insert(e.to_string());
                }
            }
        }
    }
    match serde_json::from_str::<T>(text.trim()) {
        Ok(v) => Ok(v),
        Err(e) if text.trim().is_empty() => Err(format!("no JSON document ({e})")),
        Err(e) => Err(first_error.unwrap_or_else(|| e.to_string())),
    }
}

/// The words of `tokens` (a planned kernel command line) that `line` lacks.
pub fn missing_tokens(line: &str, tokens: &str) -> Vec<String> {
    let have: Vec<&str> = line.split_whitespace().collect();
    tokens
        .split_whitespace()
        .filter(|t| !have.contains(t))
        .map(str::to_string)
        .collect()
}

/// The first `n` lines of `s`.
pub fn head_lines(s: &str, n: usize) -> String {
    s.lines().take(n).collect::<Vec<_>>().join("\n")
}

/// The last `n` lines of `s`.
pub fn tail_lines(s: &str, n: usize) -> String {
    let l: Vec<&str> = s.lines().collect();
    l[l.len().saturating_sub(n)..].join("\n")
}

/// The largest count in a listener's log: its lines say `received N
/// messages`.
pub fn received(log: &str) -> Option<u64> {
    log.lines()
        .filter_map(|l| {
            let i = l.find("received ")?;
            l[i + 9..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .max()
}

/// The first `max` characters of `s` (for a message that quotes a guest).
pub fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONSOLE: &str = "boot noise\r\nE2E realtime 1\r\nE2E isolated 2-3\nE2E-BLOCK-BEGIN status-json\n\
        not json\n{\"a\": 1}\n\nE2E-BLOCK-END status-json rc=0 at=1234\nE2E-BLOCK-BEGIN status-json-stderr\n\
        E2E-BLOCK-END status-json-stderr rc=0\nE2E-BLOCK-BEGIN verify\nE2E-BLOCK-END verify rc=3 at=5\n\
        E2E isolated 9\n";

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct A {
        a: u32,
    }

    #[test]
    fn values_blocks_and_their_status_are_read_back() {
        let c = Console::from_text(CONSOLE);
        assert_eq!(c.value("realtime"), Some("1"));
        assert_eq!(c.value("isolated"), Some("2-3"));
        assert_eq!(c.values("isolated"), vec!["2-3", "9"]);
        assert_eq!(c.value("missing"), None);
        assert_eq!(c.block("status-json"), "not json\n{\"a\": 1}\n\n");
        assert_eq!(c.block("status-json-stderr"), "");
        assert_eq!(c.block_rc("status-json"), Some(0));
        assert_eq!(c.block_rc("verify"), Some(3));
        assert_eq!(c.block_rc("never"), None);
        assert_eq!(c.block_json::<A>("status-json"), Ok(A { a: 1 }));
        assert!(c.block_json::<A>("verify").unwrap_err().contains("no JSON"));
    }

    #[test]
    fn a_block_cut_short_by_the_end_of_the_console_is_what_came() {
        let c = Console::from_text("E2E-BLOCK-BEGIN x\nline\n");
        assert_eq!(c.block("x"), "line\n");
        assert_eq!(c.block_rc("x"), None);
    }

    #[test]
    fn a_pretty_printed_document_is_read_whole_and_a_wrong_shape_is_said() {
        assert_eq!(json_of::<A>("{\n  \"a\": 7\n}\n"), Ok(A { a: 7 }));
        let e = json_of::<A>("{\"b\": 1}").unwrap_err();
        assert!(e.contains("missing field `a`"), "{e}");
    }

    #[test]
    fn the_received_count_is_the_largest_the_listener_printed() {
        let log = "listener: backend doorbell, class real-time\nlistener: received 1000 messages on /demo/chatter (lost 0)\nlistener: received 23000 messages on /demo/chatter\n";
        assert_eq!(received(log), Some(23000));
        assert_eq!(received("no count"), None);
        assert_eq!(received("received nothing"), None);
    }

    #[test]
    fn head_and_tail_take_whole_lines() {
        assert_eq!(head_lines("a\nb\nc\n", 2), "a\nb");
        assert_eq!(tail_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail_lines("a", 5), "a");
    }

    #[test]
    fn missing_tokens_are_the_planned_words_the_line_lacks() {
        assert_eq!(
            missing_tokens(
                "console=ttyS0 isolcpus=2-3 nohz_full=2-3",
                "isolcpus=2-3 nohz_full=2-3 rcu_nocbs=2-3"
            ),
            vec!["rcu_nocbs=2-3"]
        );
        assert!(missing_tokens("a b", "").is_empty());
        assert_eq!(missing_tokens("", "a"), vec!["a"]);
    }
}
