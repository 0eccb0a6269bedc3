//! What a `[[proxy]]` rule changes of a forwarded exchange, as pure functions: the
//! path prefix taken off before the request goes upstream (`strip_prefix`), the
//! field rules of the request and of the answer (`request_headers`,
//! `response_headers`: `set`, `add`, `remove`, values with the configuration's one
//! set of variables, `crate::log::vars`), the request id, and the file an
//! `X-Accel-Redirect` names beneath the rule's `accel_root`.
//!
//! No I/O: the fields are written by `super::headers`, the file is opened by
//! `crate::files` (with `RESOLVE_BENEATH`) when the codec sends the answer.

use std::sync::Arc;

pub use crate::handler::accel::Accel;

pub use crate::handler::accel::AccelRoot;
use crate::log::vars::{Template, When};
use crate::log::AccessEntry;

/// The rules of one direction: field names to set (replacing any of that name), to
/// add (beside them) and to remove, in that order of effect: remove, set, add.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldRules {
    pub set: Vec<(String, Template)>,
    pub add: Vec<(String, Template)>,
    pub remove: Vec<String>,
}

/// A direction's rules with their values filled in for one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expanded {
    /// Names whose fields (the client's or the upstream's, and this hop's own) go.
    pub dropped: Vec<String>,
    /// The fields that take their place, then those added: `(name, value)`.
    pub fields: Vec<(String, String)>,
}

impl Expanded {
    /// Whether fields named `name` are dropped.
    pub fn drops(&self, name: &str) -> bool {
        self.dropped.iter().any(|n| n.eq_ignore_ascii_case(name))
    }

    /// The value set for `name`, if the rules set it.
    pub fn value_of(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Fields no rule may touch: the framing and the connection's own, which this hop
/// writes for each side.
const UNTOUCHABLE: &[&str] =
    &["content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade"];

impl FieldRules {
    /// The rules of a `request_headers` or `response_headers` table (`key` names it
    /// in errors): `set` and `add` tables of name to value, `remove` a list of names.
    /// Request values may use the variables a request has; response values those of
    /// the upstream's answer too.
    pub fn parse(key: &str, table: &toml::Table) -> Result<FieldRules, String> {
        let when = if key == "request_headers" { When::Request } else { When::Upstream };
        let mut rules = FieldRules::default();
        for (part, value) in table {
            match (part.as_str(), value) {
                ("set" | "add", toml::Value::Table(fields)) => {
                    for (name, v) in fields {
                        check_name(key, name)?;
                        let toml::Value::String(text) = v else {
                            return Err(format!("{key}.{part}.{name}: expected a string value"));
                        };
                        let template = Template::parse_for(&format!("{key}.{part}.{name}"), text, when)?;
                        let list = if part == "set" { &mut rules.set } else { &mut rules.add };
                        list.push((name.clone(), template));
                    }
                }
                ("remove", toml::Value::Array(names)) => {
                    for n in names {
                        let toml::Value::String(name) = n else {
                            return Err(format!("{key}.remove: expected a list of field names"));
                        };
                        check_name(key, name)?;
                        rules.remove.push(name.clone());
                    }
                }
                ("set" | "add", _) => return Err(format!("{key}.{part}: expected a table such as {{ X-A = \"v\" }}")),
                ("remove", _) => return Err(format!("{key}.remove: expected a list such as [\"X-Powered-By\"]")),
                (other, _) => return Err(format!("{key}: unknown key {other:?}; expected set, add or remove")),
            }
        }
        Ok(rules)
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }

    /// The rules with the values of `e`'s variables.
    pub fn expand(&self, e: &AccessEntry<'_>) -> Expanded {
        let mut dropped: Vec<String> = self.remove.clone();
        dropped.extend(self.set.iter().map(|(n, _)| n.clone()));
        let fields = self.set.iter().chain(&self.add).map(|(n, t)| (n.clone(), t.value(e))).collect();
        Expanded { dropped, fields }
    }
}

/// A field name a rule may name: a token, not one of the framing's.
fn check_name(key: &str, name: &str) -> Result<(), String> {
    let token = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Err(format!("{key}: {name:?} is not a field name"));
    }
    if UNTOUCHABLE.iter().any(|u| u.eq_ignore_ascii_case(name))
        || name.get(..6).is_some_and(|p| p.eq_ignore_ascii_case("proxy-"))
    {
        return Err(format!("{key}: {name} is the connection's own (framing and hop-by-hop fields are set by ktlsd)"));
    }
    Ok(())
}

/// A `strip_prefix` value: `/` then segments, without a trailing slash.
pub fn check_prefix(prefix: &str) -> Result<String, String> {
    let p = prefix.trim_end_matches('/');
    let ok = p.starts_with('/')
        && !p.contains("//")
        && p.split('/').skip(1).all(|s| !s.is_empty() && s != "." && s != ".." && !s.contains(['?', '#', '%', '*']));
    match ok {
        true => Ok(p.to_string()),
        false => {
            Err(format!("strip_prefix {prefix:?}: expected a path such as \"/api\" (no glob, query or dot segment)"))
        }
    }
}

/// `target` (path and query, as it goes upstream) without `prefix` (from
/// [`check_prefix`]) when its path starts with it at a segment boundary: `/api/x` ->
/// `/x`, `/api` -> `/`, `/api?q` -> `/?q`; `/apix` and others unchanged (nginx's
/// `proxy_pass http://b/;` under `location /api/`, Caddy's `handle_path`).
pub fn strip_prefix(target: &str, prefix: &str) -> String {
    let Some(rest) = target.strip_prefix(prefix) else { return target.to_string() };
    match rest.as_bytes().first() {
        None => "/".to_string(),
        Some(b'/') => rest.to_string(),
        Some(b'?') => format!("/{rest}"),
        Some(_) => target.to_string(),
    }
}

/// What the variables of a forwarded request's fields are filled in from, owned by
/// the forward (which may outlive the codec's borrow of the request).
#[derive(Debug, Clone)]
pub struct Scope {
    pub peer: std::net::SocketAddr,
    pub method: crate::vocab::Method,
    /// The target as the client sent it.
    pub target: String,
    /// `HTTP/1.1`, `HTTP/2.0`, `HTTP/3.0`.
    pub version: &'static str,
    pub host: Option<String>,
    pub referer: Option<String>,
    pub user_agent: Option<String>,
    pub notes: crate::log::Notes,
}

impl Scope {
    /// The request as the variables see it (no answer yet).
    pub fn entry(&self) -> AccessEntry<'_> {
        let line = crate::log::RequestLine { method: &self.method, target: &self.target, version: self.version };
        AccessEntry {
            peer: self.peer,
            request: Some(line),
            status: 0,
            bytes: 0,
            started: std::time::Instant::now(),
            ttfb: std::time::Duration::ZERO,
            layer: crate::vocab::RecordLayer::Kernel,
            body: None,
            referer: self.referer.as_deref(),
            user_agent: self.user_agent.as_deref(),
            tls: None,
            client_subject: None,
            host: self.host.as_deref(),
            site: "",
            notes: Some(&self.notes),
        }
    }
}

