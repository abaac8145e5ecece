//! Printing an error with its causes.
//!
//! The errors of every crate of ours say what failed in their own message
//! and keep the underlying error as their `source()`, never both (a
//! program that prints the chain, as `deploy` does through anyhow, would
//! say the cause twice). Where a message goes to a log line, a report or
//! a JSON field rather than through such a program, [`Chain`] prints the
//! whole chain once.

use std::fmt;

/// Displays an error and each of its causes, `what: why: deeper why`.
///
/// ```
/// use units::error::Chain;
/// let e = std::io::Error::other("disk on fire");
/// assert_eq!(Chain(&e).to_string(), "disk on fire");
/// ```
#[derive(Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        // Bounded: a chain longer than this is cut rather than followed
        // forever (a cycle of sources is possible in principle).
        for _ in 0..32 {
            let Some(c) = cause else { break };
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open {path}")]
    struct Outer {
        path: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn prints_each_cause_once() {
        let e = Outer {
            path: "/x",
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        };
        assert_eq!(
            Chain(&e).to_string(),
            "cannot open /x: No such file or directory (os error 2)"
        );
    }
}
