//! The privileges and state section: the account to serve as (`user`, `group`,
//! `allow_root`) and where the generated certificate is kept (`state_dir`,
//! `ephemeral_cert`).
//!
//! Names are checked for form only; resolving them and switching is `server::privileges`'.

use std::path::{Path, PathBuf};

use super::options::Options;
use super::{err, ConfigError};

/// The privileges and state section, validated.
pub struct Privileges {
    pub user: Option<String>,
    pub group: Option<String>,
    pub allow_root: bool,
    pub state_dir: Option<PathBuf>,
    pub ephemeral_cert: bool,
}

pub fn privileges(o: &Options) -> Result<Privileges, ConfigError> {
    let (user, group) = (o.user.clone(), o.group.clone());
    if group.is_some() && user.is_none() {
        return err("group was given without user (set --user too)");
    }
    for (key, name) in [("user", &user), ("group", &group)] {
        if name.as_deref().is_some_and(|n| n.is_empty() || n.contains('\0')) {
            return err(format!("{key} {name:?} is not a valid name"));
        }
    }
    Ok(Privileges {
        user,
        group,
        allow_root: o.allow_root.unwrap_or(false),
        state_dir: o.state_dir.clone().or_else(default_state_dir_here),
        ephemeral_cert: o.ephemeral_cert.unwrap_or(false),
    })
}

/// The default state directory: `/var/lib/ktlsd` for root when it exists or `/var/lib` is
/// there to create it in, else `$XDG_STATE_HOME/ktlsd` (when absolute, per the XDG base
/// directory spec), else `$HOME/.local/state/ktlsd`; `None` without any of them.
fn default_state_dir(
    is_root: bool,
    var_lib_usable: bool,
    xdg_state_home: Option<&str>,
    home: Option<&str>,
) -> Option<PathBuf> {
    if is_root && var_lib_usable {
        return Some(PathBuf::from("/var/lib/ktlsd"));
    }
    if let Some(x) = xdg_state_home.filter(|x| Path::new(x).is_absolute()) {
        return Some(Path::new(x).join("ktlsd"));
    }
    home.filter(|h| !h.is_empty()).map(|h| Path::new(h).join(".local/state/ktlsd"))
}

/// [`default_state_dir`] for this process.
fn default_state_dir_here() -> Option<PathBuf> {
    let is_root = crate::sys::effective_uid() == 0;
    let var_lib_usable = is_root && (Path::new("/var/lib/ktlsd").is_dir() || Path::new("/var/lib").is_dir());
    let xdg = std::env::var("XDG_STATE_HOME").ok();
    let home = std::env::var("HOME").ok();
    default_state_dir(is_root, var_lib_usable, xdg.as_deref(), home.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_state_dir_choice() {
        let p = |s: &str| Some(PathBuf::from(s));
        for (root, var_lib, xdg, home, want) in [
            (true, true, Some("/x"), Some("/root"), p("/var/lib/ktlsd")),
            (true, false, None, Some("/root"), p("/root/.local/state/ktlsd")),
            (false, true, Some("/run/u/state"), Some("/home/u"), p("/run/u/state/ktlsd")),
            (false, false, None, Some("/home/u"), p("/home/u/.local/state/ktlsd")),
            // XDG says a relative XDG_STATE_HOME is to be ignored.
            (false, false, Some("rel"), Some("/home/u"), p("/home/u/.local/state/ktlsd")),
            (false, false, Some(""), Some("/home/u"), p("/home/u/.local/state/ktlsd")),
            (false, false, None, Some(""), None),
            (false, false, None, None, None),
        ] {
            assert_eq!(default_state_dir(root, var_lib, xdg, home), want, "{root} {var_lib} {xdg:?} {home:?}");
        }
    }

    #[test]
    fn user_and_group() {
        let s = |v: &str| Some(v.to_string());
        for (user, group, want) in [
            (None, None, Ok(())),
            (s("www"), s("www"), Ok(())),
            (None, s("www"), Err("group was given without user")),
            (s(""), None, Err("user Some(\"\") is not a valid name")),
            (s("a"), s("b\0"), Err("group")),
        ] {
            let got = privileges(&Options { user: user.clone(), group: group.clone(), ..Default::default() });
            match (got, want) {
                (Ok(_), Ok(())) => {}
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{user:?} {group:?}: {e}"),
                (Ok(_), Err(w)) => panic!("{user:?} {group:?}: accepted, want {w:?}"),
                (Err(e), Ok(())) => panic!("{user:?} {group:?}: {e}"),
            }
        }
    }
}
