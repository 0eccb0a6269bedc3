//! Dropping root: the account named by `user`/`group` is resolved at start-up
//! (and by `ktlsd check`), and the process switches to it once the listeners
//! are bound and the certificate and key are read, as nginx's workers do.
//!
//! A process started as root refuses to serve as root unless `allow_root` is
//! set: files readable only by root under ROOT would otherwise be served.

use std::ffi::{CStr, CString};
use std::io;

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
}
