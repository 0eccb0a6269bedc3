//! Turning a decoded HTTP/2 or HTTP/3 field list into a request head, with the
//! message rules of RFC 9113 section 8 (which RFC 9114 section 4 repeats for HTTP/3) (pseudo-header fields, `:method` a token, lowercase names, no
//! connection-specific fields, `te: trailers` only, `:authority` and `host` checked
//! as HTTP/1.1 checks `Host`) and the `priority` field of RFC 9218. A violation makes
//! the request malformed: a PROTOCOL_ERROR stream error, as for every other rule of
//! section 8.1.1, so a malformed request never reaches the handler or picks a site.
//!
//! and into the handler's typed [`Request`] ([`to_request`]).
//!
//! Not here: what the request asks for (the handler decides), HPACK or QPACK.

use crate::handler::request::HeaderFields;
use crate::handler::{Method, Request};
use crate::http::host;

/// A stream's RFC 9218 priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Priority {
    /// 0 (most urgent) to 7.
    pub urgency: u8,
    pub incremental: bool,
}

impl Default for Priority {
    /// RFC 9218 section 4: urgency 3, not incremental.
    fn default() -> Priority {
        Priority { urgency: 3, incremental: false }
    }
}

impl Priority {
    /// Parses a `priority` field value (a Structured Fields dictionary, RFC 8941).
    /// Unknown keys, parameters and out-of-range values are ignored, as RFC 9218
    /// section 4 requires; so is anything unparsable. Absent members take their
    /// defaults (a PRIORITY_UPDATE restates the whole field).
    pub fn parse(value: &[u8]) -> Priority {
        let mut p = Priority::default();
        let Ok(text) = std::str::from_utf8(value) else { return p };
        for member in text.split(',') {
            // Parameters after ';' do not change the member's value.
            let member = member.split(';').next().unwrap_or("").trim();
            let (key, val) = match member.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (member, None),
            };
            match (key, val) {
                ("u", Some(v)) => {
                    if let Ok(u @ 0..=7) = v.parse::<u8>() {
                        p.urgency = u;
                    }
                }
                ("i", None | Some("?1")) => p.incremental = true,
                ("i", Some("?0")) => p.incremental = false,
                _ => {}
            }
        }
        p
    }
}

/// A request's head as the HTTP layer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    /// `https` or `http`; absent only for CONNECT.
    pub scheme: Option<String>,
    /// `:authority`, or else the `host` field.
    pub authority: Option<String>,
    /// The request target as sent (path and query); absent only for CONNECT.
    pub path: Option<String>,
    /// Regular fields in order, names lowercase.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The request's `content-length`, if it sent one.
    pub content_length: Option<u64>,
    /// RFC 9218 priority from the `priority` field (defaults when absent).
    pub priority: Priority,
    /// An extended CONNECT's `:protocol` (RFC 8441 section 4), in lowercase.
    pub protocol: Option<String>,
}

impl RequestHead {
    /// What the upstream gets of this request besides its typed form, received over
    /// `version` (as `Via` names it: `2`, `3`).
    pub fn upstreamed(
        &self,
        version: &'static str,
        body: crate::handler::pipeline::RequestBody,
    ) -> crate::handler::pipeline::Upstreamed {
        let fields = self.headers.iter().map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned())).collect();
        crate::handler::pipeline::Upstreamed { method: self.method.clone(), fields, version, body }
    }

    /// The first value of field `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }
}

/// Why a request is malformed (all are PROTOCOL_ERROR stream errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    UppercaseName,
    InvalidName,
    InvalidValue,
    UnknownPseudo,
    /// A `:method` that is not a token (RFC 9110 section 9.1), such as `GET/p/x?`:
    /// it would reach an upstream as an invalid request line.
    InvalidMethod,
    PseudoAfterRegular,
    DuplicatePseudo,
    MissingPseudo,
    EmptyPath,
    ConnectionSpecific,
    TeNotTrailers,
    ContentLength,
    /// Trailers may not carry pseudo-header fields.
    PseudoInTrailers,
    /// An empty or invalid `:authority` or `host`, a second `host`, or a `host` that
    /// names another host than `:authority` (RFC 9113 section 8.3.1): the checks
    /// HTTP/1.1 makes of `Host`, so neither protocol picks a site from an unchecked value.
    InvalidHost,
}

