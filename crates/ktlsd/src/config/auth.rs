//! The basic-auth section: `[[auth]]` blocks (top level and per `[[site]]`) into
//! the handler's [`crate::handler::auth::Rule`]s, each htpasswd file read and
//! checked here, so that a refused hash stops start-up naming its line.
//!
//! How requests are checked is [`crate::handler::auth`]'s; this module only validates.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

use crate::handler::auth::Rule;
use crate::handler::htpasswd::Users;

/// The realm when a block names none.
const DEFAULT_REALM: &str = "Restricted";

/// An `[[auth]]` block as written.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuth {
    /// The paths asked for credentials: `/private/*` (the directory and everything beneath) or one exact path.
    pub path: String,
    /// An htpasswd file (relative paths are relative to the config file).
    pub users: PathBuf,
    /// The realm browsers show [default: Restricted].
    pub realm: Option<String>,
}

/// Validates a site's `[[auth]]` blocks, in order. A file named by several blocks is
/// read once.
pub fn auth(blocks: &[FileAuth]) -> Result<Vec<Rule>, String> {
    let mut read: Vec<(PathBuf, Arc<Users>)> = Vec::new();
    let mut rules = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let which = format!("auth {}: ", i + 1);
        let path = crate::handler::pattern::PathPattern::new(&b.path).map_err(|m| format!("{which}{m}"))?;
        let realm = b.realm.clone().unwrap_or_else(|| DEFAULT_REALM.to_string());
        // Sent in a quoted-string: visible ASCII and spaces, no quote or backslash.
        if realm.is_empty() || !realm.chars().all(|c| (c == ' ' || c.is_ascii_graphic()) && c != '"' && c != '\\') {
            return Err(format!("{which}realm {realm:?}: expected ASCII text without quotes or backslashes"));
        }
        let users = match read.iter().find(|(p, _)| *p == b.users) {
            Some((_, u)) => u.clone(),
            None => {
                let u = Arc::new(Users::load(&b.users).map_err(|m| format!("{which}{m}"))?);
                read.push((b.users.clone(), u.clone()));
                u
            }
        };
        rules.push(Rule { path, realm, users });
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks() {
        let dir = std::env::temp_dir().join(format!("ktlsd-auth-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let good = dir.join("good");
        std::fs::write(&good, "alice:$2y$04$xv3tiIRfQ2/K60COWsW03eSiLkHaf8h7g8msiH5r7gkzEJBAdn73e\n").expect("write");
        let md5 = dir.join("md5");
        std::fs::write(&md5, "# old\nbob:$apr1$x$y\n").expect("write");
        let block = |path: &str, users: &PathBuf, realm: Option<&str>| FileAuth {
            path: path.into(),
            users: users.clone(),
            realm: realm.map(String::from),
        };
        let missing = dir.join("missing");
        for (blocks, want) in [
            (vec![block("/private/*", &good, None)], Ok(())),
            (vec![block("/a/*", &good, Some("Staff")), block("/b", &good, None)], Ok(())),
            (vec![block("/private/*", &md5, None)], Err("auth 1: htpasswd file ")),
            (vec![block("/a/*", &good, None), block("/b/*", &md5, None)], Err("line 2 (user bob): an MD5-crypt")),
            (vec![block("/a b", &good, None)], Err("auth 1: path \"/a b\": expected a path or glob")),
            (vec![block("/a/*", &good, Some("say \"hi\""))], Err("auth 1: realm")),
            (vec![block("/a/*", &good, Some(""))], Err("auth 1: realm")),
            (vec![block("/a/*", &good, Some("café"))], Err("expected ASCII text")),
            (vec![block("/a/*", &good, Some("a\r\nX: y"))], Err("expected ASCII text")),
            (vec![block("/a/*", &missing, None)], Err("cannot read the htpasswd file")),
        ] {
            match (auth(&blocks), want) {
                (Ok(a), Ok(())) => assert_eq!(a.len(), blocks.len()),
                (Err(e), Err(w)) => assert!(e.contains(w), "{e} lacks {w}"),
                (got, want) => panic!("{blocks:?}: got {got:?}, want {want:?}"),
            }
        }
        assert!(matches!(auth(&[]), Ok(v) if v.is_empty()));
        let a = auth(&[block("/a/*", &good, None), block("/b/*", &good, None)]).expect("ok");
        assert!(Arc::ptr_eq(&a[0].users, &a[1].users), "a file is read once");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
