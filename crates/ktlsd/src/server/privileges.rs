//! Dropping root: the account named by `user`/`group` is resolved at start-up
//! (and by `ktlsd check`), and the process switches to it once the listeners
//! are bound and the certificate and key are read, as nginx's workers do.
//!
//! A process started as root refuses to serve as root unless `allow_root` is
//! set: files readable only by root under ROOT would otherwise be served.

use std::ffi::{CStr, CString};
use std::io;
use std::path::{Path, PathBuf};

use anyhow::anyhow;

use crate::config::Config;
use crate::sys::{self, gid_t, uid_t};

/// The account to switch to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub user: String,
    pub uid: uid_t,
    pub gid: gid_t,
    /// Supplementary groups: the user's groups from the group database, and `gid`.
    pub groups: Vec<gid_t>,
}

/// What start-up does about privileges.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Switch to this account after binding.
    Drop(Account),
    /// Stay as is: not root, or root with `allow_root` (`warn` says to log it).
    Stay { warn: bool },
}

/// Resolves `user`/`group` and decides; errors are one line saying what to do.
pub fn plan(config: &Config) -> anyhow::Result<Plan> {
    let ids = sys::ids();
    let euid = ids.euid;
    let Some(user) = &config.user else {
        if euid == 0 && !config.allow_root {
            return Err(anyhow!(
                "refusing to serve as root: name an unprivileged account with --user (e.g. --user www-data), \
                 or pass --allow-root to serve as root anyway"
            ));
        }
        return Ok(Plan::Stay { warn: euid == 0 });
    };
    let (uid, primary) = lookup_user(user)?;
    let gid = match &config.group {
        Some(g) => lookup_group(g)?,
        None => primary,
    };
    if euid != 0 {
        if (ids.ruid, euid, ids.rgid) == (uid, uid, gid) {
            return Ok(Plan::Stay { warn: false });
        }
        return Err(anyhow!(
            "cannot switch to user {user:?}: only root can change user (start ktlsd as root, or without --user)"
        ));
    }
    let groups = group_list(user, gid)?;
    Ok(Plan::Drop(Account { user: user.clone(), uid, gid, groups }))
}

/// Switches the whole process (every thread: glibc applies set*id to all of
/// them) to `a`, then checks that root cannot be regained.
pub fn drop_to(a: &Account) -> anyhow::Result<()> {
    let fail = |what: &str, e: io::Error| anyhow!("cannot switch to user {:?}: {what}: {e}", a.user);
    sys::set_groups(&a.groups).map_err(|e| fail("setgroups", e))?;
    sys::set_gid(a.gid).map_err(|e| fail("setgid", e))?;
    sys::set_uid(a.uid).map_err(|e| fail("setuid", e))?;
    let sys::Ids { ruid, euid, rgid, egid } = sys::ids();
    // With uid 0 dropped, setuid(0) must fail (EPERM).
    let regained = a.uid != 0 && sys::set_uid(0).is_ok();
    if regained || (ruid, euid, rgid, egid) != (a.uid, a.uid, a.gid, a.gid) {
        return Err(anyhow!(
            "switching to user {:?} did not hold (uid {ruid}/{euid}, gid {rgid}/{egid}{}); refusing to serve",
            a.user,
            if regained { ", root could be regained" } else { "" }
        ));
    }
    Ok(())
}

/// Hands the state directory (what start-up wrote there as root: the generated
/// certificate and key) to the account the server switches to, as systemd's
/// `StateDirectory=` does, so that a reload after the switch can read it and ACME
/// can write beside it. Symbolic links are changed themselves, never followed.
pub fn hand_over_state_dir(dir: &std::path::Path, a: &Account) -> anyhow::Result<()> {
    fn walk(p: &std::path::Path, a: &Account) -> io::Result<()> {
        std::os::unix::fs::lchown(p, Some(a.uid), Some(a.gid))?;
        if std::fs::symlink_metadata(p)?.is_dir() {
            for entry in std::fs::read_dir(p)? {
                walk(&entry?.path(), a)?;
            }
        }
        Ok(())
    }
    if !dir.exists() {
        return Ok(());
    }
    walk(dir, a).map_err(|e| {
        anyhow!(
            "cannot hand the state directory {} to user {:?}: {e} (chown it to that user, or name another --state-dir)",
            dir.display(),
            a.user
        )
    })
}