/// The rule's `response_headers` for one forwarded answer, filled in when the
/// upstream's head is in (its `$upstream_*` then have values).
#[derive(Debug, Clone)]
pub struct Reply {
    pub rule: Arc<super::Rule>,
    pub scope: Scope,
}

impl Reply {
    /// Puts the rule's response fields on `headers`: removed, set, added.
    pub fn apply(&self, headers: &mut Vec<crate::handler::Header>) {
        let x = self.rule.control.response.expand(&self.scope.entry());
        headers.retain(|h| !x.drops(h.name()));
        for (name, value) in x.fields {
            headers.push(crate::handler::Header::Field(name.into(), value));
        }
    }
}

/// The answer an upstream's `X-Accel-Redirect` asks for under `rule`'s
/// `accel_root`, taking the field out of `head` (it never reaches the client,
/// `accel_root` or not): the static answer of that file to `req`, with the
/// upstream fields that describe a download (`Content-Type`, `Content-Disposition`,
/// `Cache-Control`, `Expires`, `Set-Cookie`), as nginx keeps them. `None` when the
/// answer has no such field or the rule no `accel_root`.
pub fn accel(rule: &super::Rule, head: &mut super::parse::Head, req: &crate::handler::Request) -> Option<Accel> {
    let at = head.fields.iter().position(|(n, _)| n.eq_ignore_ascii_case("x-accel-redirect"))?;
    let (_, value) = head.fields.remove(at);
    let Some(root) = &rule.control.accel_root else {
        tracing::debug!("X-Accel-Redirect {value:?} dropped: the rule has no accel_root");
        return None;
    };
    const KEPT: [&str; 5] = ["content-type", "content-disposition", "cache-control", "expires", "set-cookie"];
    let fields = head
        .fields
        .iter()
        .filter(|(n, _)| KEPT.iter().any(|k| n.eq_ignore_ascii_case(k)))
        .map(|(n, v)| crate::handler::Header::Field(n.clone(), v.clone()))
        .collect();
    let mut file = req.clone();
    file.query = None;
    let path = crate::handler::accel::accel_path(&value);
    if let Ok(p) = &path {
        file.path.clone_from(p);
    }
    Some(Accel { req: file, path, value, root: root.clone(), fields })
}

