//! The admin section: where the admin listener (metrics, status, advisor) listens,
//! whether it may be public (`admin`, `admin_public`), and who may act through it
//! (`admin_auth`: an htpasswd file, read and checked here).
//!
//! The listener itself is `server::admin`'s.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::handler::htpasswd::Users;

use super::options::Options;
use super::{err, ConfigError};

/// Where the admin listener (metrics, status, advisor) listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminAddr::Tcp(a) => write!(f, "{a}"),
            AdminAddr::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

impl AdminAddr {
    /// `IP:PORT`, or a Unix socket path (anything with a `/`).
    pub fn parse(v: &str) -> Result<AdminAddr, ConfigError> {
        if v.contains('/') {
            return Ok(AdminAddr::Unix(PathBuf::from(v)));
        }
        v.parse().map(AdminAddr::Tcp).map_err(|_| {
            ConfigError::new(format!(
                "admin {v:?} is neither IP:PORT (e.g. 127.0.0.1:9443) nor a Unix socket path (with a `/`, e.g. /run/ktlsd/admin.sock)"
            ))
        })
    }
}

/// The users of `admin_auth`, read when the configuration is.
#[derive(Clone)]
pub struct AdminAuth {
    /// The htpasswd file they came from.
    pub file: PathBuf,
    pub users: Arc<Users>,
}

impl std::fmt::Debug for AdminAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AdminAuth({})", self.file.display())
    }
}

impl PartialEq for AdminAuth {
    fn eq(&self, other: &AdminAuth) -> bool {
        self.file == other.file && self.users == other.users
    }
}

impl Eq for AdminAuth {}

/// `admin_auth`: the htpasswd file read and its hashes checked (bcrypt or argon2 only).
pub fn admin_auth(o: &Options) -> Result<Option<AdminAuth>, ConfigError> {
    let Some(file) = &o.admin_auth else { return Ok(None) };
    let users = Users::load(file).map_err(|m| ConfigError::new(format!("admin_auth: {m}")))?;
    Ok(Some(AdminAuth { file: file.clone(), users: Arc::new(users) }))
}

/// The admin listener: off, a loopback address (any with `admin_public`) that no other
/// listener has, or a Unix socket.
pub fn admin(o: &Options, listen: &[SocketAddr], http_listen: &[SocketAddr]) -> Result<Option<AdminAddr>, ConfigError> {
    let admin = match o.admin.as_deref() {
        None | Some("off") => None,
        Some(v) => Some(AdminAddr::parse(v)?),
    };
    match &admin {
        Some(AdminAddr::Tcp(a)) if !a.ip().is_loopback() && !o.admin_public.unwrap_or(false) => err(format!(
            "admin address {a} is not a loopback address: metrics and status would be public; use 127.0.0.1:PORT, [::1]:PORT or a Unix socket, or set admin_public = true"
        )),
        Some(AdminAddr::Tcp(a)) if listen.contains(a) || http_listen.contains(a) => {
            err(format!("admin address {a} is also a listen or http_listen address; give it its own port"))
        }
        _ => Ok(admin),
    }
}
