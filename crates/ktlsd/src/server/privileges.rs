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

/// The account to switch to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub user: String,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    /// Supplementary groups: the user's groups from the group database, and `gid`.
    pub groups: Vec<libc::gid_t>,
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
    // SAFETY: geteuid cannot fail and touches no memory.
    let euid = unsafe { libc::geteuid() };
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
        // SAFETY: getuid/getgid cannot fail and touch no memory.
        let (ruid, rgid) = unsafe { (libc::getuid(), libc::getgid()) };
        if (ruid, euid, rgid) == (uid, uid, gid) {
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
    let fail = |what: &str| anyhow!("cannot switch to user {:?}: {what}: {}", a.user, io::Error::last_os_error());
    // SAFETY: `groups` outlives the call and its length is what is passed.
    if unsafe { libc::setgroups(a.groups.len(), a.groups.as_ptr()) } != 0 {
        return Err(fail("setgroups"));
    }
    // SAFETY: plain system calls on integers.
    if unsafe { libc::setgid(a.gid) } != 0 {
        return Err(fail("setgid"));
    }
    // SAFETY: as above.
    if unsafe { libc::setuid(a.uid) } != 0 {
        return Err(fail("setuid"));
    }
    // SAFETY: as above; these only read the process's credentials.
    let (ruid, euid, rgid, egid) = unsafe { (libc::getuid(), libc::geteuid(), libc::getgid(), libc::getegid()) };
    // SAFETY: as above. With uid 0 dropped, setuid(0) must fail (EPERM).
    let regained = a.uid != 0 && unsafe { libc::setuid(0) } == 0;
    if regained || (ruid, euid, rgid, egid) != (a.uid, a.uid, a.gid, a.gid) {
        return Err(anyhow!(
            "switching to user {:?} did not hold (uid {ruid}/{euid}, gid {rgid}/{egid}{}); refusing to serve",
            a.user,
            if regained { ", root could be regained" } else { "" }
        ));
    }
    Ok(())
}

fn lookup_user(name: &str) -> anyhow::Result<(libc::uid_t, libc::gid_t)> {
    let c = CString::new(name).map_err(|_| anyhow!("user {name:?} is not a valid name"))?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // SAFETY: passwd is plain data; all-zero is a valid value that getpwnam_r overwrites.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; strings written go into `buf`, which we own.
        let rc = unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(anyhow!("cannot look up user {name:?}: {}", io::Error::from_raw_os_error(rc)));
        }
        if out.is_null() {
            return Err(anyhow!("user {name:?} does not exist (see `getent passwd`; create it or name another)"));
        }
        return Ok((pw.pw_uid, pw.pw_gid));
    }
}

fn lookup_group(name: &str) -> anyhow::Result<libc::gid_t> {
    let c = CString::new(name).map_err(|_| anyhow!("group {name:?} is not a valid name"))?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // SAFETY: group is plain data; all-zero is a valid value that getgrnam_r overwrites.
        let mut gr: libc::group = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; strings written go into `buf`, which we own.
        let rc = unsafe { libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(anyhow!("cannot look up group {name:?}: {}", io::Error::from_raw_os_error(rc)));
        }
        if out.is_null() {
            return Err(anyhow!("group {name:?} does not exist (see `getent group`; create it or name another)"));
        }
        return Ok(gr.gr_gid);
    }
}

/// The user's groups as `initgroups` would set them, `gid` included.
fn group_list(user: &str, gid: libc::gid_t) -> anyhow::Result<Vec<libc::gid_t>> {
    let c = CString::new(user).map_err(|_| anyhow!("user {user:?} is not a valid name"))?;
    let name: &CStr = &c;
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `groups` holds `n` entries; getgrouplist writes at most `n` and sets `n`.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            return Ok(groups);
        }
        // Too small: `n` is now the number needed.
        if (n as usize) <= groups.len() || n > 65_536 {
            return Err(anyhow!("cannot list the groups of user {user:?}"));
        }
        groups.resize(n as usize, 0);
    }
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