/// The HTTP version of a request line for `Via`'s protocol name (`1.1`, `2`, `3`).
pub fn protocol_of(via: &str) -> &'static str {
    match via {
        "1.0" => "HTTP/1.0",
        "2" => "HTTP/2.0",
        "3" => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

/// When a request skips the cache's lookup (`cache_bypass`): one of these cookies,
/// fields or query parameters is present with a value other than empty or `0` (as
/// nginx's `proxy_cache_bypass $cookie_x $http_y $arg_z`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bypass {
    pub cookies: Vec<String>,
    pub headers: Vec<String>,
    pub query: Vec<String>,
}

impl Bypass {
    /// The `cache_bypass` table: `cookie`, `header` and `query`, each a list of names.
    pub fn parse(table: &toml::Table) -> Result<Bypass, String> {
        let mut b = Bypass::default();
        for (key, value) in table {
            let list = match key.as_str() {
                "cookie" => &mut b.cookies,
                "header" => &mut b.headers,
                "query" => &mut b.query,
                other => return Err(format!("cache_bypass: unknown key {other:?}; expected cookie, header or query")),
            };
            let names = value.as_array().filter(|a| a.iter().all(|v| v.as_str().is_some_and(|s| !s.is_empty())));
            let Some(names) = names else {
                return Err(format!("cache_bypass.{key}: expected a list of names such as [\"session\"]"));
            };
            list.extend(names.iter().filter_map(|v| v.as_str()).map(str::to_string));
        }
        Ok(b)
    }

    pub fn is_empty(&self) -> bool {
        self.cookies.is_empty() && self.headers.is_empty() && self.query.is_empty()
    }

    /// Whether a request with these `fields` and `query` (as sent) bypasses the lookup.
    pub fn applies(&self, fields: &[(String, String)], query: Option<&str>) -> bool {
        let set = |v: &str| !v.is_empty() && v != "0";
        let header = |name: &str| fields.iter().any(|(n, v)| n.eq_ignore_ascii_case(name) && set(v.trim()));
        if self.headers.iter().any(|h| header(h)) {
            return true;
        }
        let cookie = |name: &str| {
            let values =
                fields.iter().filter(|(n, _)| n.eq_ignore_ascii_case("cookie")).flat_map(|(_, v)| v.split(';'));
            values.filter_map(|pair| pair.split_once('=')).any(|(n, v)| n.trim() == name && set(v.trim()))
        };
        if self.cookies.iter().any(|c| cookie(c)) {
            return true;
        }
        let arg = |name: &str| {
            let mut pairs = query.unwrap_or_default().split('&');
            pairs.any(|pair| match pair.split_once('=') {
                Some((n, v)) => n == name && set(v),
                None => false,
            })
        };
        self.query.iter().any(|q| arg(q))
    }
}

/// How long a response whose origin states no freshness stays fresh, by status
/// (`cache_valid`: nginx's `proxy_cache_valid`); `None` for `any`.
pub type Valid = Vec<(Option<u16>, std::time::Duration)>;

/// The lifetime `valid` gives `status`: its own, else `any`'s.
pub fn valid_for(valid: &Valid, status: u16) -> Option<std::time::Duration> {
    let exact = valid.iter().find(|(s, _)| *s == Some(status));
    exact.or_else(|| valid.iter().find(|(s, _)| s.is_none())).map(|(_, d)| *d)
}

/// A rule's control of its exchanges, as validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Control {
    /// Taken off the path before it goes upstream.
    pub strip_prefix: Option<String>,
    pub request: FieldRules,
    pub response: FieldRules,
    /// Where `X-Accel-Redirect` files are served from; `None`: the field is dropped
    /// and the upstream's answer passes.
    pub accel_root: Option<Arc<AccelRoot>>,
    /// The cache key (`cache_key`); `None`: the default (site and target).
    pub cache_key: Option<Template>,
    /// When a request skips the lookup (`cache_bypass`).
    pub cache_bypass: Bypass,
    /// Lifetimes for responses without explicit freshness (`cache_valid`).
    pub cache_valid: Valid,
    /// The size of the slices objects are fetched and stored in (`cache_slice`);
    /// `None`: whole objects.
    pub cache_slice: Option<u64>,
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