/// `ktlsd check --user NAME`: every file a reload reads after the switch (the
/// configuration file, certificates and keys, session-ticket keys, ROOT and the
/// sites' roots) must be readable by that account, judged by permission bits as
/// the kernel would (each directory on the way searchable, the file readable).
/// One error lists each file that is not.
pub fn check_readable(config: &Config, config_file: Option<&Path>, a: &Account) -> anyhow::Result<()> {
    let mut files: Vec<&Path> = config_file.into_iter().collect();
    files.extend(config.cert.as_deref());
    files.extend(config.key.as_deref());
    files.extend(config.ticket_keys.iter().map(PathBuf::as_path));
    let mut dirs: Vec<&Path> = vec![&config.root];
    for site in &config.sites {
        dirs.push(&site.root);
        if let crate::config::SiteCert::Files { cert, key } = &site.cert {
            files.extend([cert.as_path(), key.as_path()]);
        }
    }
    let wanted = files.into_iter().map(|f| (f, READ)).chain(dirs.into_iter().map(|d| (d, READ | SEARCH)));
    let refused: Vec<String> = wanted.filter_map(|(p, bits)| refusal(p, bits, a)).collect();
    if refused.is_empty() {
        return Ok(());
    }
    Err(anyhow!(
        "user {:?} (--user) cannot read what a reload reads after the switch: {} (make each readable by that user or its group)",
        a.user,
        refused.join("; ")
    ))
}

const READ: u32 = 4;
const WRITE: u32 = 2;
const SEARCH: u32 = 1;

/// `ktlsd check` with a `[cache]`: start-up opens the cache directory after the
/// switch to the serving account and creates it when missing, so it must be a
/// directory that account may read and write, or be creatable by it (its nearest
/// existing ancestor a directory it may write in). Nothing is created here.
pub fn check_cache_dir(dir: &Path, plan: &Plan) -> anyhow::Result<()> {
    let here = Path::new(".");
    let existing =
        dir.ancestors().map(|p| if p.as_os_str().is_empty() { here } else { p }).find(|p| p.symlink_metadata().is_ok());
    let existing = existing.unwrap_or(here);
    let itself = existing == dir;
    let is_dir = std::fs::metadata(existing).is_ok_and(|m| m.is_dir());
    let what = match (itself, is_dir) {
        (true, false) => return Err(anyhow!("[cache] dir {} is not a directory (name a directory)", dir.display())),
        (false, false) => {
            return Err(anyhow!(
                "[cache] dir {} cannot be created: {} is not a directory (name another dir)",
                dir.display(),
                existing.display()
            ))
        }
        (true, true) => "is not writable",
        (false, true) => "cannot be created",
    };
    let path = CString::new(existing.as_os_str().as_encoded_bytes()).map_err(|_| anyhow!("[cache] dir has a NUL"))?;
    // As this process (a read-only file system refuses even root), then as the account.
    let refused = match (sys::can_write_dir(&path), plan) {
        (Err(e), _) => Some((String::new(), format!("{}: {e}", existing.display()))),
        (Ok(()), Plan::Drop(a)) => {
            let bits = if itself { READ | WRITE | SEARCH } else { WRITE | SEARCH };
            refusal(existing, bits, a).map(|why| (format!(" by user {:?} (--user)", a.user), why))
        }
        (Ok(()), Plan::Stay { .. }) => None,
    };
    match refused {
        None => Ok(()),
        Some((by, why)) => Err(anyhow!(
            "[cache] dir {} {what}{by}: {why} (make it writable by the serving user, or name another dir)",
            dir.display()
        )),
    }
}

