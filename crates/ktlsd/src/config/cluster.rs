//! The `[cluster]` section: the store the members of a fleet share (`etcd`, the
//! endpoints of an etcd cluster), this member's `name`, the fleet's `secret_file`
//! (the same random bytes on every member), the store's key `prefix` and how often
//! the shared session-ticket key is replaced (`ticket_rotation`), and whether the
//! members share their response caches (`cache_peers`, over `peer_listen`). This module checks
//! the values; it reads no file and connects to nothing (`server::cluster` does).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{err, ConfigError};

/// The `[cluster]` table as written.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileCluster {
    pub etcd: Option<Vec<String>>,
    pub name: Option<String>,
    pub secret_file: Option<PathBuf>,
    pub prefix: Option<String>,
    pub ticket_rotation: Option<String>,
    pub cache_peers: Option<bool>,
    pub peer_listen: Option<String>,
}

/// The `[cluster]` section, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// etcd endpoints, `http://HOST:PORT`.
    pub etcd: Vec<String>,
    /// This member's name.
    pub name: String,
    pub secret_file: PathBuf,
    /// The prefix of every key the fleet keeps, `/` first and not last.
    pub prefix: String,
    pub ticket_rotation: Duration,
    /// Where this member answers the other members' cache fetches, when the members
    /// share their caches (`cache_peers = true`); `None`: each caches for itself.
    pub peer_listen: Option<std::net::SocketAddr>,
}

/// `prefix` when not given.
pub const DEFAULT_PREFIX: &str = "/ktlsd";
/// `ticket_rotation` when not given: Caddy's and Twitter's interval.
pub const DEFAULT_TICKET_ROTATION: Duration = Duration::from_secs(12 * 3600);
/// Longest member name.
const MAX_NAME: usize = 64;

/// The `[cluster]` table checked; `None` when there is none. `ticket_keys`: whether
/// key files are configured too (two sources of ticket keys are refused).
pub fn cluster(file: Option<&FileCluster>, ticket_keys: bool) -> Result<Option<Cluster>, ConfigError> {
    let Some(c) = file else { return Ok(None) };
    let etcd = c.etcd.clone().unwrap_or_default();
    if etcd.is_empty() {
        return err("[cluster] needs etcd, the endpoints of the fleet's etcd (e.g. etcd = [\"http://10.0.0.5:2379\"])");
    }
    for e in &etcd {
        let Some(rest) = e.strip_prefix("http://") else {
            return err(format!(
                "[cluster] etcd {e:?}: expected http://HOST:PORT (etcd over TLS is not supported: reach it over a \
                 private network or a local TLS proxy)"
            ));
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
            return err(format!("[cluster] etcd {e:?}: expected http://HOST:PORT"));
        }
    }
    let Some(secret_file) = c.secret_file.clone() else {
        return err(
            "[cluster] needs secret_file: the same 32 or more random bytes on every member (`openssl rand 32 > FILE`)",
        );
    };
    if ticket_keys {
        return err(
            "ticket_keys and [cluster] both give session-ticket keys: remove ticket_keys, the fleet shares its own",
        );
    }
    let name = match &c.name {
        Some(n) => n.clone(),
        None => host_name(),
    };
    if name.is_empty()
        || name.len() > MAX_NAME
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
    {
        return err(format!("[cluster] name {name:?}: expected 1 to {MAX_NAME} letters, digits, '-', '.' or '_'"));
    }
    let prefix = c.prefix.clone().unwrap_or_else(|| DEFAULT_PREFIX.to_string());
    let trimmed = prefix.trim_end_matches('/');
    if !prefix.starts_with('/') || trimmed.is_empty() || prefix.chars().any(char::is_control) {
        return err(format!("[cluster] prefix {prefix:?}: expected a path such as \"/ktlsd\""));
    }
    let ticket_rotation = match &c.ticket_rotation {
        None => DEFAULT_TICKET_ROTATION,
        Some(t) => match crate::handler::rules::parse_duration(t) {
            Ok(d) if d >= Duration::from_secs(1) && d <= Duration::from_secs(7 * 86_400) => d,
            _ => {
                return err(format!(
                    "[cluster] ticket_rotation {t:?}: expected a duration from 1s to 7d, such as \"12h\""
                ))
            }
        },
    };
    let peer_listen = match (c.cache_peers.unwrap_or(false), &c.peer_listen) {
        (false, None) => None,
        (false, Some(_)) => return err("[cluster] peer_listen is used only with cache_peers = true"),
        (true, None) => {
            return err(
                "[cluster] cache_peers needs peer_listen, the private address other members fetch from (e.g. peer_listen = \"10.0.0.5:8444\")",
            )
        }
        (true, Some(a)) => match a.parse::<std::net::SocketAddr>() {
            Ok(addr) if !addr.ip().is_unspecified() && addr.port() != 0 => Some(addr),
            _ => {
                return err(format!(
                    "[cluster] peer_listen {a:?}: expected the IP:PORT other members reach this one at (not 0.0.0.0, not port 0)"
                ))
            }
        },
    };
    Ok(Some(Cluster { etcd, name, secret_file, prefix: trimmed.to_string(), ticket_rotation, peer_listen }))
}

