//! Users and groups, resolved by name through `<prefix>/etc/passwd` and
//! `<prefix>/etc/group` (on a robot the prefix is `/`), or given as numeric
//! ids.
//!
//! The supervisor reads the files itself instead of calling `getpwnam(3)`:
//! NSS may load modules and take locks, and the files under the prefix are
//! the ones the image ships.

use std::path::{Path, PathBuf};

/// Why a user or group could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum AccountResolveError {
    #[error("cannot read {}: {err}", path.display())]
    Read { path: PathBuf, err: std::io::Error },
    #[error("unknown user `{name}` (not in {})", path.display())]
    UnknownUser { name: String, path: PathBuf },
    #[error("unknown group `{name}` (not in {})", path.display())]
    UnknownGroup { name: String, path: PathBuf },
}

/// One line of `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswdEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// One line of `/etc/group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

/// Parses `/etc/passwd` text; malformed lines are skipped.
pub fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 4 {
                return None;
            }
            Some(PasswdEntry {
                name: f[0].to_string(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
            })
        })
        .collect()
}

/// Parses `/etc/group` text; malformed lines are skipped.
pub fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 3 {
                return None;
            }
            Some(GroupEntry {
                name: f[0].to_string(),
                gid: f[2].parse().ok()?,
                members: f
                    .get(3)
                    .map(|m| {
                        m.split(',')
                            .filter(|s| !s.is_empty())
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// The account database under a prefix.
#[derive(Debug, Clone, Default)]
pub struct Accounts {
    pub passwd_path: PathBuf,
    pub group_path: PathBuf,
    pub users: Vec<PasswdEntry>,
    pub groups: Vec<GroupEntry>,
}

/// What a process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the user's memberships in `/etc/group`).
    pub groups: Vec<u32>,
}

fn is_numeric(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_digit())
}

/// The most read of `etc/passwd` or `etc/group`.
pub const MAX_ACCOUNTS_FILE: u64 = 16 << 20;

impl Accounts {
    /// Reads `<prefix>/etc/passwd` and `<prefix>/etc/group`. A missing file
    /// is an empty database (numeric ids still resolve); any other read
    /// error is returned.
    pub fn load(prefix: &Path) -> Result<Self, AccountResolveError> {
        let passwd_path = prefix.join("etc/passwd");
        let group_path = prefix.join("etc/group");
        // Bounded (units::bounded): a site's account files are far under
        // MAX_ACCOUNTS_FILE; a link is followed (some systems keep them
        // elsewhere), a FIFO or a device refused.
        let read = |p: &Path| match units::bounded::Bound::regular(MAX_ACCOUNTS_FILE)
            .following_links()
            .read_lossy(p)
        {
            Ok(t) => Ok(t),
            Err(e) if e.is_not_found() => Ok(String::new()),
            Err(e) => Err(AccountResolveError::Read {
                path: p.to_path_buf(),
                err: e.into_io(),
            }),
        };
        Ok(Accounts {
            users: parse_passwd(&read(&passwd_path)?),
            groups: parse_group(&read(&group_path)?),
            passwd_path,
            group_path,
        })
    }

    pub fn user(&self, name: &str) -> Option<&PasswdEntry> {
        self.users.iter().find(|u| u.name == name)
    }

    /// A group's id, by name or number.
    pub fn gid(&self, group: &str) -> Result<u32, AccountResolveError> {
        if is_numeric(group) {
            return group
                .parse()
                .map_err(|_| AccountResolveError::UnknownGroup {
                    name: group.to_string(),
                    path: self.group_path.clone(),
                });
        }
        self.groups
            .iter()
            .find(|g| g.name == group)
            .map(|g| g.gid)
            .ok_or_else(|| AccountResolveError::UnknownGroup {
                name: group.to_string(),
                path: self.group_path.clone(),
            })
    }

    /// Resolves `user:` and `group:` of a process. No user means the
    /// supervisor's own identity (returns `None`); a user without a group
    /// takes the user's primary group; a group alone changes only the gid.
    pub fn identity(
        &self,
        user: Option<&str>,
        group: Option<&str>,
        own: (u32, u32),
    ) -> Result<Option<Identity>, AccountResolveError> {
        if user.is_none() && group.is_none() {
            return Ok(None);
        }
        let (uid, primary, name) = match user {
            None => (own.0, own.1, None),
            Some(u) if is_numeric(u) => {
                let uid: u32 = u.parse().map_err(|_| AccountResolveError::UnknownUser {
                    name: u.to_string(),
                    path: self.passwd_path.clone(),
                })?;
                match self.users.iter().find(|e| e.uid == uid) {
                    Some(e) => (uid, e.gid, Some(e.name.clone())),
                    None => (uid, uid, None),
                }
            }
            Some(u) => {
                let e = self
                    .user(u)
                    .ok_or_else(|| AccountResolveError::UnknownUser {
                        name: u.to_string(),
                        path: self.passwd_path.clone(),
                    })?;
                (e.uid, e.gid, Some(e.name.clone()))
            }
        };
        let gid = match group {
            Some(g) => self.gid(g)?,
            None => primary,
        };
        let mut groups = vec![gid];
        if let Some(name) = &name {
            for g in &self.groups {
                if g.members.iter().any(|m| m == name) && !groups.contains(&g.gid) {
                    groups.push(g.gid);
                }
            }
        }
        Ok(Some(Identity { uid, gid, groups }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Accounts {
        Accounts {
            passwd_path: "/p/etc/passwd".into(),
            group_path: "/p/etc/group".into(),
            users: parse_passwd(
                "root:x:0:0:root:/root:/bin/sh\nrobot:x:1000:1000::/home/robot:/bin/sh\nbad line\n",
            ),
            groups: parse_group("root:x:0:\nrobot:x:1000:\nrt:x:900:robot,other\n"),
        }
    }

    #[test]
    fn resolves_names_and_numbers() {
        let a = db();
        let id = a.identity(Some("robot"), None, (0, 0)).unwrap().unwrap();
        assert_eq!(
            id,
            Identity {
                uid: 1000,
                gid: 1000,
                groups: vec![1000, 900]
            }
        );
        let id = a
            .identity(Some("1000"), Some("rt"), (0, 0))
            .unwrap()
            .unwrap();
        assert_eq!((id.uid, id.gid), (1000, 900));
        let id = a.identity(Some("4242"), None, (0, 0)).unwrap().unwrap();
        assert_eq!((id.uid, id.gid, id.groups), (4242, 4242, vec![4242]));
        assert!(a.identity(None, None, (0, 0)).unwrap().is_none());
        let id = a.identity(None, Some("rt"), (7, 8)).unwrap().unwrap();
        assert_eq!((id.uid, id.gid), (7, 900));
    }

    #[test]
    fn unknown_names_say_where_they_were_looked_up() {
        let a = db();
        let e = a
            .identity(Some("ghost"), None, (0, 0))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "unknown user `ghost` (not in /p/etc/passwd)");
        let e = a
            .identity(Some("robot"), Some("ghosts"), (0, 0))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "unknown group `ghosts` (not in /p/etc/group)");
    }

    #[test]
    fn a_read_error_says_its_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/passwd")).unwrap();
        let e = Accounts::load(dir.path()).unwrap_err();
        assert!(
            e.to_string().ends_with("a directory, not a regular file"),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_none(), "{e}");
    }
}
