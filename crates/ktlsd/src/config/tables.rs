//! The tables and values of the file as written that the options schema
//! (`options`) declares and a section module checks: `[[redirect]]`, `[[access]]`,
//! `rate_limit` (checked by `routing`), `client_auth` (by `tls`) and `[[proxy]]`
//! (by `proxy`). Plain data
//! with its serde form, so that the schema and the sections both depend on this
//! module and not on each other. Not here: any check of a value.

use std::path::PathBuf;

use serde::Deserialize;

/// A `[[redirect]]` block as written.
#[derive(Debug, Default, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileRedirect {
    pub path: String,
    pub to: String,
    pub status: Option<u16>,
}

/// An `[[access]]` block as written: its `path`, and its `allow` and `deny` lists in
/// the order the file writes them, which is the order they are checked in (as the
/// order of nginx's directives decides).
#[derive(Debug, Default, Clone)]
pub struct FileAccess {
    pub path: Option<String>,
    /// `(true, allow)` or `(false, deny)` lists, in the file's order.
    pub lists: Vec<(bool, Vec<String>)>,
}

impl<'de> Deserialize<'de> for FileAccess {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FileAccess, D::Error> {
        struct Block;
        impl<'de> serde::de::Visitor<'de> for Block {
            type Value = FileAccess;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a table with path, allow and deny")
            }

            // Keys arrive in the file's order (the TOML tables keep it).
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<FileAccess, A::Error> {
                let mut block = FileAccess::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "path" => block.path = Some(map.next_value()?),
                        "allow" | "deny" => block.lists.push((key == "allow", map.next_value()?)),
                        other => return Err(serde::de::Error::unknown_field(other, &["path", "allow", "deny"])),
                    }
                }
                Ok(block)
            }
        }
        d.deserialize_map(Block)
    }
}

impl serde::Serialize for FileAccess {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        if let Some(path) = &self.path {
            map.serialize_entry("path", path)?;
        }
        for (allow, list) in &self.lists {
            map.serialize_entry(if *allow { "allow" } else { "deny" }, list)?;
        }
        map.end()
    }
}

/// `rate_limit = { requests = 20, per = "1s", burst = 40 }` as written.
#[derive(Debug, Default, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileRateLimit {
    pub requests: u32,
    pub per: Option<String>,
    pub burst: Option<u32>,
}

/// Whether a site asks for client certificates (`client_auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ClientAuthMode {
    /// A certificate of `client_ca` is required: the handshake fails without one.
    Require,
    /// A certificate is asked for; one that is sent must be of `client_ca`.
    Optional,
    /// No certificate is asked for (a site's way out of the top level's policy).
    None,
}

/// A `[[proxy]]` block as written.
#[derive(Debug, Default, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileProxy {
    pub path: Option<String>,
    pub upstream: Option<Vec<String>>,
    pub cache: Option<bool>,
    pub host: Option<String>,
    pub upstream_ca: Option<PathBuf>,
    pub balance: Option<String>,
    pub connect_timeout: Option<toml::Value>,
    pub read_timeout: Option<toml::Value>,
    pub send_timeout: Option<toml::Value>,
    pub tunnel_idle_timeout: Option<toml::Value>,
    pub fail_timeout: Option<toml::Value>,
    pub keepalive: Option<usize>,
    pub strip_prefix: Option<String>,
    pub request_headers: Option<toml::Table>,
    pub response_headers: Option<toml::Table>,
    pub accel_root: Option<PathBuf>,
    pub cache_key: Option<String>,
    pub cache_bypass: Option<toml::Table>,
    pub cache_valid: Option<toml::Table>,
    pub cache_slice: Option<super::cache::Size>,
    pub health_check: Option<FileHealthCheck>,
}

/// A `[[proxy]]` block's `health_check = { ... }` as written.
#[derive(Debug, Default, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileHealthCheck {
    pub path: Option<String>,
    pub interval: Option<toml::Value>,
    pub timeout: Option<toml::Value>,
    pub fails: Option<u32>,
    pub passes: Option<u32>,
}