/// Field names RFC 9113 section 8.2.2 forbids.
pub(super) const CONNECTION_SPECIFIC: [&[u8]; 5] =
    [b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"];

/// Calls `f` with `name` in lowercase, as HTTP/2 sends field names (RFC 9113
/// section 8.2.1): as it is when it is, on the stack when short.
pub(super) fn with_lowercase<R>(name: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
    match name.len() {
        _ if !name.iter().any(u8::is_ascii_uppercase) => f(name),
        len @ ..=64 => {
            let mut short = [0u8; 64];
            short[..len].copy_from_slice(name);
            short[..len].make_ascii_lowercase();
            f(&short[..len])
        }
        _ => f(&name.to_ascii_lowercase()),
    }
}

fn check_name(name: &[u8]) -> Result<(), Malformed> {
    if name.is_empty() {
        return Err(Malformed::InvalidName);
    }
    for &b in name {
        if b.is_ascii_uppercase() {
            return Err(Malformed::UppercaseName);
        }
        if !tchar(b) {
            return Err(Malformed::InvalidName);
        }
    }
    Ok(())
}

/// A token character (RFC 9110 section 5.6.2).
fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// RFC 9113 section 8.2.1: no NUL, CR or LF, and no leading or trailing space or tab.
fn check_value(value: &[u8]) -> Result<(), Malformed> {
    let edge = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    if value.iter().any(|&b| b == 0 || b == b'\r' || b == b'\n') || edge(value.first()) || edge(value.last()) {
        return Err(Malformed::InvalidValue);
    }
    Ok(())
}

/// A pseudo-header value must be visible ASCII to become a `String`.
fn ascii(value: Vec<u8>) -> Result<String, Malformed> {
    if value.iter().all(|b| b.is_ascii_graphic()) {
        String::from_utf8(value).map_err(|_| Malformed::InvalidValue)
    } else {
        Err(Malformed::InvalidValue)
    }
}

fn set_once(slot: &mut Option<String>, value: Vec<u8>) -> Result<(), Malformed> {
    if slot.is_some() {
        return Err(Malformed::DuplicatePseudo);
    }
    *slot = Some(ascii(value)?);
    Ok(())
}

/// Checks a request's fields and builds its head.
pub fn parse(fields: Vec<(Vec<u8>, Vec<u8>)>) -> Result<RequestHead, Malformed> {
    let (mut method, mut scheme, mut authority, mut path) = (None, None, None, None);
    let mut protocol = None;
    let mut headers = Vec::with_capacity(fields.len());
    let mut content_length: Option<u64> = None;
    let mut priority = None;
    let mut host = None;
    for (name, value) in fields {
        if let Some(pseudo) = name.strip_prefix(b":") {
            if !headers.is_empty() {
                return Err(Malformed::PseudoAfterRegular);
            }
            let slot = match pseudo {
                b"method" => &mut method,
                b"scheme" => &mut scheme,
                b"authority" => &mut authority,
                b"path" => &mut path,
                b"protocol" => &mut protocol,
                _ => return Err(Malformed::UnknownPseudo),
            };
            set_once(slot, value)?;
            continue;
        }
        check_name(&name)?;
        check_value(&value)?;
        if CONNECTION_SPECIFIC.contains(&name.as_slice()) {
            return Err(Malformed::ConnectionSpecific);
        }
        match name.as_slice() {
            b"te" if value != b"trailers" => return Err(Malformed::TeNotTrailers),
            b"content-length" => {
                let n = std::str::from_utf8(&value)
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or(Malformed::ContentLength)?;
                if content_length.is_some_and(|old| old != n) {
                    return Err(Malformed::ContentLength);
                }
                content_length = Some(n);
            }
            b"priority" => priority = Some(Priority::parse(&value)),
            b"host" => {
                if host.is_some() || !host::valid(&value) {
                    return Err(Malformed::InvalidHost);
                }
                host = Some(ascii(value.clone())?);
            }
            _ => {}
        }
        // Only ASCII bytes reach here as names (checked as tchar above).
        let name = String::from_utf8(name).map_err(|_| Malformed::InvalidName)?;
        headers.push((name, value));
    }
    let method = method.ok_or(Malformed::MissingPseudo)?;
    if method.is_empty() || !method.bytes().all(tchar) {
        return Err(Malformed::InvalidMethod);
    }
    if let Some(authority) = &authority {
        let differs = host.as_ref().is_some_and(|h| !host::same(h.as_bytes(), authority.as_bytes()));
        if !host::valid(authority.as_bytes()) || differs {
            return Err(Malformed::InvalidHost);
        }
    }
    if protocol.is_some() {
        // RFC 8441 section 4: an extended CONNECT has :scheme, :path and :authority;
        // :protocol on any other method is malformed.
        if method != "CONNECT" || scheme.is_none() || authority.is_none() {
            return Err(Malformed::MissingPseudo);
        }
        match path.as_deref() {
            None => return Err(Malformed::MissingPseudo),
            Some("") => return Err(Malformed::EmptyPath),
            Some(_) => {}
        }
    } else if method == "CONNECT" {
        // RFC 9113 section 8.5: only :method and :authority.
        if scheme.is_some() || path.is_some() || authority.is_none() {
            return Err(Malformed::MissingPseudo);
        }
    } else {
        if scheme.is_none() {
            return Err(Malformed::MissingPseudo);
        }
        match path.as_deref() {
            None => return Err(Malformed::MissingPseudo),
            Some("") => return Err(Malformed::EmptyPath),
            Some(_) => {}
        }
    }
    Ok(RequestHead {
        method,
        scheme,
        authority: authority.or(host),
        path,
        headers,
        content_length,
        priority: priority.unwrap_or_default(),
        protocol: protocol.map(|p| p.to_ascii_lowercase()),
    })
}

/// Checks a trailer section: regular fields only, with the same field rules.
pub fn check_trailers(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<(), Malformed> {
    for (name, value) in fields {
        if name.starts_with(b":") {
            return Err(Malformed::PseudoInTrailers);
        }
        check_name(name)?;
        check_value(value)?;
        if CONNECTION_SPECIFIC.contains(&name.as_slice()) {
            return Err(Malformed::ConnectionSpecific);
        }
    }
    Ok(())
}
/// The handler's view of a request head: method, path and query split from
/// `:path`, `:authority`, the conditional and range fields (HTTP/3's too), and the
/// connection's peer address as the client's.
pub fn to_request(head: &RequestHead, client: std::net::IpAddr) -> Result<Request, &'static str> {
    let method = Method::from_token(&head.method);
    let target = head.path.as_deref().unwrap_or("");
    let without_fragment = target.split('#').next().unwrap_or("");
    let (path, query) = match without_fragment.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (without_fragment, None),
    };
    // `*` (OPTIONS) and CONNECT's missing path reach the handler, which refuses the method.
    if (method.is_served() || head.protocol.is_some()) && !path.starts_with('/') {
        return Err(":path is not an absolute path");
    }
    // The one protocol an extended CONNECT is tunnelled for (RFC 8441's own).
    if head.protocol.as_deref().is_some_and(|p| p != "websocket") {
        return Err(":protocol other than websocket");
    }
    let mut fields = HeaderFields::default();
    for (name, value) in &head.headers {
        // Conditional and range fields are ASCII; others are not looked at.
        if let Ok(v) = std::str::from_utf8(value) {
            fields.add(name, v);
        }
    }
    Ok(Request {
        method,
        path: path.to_string(),
        query,
        authority: head.authority.clone().filter(|a| !a.is_empty()),
        headers: fields.parse(),
        client: Some(client.to_canonical()),
        via: None,
        upgrade: head.protocol.clone(),
        notes: Default::default(),
    })
}