/// Why `a` may not access `path` with `bits` (or a directory on the way to it
/// with search), or `None` when it may.
fn refusal(path: &Path, bits: u32, a: &Account) -> Option<String> {
    let full = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    for dir in full.ancestors().skip(1) {
        if let Err(why) = permits(dir, SEARCH, a) {
            return Some(format!("{} ({}: {why})", path.display(), dir.display()));
        }
    }
    permits(&full, bits, a).err().map(|why| format!("{} ({why})", path.display()))
}

/// Whether the permission bits of `path` give `a` every one of `bits` (rwx as 4, 2, 1).
fn permits(path: &Path, bits: u32, a: &Account) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|e| e.to_string())?;
    let mode = m.mode();
    let class = if a.uid == 0 {
        return Ok(());
    } else if m.uid() == a.uid {
        (mode >> 6) & 7
    } else if m.gid() == a.gid || a.groups.contains(&m.gid()) {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    match class & bits == bits {
        true => Ok(()),
        false => Err(format!("mode {:04o}, owner uid {} gid {}", mode & 0o7777, m.uid(), m.gid())),
    }
}

fn lookup_user(name: &str) -> anyhow::Result<(uid_t, gid_t)> {
    lookup("user", "passwd", name, sys::user_ids)
}

fn lookup_group(name: &str) -> anyhow::Result<gid_t> {
    lookup("group", "group", name, sys::group_id)
}

/// Looks up the `what` (user or group) called `name` in the `database` that
/// `getent` names, with `find`.
fn lookup<T>(what: &str, database: &str, name: &str, find: fn(&CStr) -> io::Result<Option<T>>) -> anyhow::Result<T> {
    let c = CString::new(name).map_err(|_| anyhow!("{what} {name:?} is not a valid name"))?;
    match find(&c) {
        Ok(Some(found)) => Ok(found),
        Ok(None) => Err(anyhow!("{what} {name:?} does not exist (see `getent {database}`; create it or name another)")),
        Err(e) => Err(anyhow!("cannot look up {what} {name:?}: {e}")),
    }
}

/// The user's groups as `initgroups` would set them, `gid` included.
fn group_list(user: &str, gid: gid_t) -> anyhow::Result<Vec<gid_t>> {
    let c = CString::new(user).map_err(|_| anyhow!("user {user:?} is not a valid name"))?;
    sys::group_list(&c, gid).ok_or_else(|| anyhow!("cannot list the groups of user {user:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        assert_eq!(lookup_user("root").unwrap(), (0, 0));
        assert_eq!(lookup_group("root").unwrap(), 0);
        let e = lookup_user("no-such-user-ktlsd").unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        let e = lookup_group("no-such-group-ktlsd").unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        assert!(group_list("root", 0).unwrap().contains(&0));
    }

    #[test]
    fn permission_bits_table() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, "x").unwrap();
        let me = sys::ids();
        let (uid, gid) = (me.euid, me.egid);
        let other =
            Account { user: "other".into(), uid: uid.wrapping_add(4242), gid: gid.wrapping_add(4242), groups: vec![] };
        let in_group = Account { groups: vec![gid], ..other.clone() };
        let owner = Account { user: "owner".into(), uid, gid, groups: vec![gid] };
        // (mode, account, readable)
        let table = [
            (0o600, &owner, true),
            (0o600, &in_group, false),
            (0o640, &in_group, true),
            (0o640, &other, false),
            (0o644, &other, true),
            (0o044, &owner, uid == 0),
        ];
        for (mode, a, readable) in table {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(permits(&f, READ, a).is_ok(), readable, "{mode:o} for {a:?}");
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let why = refusal(&f, READ, &other).expect("the directory is not searchable");
        assert!(why.contains("mode 0700"), "{why}");
    }
}