/// The machine's host name, the default member name.
fn host_name() -> String {
    rustix::system::uname().nodename().to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(etcd: &[&str], name: Option<&str>, prefix: Option<&str>, rotation: Option<&str>) -> FileCluster {
        FileCluster {
            etcd: Some(etcd.iter().map(|s| s.to_string()).collect()),
            name: name.map(str::to_string),
            secret_file: Some("/etc/ktlsd/cluster.key".into()),
            prefix: prefix.map(str::to_string),
            ticket_rotation: rotation.map(str::to_string),
            cache_peers: None,
            peer_listen: None,
        }
    }

    #[test]
    fn sections() {
        assert_eq!(cluster(None, false).unwrap(), None);
        let c = cluster(Some(&file(&["http://127.0.0.1:2379"], Some("edge-1"), None, None)), false).unwrap().unwrap();
        assert_eq!(
            (c.prefix.as_str(), c.ticket_rotation, c.name.as_str()),
            ("/ktlsd", DEFAULT_TICKET_ROTATION, "edge-1")
        );
        let c = cluster(Some(&file(&["http://a:1", "http://b:2/"], None, Some("/fleet/"), Some("2s"))), false)
            .unwrap()
            .unwrap();
        assert_eq!((c.prefix.as_str(), c.ticket_rotation), ("/fleet", Duration::from_secs(2)));
        assert!(!c.name.is_empty(), "the host name by default");
        assert_eq!(c.peer_listen, None);
        let peers = FileCluster {
            cache_peers: Some(true),
            peer_listen: Some("10.0.0.5:8444".into()),
            ..file(&["http://a:1"], None, None, None)
        };
        assert_eq!(cluster(Some(&peers), false).unwrap().unwrap().peer_listen, Some("10.0.0.5:8444".parse().unwrap()));
        for (f, ticket_keys, why) in [
            (file(&[], None, None, None), false, "needs etcd"),
            (file(&["https://a:2379"], None, None, None), false, "TLS is not supported"),
            (file(&["a:2379"], None, None, None), false, "expected http://"),
            (file(&["http://"], None, None, None), false, "expected http://"),
            (file(&["http://a:1/v3/x"], None, None, None), false, "expected http://"),
            (file(&["http://a:1"], Some("bad name"), None, None), false, "name"),
            (file(&["http://a:1"], Some(""), None, None), false, "name"),
            (file(&["http://a:1"], None, Some("ktlsd"), None), false, "prefix"),
            (file(&["http://a:1"], None, Some("/"), None), false, "prefix"),
            (file(&["http://a:1"], None, None, Some("0s")), false, "ticket_rotation"),
            (file(&["http://a:1"], None, None, Some("8d")), false, "ticket_rotation"),
            (file(&["http://a:1"], None, None, Some("soon")), false, "ticket_rotation"),
            (file(&["http://a:1"], None, None, None), true, "ticket_keys"),
            (FileCluster { secret_file: None, ..file(&["http://a:1"], None, None, None) }, false, "secret_file"),
            (
                FileCluster { cache_peers: Some(true), ..file(&["http://a:1"], None, None, None) },
                false,
                "needs peer_listen",
            ),
            (
                FileCluster { peer_listen: Some("10.0.0.1:8444".into()), ..file(&["http://a:1"], None, None, None) },
                false,
                "only with cache_peers",
            ),
            (
                FileCluster {
                    cache_peers: Some(true),
                    peer_listen: Some("0.0.0.0:8444".into()),
                    ..file(&["http://a:1"], None, None, None)
                },
                false,
                "peer_listen",
            ),
            (
                FileCluster {
                    cache_peers: Some(true),
                    peer_listen: Some("edge-1:8444".into()),
                    ..file(&["http://a:1"], None, None, None)
                },
                false,
                "peer_listen",
            ),
        ] {
            let e = cluster(Some(&f), ticket_keys).unwrap_err().to_string();
            assert!(e.contains(why), "{f:?}: {e}");
        }
    }
}
