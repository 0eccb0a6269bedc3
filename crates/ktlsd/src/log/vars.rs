//! The one set of nginx-style variables of the configuration (`$remote_addr`,
//! `${host}`, `$$` for a `$`): their names, the template syntax that uses them, and
//! their values, written from an [`AccessEntry`]. The access log's `custom` format
//! and the `[[proxy]]` header rules (`request_headers`, `response_headers`) parse
//! their text here and fill it in here; each says which variables have a value when
//! it is filled in ([`When`]).
//!
//! Also the per-request [`Notes`] that the handler writes and the log reads: the
//! request id, the basic-auth user and the upstream exchanges of a forward.
//! Not here: where lines go, the fixed formats (the parent module).

use std::cell::RefCell;
use std::fmt::Write;
use std::rc::Rc;
use std::time::Duration;

use super::{AccessEntry, Escaped, Quoted};

/// What one `$variable` stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    RemoteAddr,
    RemoteUser,
    TimeLocal,
    TimeIso8601,
    Request,
    RequestMethod,
    RequestUri,
    RequestId,
    ServerProtocol,
    Scheme,
    Status,
    BodyBytesSent,
    RequestTime,
    Ttfb,
    HttpReferer,
    HttpUserAgent,
    Host,
    Site,
    SslProtocol,
    SslCipher,
    RecordLayer,
    BodyPath,
    UpstreamAddr,
    UpstreamStatus,
    UpstreamConnectTime,
    UpstreamHeaderTime,
    UpstreamResponseTime,
    UpstreamCacheStatus,
}

/// When a variable has its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum When {
    /// Once the request is read (what a request field sent upstream may carry).
    Request,
    /// Once the upstream's answer is in (what a response field may carry).
    Upstream,
    /// Once the answer is sent (the access log).
    Logged,
}

/// The variables, with nginx's names where nginx has one.
const VARS: &[(&str, Var)] = &[
    ("remote_addr", Var::RemoteAddr),
    ("remote_user", Var::RemoteUser),
    ("time_local", Var::TimeLocal),
    ("time_iso8601", Var::TimeIso8601),
    ("request", Var::Request),
    ("request_method", Var::RequestMethod),
    ("request_uri", Var::RequestUri),
    ("request_id", Var::RequestId),
    ("server_protocol", Var::ServerProtocol),
    ("scheme", Var::Scheme),
    ("status", Var::Status),
    ("body_bytes_sent", Var::BodyBytesSent),
    ("request_time", Var::RequestTime),
    ("ttfb", Var::Ttfb),
    ("http_referer", Var::HttpReferer),
    ("http_user_agent", Var::HttpUserAgent),
    ("host", Var::Host),
    ("site", Var::Site),
    ("ssl_protocol", Var::SslProtocol),
    ("ssl_cipher", Var::SslCipher),
    ("record_layer", Var::RecordLayer),
    ("body_path", Var::BodyPath),
    ("upstream_addr", Var::UpstreamAddr),
    ("upstream_status", Var::UpstreamStatus),
    ("upstream_connect_time", Var::UpstreamConnectTime),
    ("upstream_header_time", Var::UpstreamHeaderTime),
    ("upstream_response_time", Var::UpstreamResponseTime),
    ("upstream_cache_status", Var::UpstreamCacheStatus),
];

impl Var {
    /// From when on the variable has a value.
    pub fn when(self) -> When {
        match self {
            Var::RemoteAddr
            | Var::RemoteUser
            | Var::TimeLocal
            | Var::TimeIso8601
            | Var::Request
            | Var::RequestMethod
            | Var::RequestUri
            | Var::RequestId
            | Var::ServerProtocol
            | Var::Scheme
            | Var::HttpReferer
            | Var::HttpUserAgent
            | Var::Host => When::Request,
            Var::UpstreamAddr | Var::UpstreamStatus | Var::UpstreamConnectTime | Var::UpstreamHeaderTime => {
                When::Upstream
            }
            Var::Status
            | Var::Site
            | Var::BodyBytesSent
            | Var::RequestTime
            | Var::Ttfb
            | Var::SslProtocol
            | Var::SslCipher
            | Var::RecordLayer
            | Var::BodyPath
            | Var::UpstreamResponseTime
            | Var::UpstreamCacheStatus => When::Logged,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Var(Var),
}

/// A parsed text with variables: a log line template or a field value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// An access-log line template (`access_log_custom`).
    pub fn parse(text: &str) -> Result<Template, String> {
        Template::parse_for("access_log_custom", text, When::Logged)
    }

    /// Parses `$name` and `${name}` variables; `$$` is a literal `$`. `key` names the
    /// setting in errors; a variable without a value at `when`, an unknown one or a
    /// line break is an error naming it.
    pub fn parse_for(key: &str, text: &str, when: When) -> Result<Template, String> {
        if text.contains(['\n', '\r', '\0']) {
            return Err(format!("{key} must be one line (no line breaks)"));
        }
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(i) = rest.find('$') {
            literal.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            if let Some(more) = after.strip_prefix('$') {
                literal.push('$');
                rest = more;
                continue;
            }
            let (name, next) = match after.strip_prefix('{') {
                Some(braced) => match braced.find('}') {
                    Some(end) => (&braced[..end], &braced[end + 1..]),
                    None => return Err(format!("{key}: unclosed ${{ in {text:?}")),
                },
                None => {
                    let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
                    (&after[..end], &after[end..])
                }
            };
            let known = || {
                let names: Vec<String> =
                    VARS.iter().filter(|(_, v)| v.when() <= when).map(|(n, _)| format!("${n}")).collect();
                names.join(" ")
            };
            let Some(&(_, var)) = VARS.iter().find(|(n, _)| *n == name) else {
                return Err(format!("{key}: unknown variable ${name} (known: {}; $$ for a literal $)", known()));
            };
            if var.when() > when {
                return Err(format!("{key}: ${name} has no value here (known here: {}; $$ for a literal $)", known()));
            }
            if !literal.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut literal)));
            }
            pieces.push(Piece::Var(var));
            rest = next;
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        Ok(Template { pieces })
    }

    /// Appends the line of `e` (with its newline); `rt` is the request time in seconds.
    pub fn write(&self, out: &mut Vec<u8>, e: &AccessEntry<'_>, rt: f64, layer: &str) {
        let mut line = String::with_capacity(128);
        self.fill(&mut line, e, rt, layer, true);
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }

    /// The text with the values of `e` as they are (a field value: nothing escaped;
    /// what a request may hold is already a valid field value). An absent value is empty.
    pub fn value(&self, e: &AccessEntry<'_>) -> String {
        let mut out = String::new();
        self.fill(&mut out, e, 0.0, e.layer.label(), false);
        out
    }

    fn fill(&self, out: &mut String, e: &AccessEntry<'_>, rt: f64, layer: &str, log: bool) {
        for piece in &self.pieces {
            let _ = match piece {
                Piece::Text(t) => out.write_str(t),
                Piece::Var(v) => write_var(out, *v, e, rt, layer, log),
            };
        }
    }
}

/// Writes `v`'s value; `log`: escaped for a log line, `-` when absent; else as it
/// is, nothing when absent.
fn write_var(out: &mut String, v: Var, e: &AccessEntry<'_>, rt: f64, layer: &str, log: bool) -> std::fmt::Result {
    let absent = if log { "-" } else { "" };
    let text = |out: &mut String, s: Option<&str>| match (s, log) {
        (Some(s), true) => write!(out, "{}", Escaped(s)),
        (Some(s), false) => out.write_str(s),
        (None, _) => out.write_str(absent),
    };
    let r = e.request;
    if v == Var::RequestId {
        // Made when first asked for: before the notes are borrowed below.
        return match e.notes {
            Some(n) => out.write_str(&n.request_id()),
            None => out.write_str(absent),
        };
    }
    let notes = e.notes.map(|n| n.0.borrow());
    let up = notes.as_ref().map(|n| &n.upstream).filter(|u| !u.is_empty());
    match v {
        Var::RemoteAddr => write!(out, "{}", e.peer.ip()),
        Var::RemoteUser => text(out, notes.as_ref().and_then(|n| n.remote_user.as_deref())),
        Var::TimeLocal => out.write_str(&super::clf_now()),
        Var::TimeIso8601 => out.write_str(&iso8601_now()),
        Var::Request if log => write!(out, "{}", Quoted(r)),
        Var::Request => match r {
            Some(r) => write!(out, "{} {} {}", r.method.as_str(), r.target, r.version),
            None => Ok(()),
        },
        Var::RequestMethod => text(out, r.map(|r| r.method.as_str())),
        Var::RequestUri => text(out, r.map(|r| r.target)),
        Var::RequestId => Ok(()),
        Var::ServerProtocol => text(out, r.map(|r| r.version)),
        Var::Scheme => out.write_str(if layer == "none" { "http" } else { "https" }),
        Var::Status => write!(out, "{}", e.status),
        Var::BodyBytesSent => write!(out, "{}", e.bytes),
        Var::RequestTime => write!(out, "{rt:.3}"),
        Var::Ttfb => write!(out, "{:.3}", e.ttfb.as_secs_f64()),
        Var::HttpReferer => text(out, e.referer),
        Var::HttpUserAgent => text(out, e.user_agent),
        Var::Host => text(out, e.host),
        Var::Site => text(out, Some(e.site)),
        Var::SslProtocol => out.write_str(e.tls.map_or(absent, |t| t.version)),
        Var::SslCipher => out.write_str(e.tls.map_or(absent, |t| t.cipher)),
        Var::RecordLayer => out.write_str(layer),
        Var::BodyPath => out.write_str(e.body.map_or(absent, crate::vocab::BodyPath::label)),
        Var::UpstreamAddr => each(out, up, absent, |out, a| out.write_str(&a.addr)),
        Var::UpstreamStatus => each(out, up, absent, |out, a| match a.status {
            Some(s) => write!(out, "{s}"),
            None => out.write_str("-"),
        }),
        Var::UpstreamConnectTime => each(out, up, absent, |out, a| seconds(out, a.connect)),
        Var::UpstreamHeaderTime => each(out, up, absent, |out, a| seconds(out, a.header)),
        Var::UpstreamResponseTime => each(out, up, absent, |out, a| seconds(out, a.response)),
        Var::UpstreamCacheStatus => out.write_str(notes.as_ref().and_then(|n| n.cache_status).unwrap_or(absent)),
    }
}

/// The attempts' values, as nginx lists them: `a, b` (`absent` without any).
fn each(
    out: &mut String,
    attempts: Option<&Vec<Attempt>>,
    absent: &str,
    one: impl Fn(&mut String, &Attempt) -> std::fmt::Result,
) -> std::fmt::Result {
    let Some(attempts) = attempts else { return out.write_str(absent) };
    for (i, a) in attempts.iter().enumerate() {
        if i > 0 {
            out.write_str(", ")?;
        }
        one(out, a)?;
    }
    Ok(())
}

/// Seconds with three decimals, as nginx writes its upstream times; `-` for none.
fn seconds(out: &mut String, d: Option<Duration>) -> std::fmt::Result {
    match d {
        Some(d) => write!(out, "{:.3}", d.as_secs_f64()),
        None => out.write_str("-"),
    }
}

/// One try of an upstream during a forward (nginx lists each in `$upstream_addr`...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attempt {
    /// The upstream's `HOST:PORT`.
    pub addr: String,
    /// The status of its answer; `None`: it gave none.
    pub status: Option<u16>,
    /// Time to open the connection (zero for a pooled one).
    pub connect: Option<Duration>,
    /// Time from the start of the attempt to its response head.
    pub header: Option<Duration>,
    /// Time from the start of the attempt to the end of its response.
    pub response: Option<Duration>,
}

/// What the handler notes of a request for its log line.
#[derive(Debug, Default)]
pub struct Noted {
    /// The request id (`$request_id`, `X-Request-Id`): the trusted proxy's, or made
    /// here when first asked for.
    pub request_id: Option<String>,
    /// The user name of a Basic `Authorization` field, as sent.
    pub remote_user: Option<String>,
    /// The upstreams tried, in order.
    pub upstream: Vec<Attempt>,
    /// The cache's verdict in nginx's words (`HIT`, `MISS`, `EXPIRED`...), for a
    /// rule that caches.
    pub cache_status: Option<&'static str>,
}

/// A request's [`Noted`], shared by the clones of the request (a forward that runs
/// on a task of its own writes what the codec's log line reads).
#[derive(Debug, Default, Clone)]
pub struct Notes(pub Rc<RefCell<Noted>>);

impl PartialEq for Notes {
    /// Requests compare by what they ask, not by what was noted of them.
    fn eq(&self, _: &Notes) -> bool {
        true
    }
}

impl Eq for Notes {}

impl Notes {
    /// The request id, made now when it has none yet.
    pub fn request_id(&self) -> String {
        self.0.borrow_mut().request_id.get_or_insert_with(new_request_id).clone()
    }

    /// Runs `f` on the notes.
    pub fn with<R>(&self, f: impl FnOnce(&mut Noted) -> R) -> R {
        f(&mut self.0.borrow_mut())
    }
}

/// A new request id: 16 random bytes in hex (32 characters), as nginx's `$request_id`.
/// The bytes come from the system's generator, drawn a batch at a time per thread.
pub fn new_request_id() -> String {
    const BATCH: usize = 64 * 16;
    thread_local! {
        static POOL: RefCell<(Vec<u8>, usize)> = const { RefCell::new((Vec::new(), 0)) };
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let (bytes, used) = &mut *p;
        if *used + 16 > bytes.len() {
            bytes.resize(BATCH, 0);
            if aws_lc_rs::rand::fill(bytes).is_err() {
                // Never expected; ids must still differ: a counter mixed with the clock.
                let seed = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                for (i, b) in bytes.iter_mut().enumerate() {
                    *b = (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(i as u64) >> (8 * (i % 8))) as u8;
                }
            }
            *used = 0;
        }
        let mut id = String::with_capacity(32);
        for b in &bytes[*used..*used + 16] {
            let _ = write!(id, "{b:02x}");
        }
        *used += 16;
        id
    })
}

/// Whether `id`, received in `X-Request-Id`, may be kept as the request's: 1 to 128
/// characters of letters, digits and `-_.:+/=` (a UUID, a hex or base64 id).
pub fn valid_request_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:+/=".contains(&b))
}

/// The user name of a Basic `Authorization` value, as nginx's `$remote_user`; `None`
/// for another scheme or a value that does not decode.
pub fn basic_user(authorization: &str) -> Option<String> {
    let (scheme, token) = authorization.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64_decode(token.trim())?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, _) = text.split_once(':')?;
    Some(user.to_string())
}

/// Standard base64 with padding, or `None`.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes() {
        acc = (acc << 6) | u32::from(value(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// nginx's `$upstream_cache_status` for an RFC 9211 `Cache-Status` of this cache.
pub fn nginx_cache_status(rfc: &str) -> &'static str {
    let has = |p: &str| rfc.split(';').any(|s| s.trim() == p || s.trim().starts_with(&format!("{p}=")));
    let detail = rfc.split(';').find_map(|s| s.trim().strip_prefix("detail="));
    match detail {
        Some("stale-if-error") => return "STALE",
        Some("stale-while-revalidate") => return "UPDATING",
        _ if has("hit") => return "HIT",
        _ => {}
    }
    let fwd = rfc.split(';').find_map(|s| s.trim().strip_prefix("fwd="));
    match fwd {
        Some("stale") if has("fwd-status") => "REVALIDATED",
        Some("stale") => "EXPIRED",
        Some("bypass" | "method" | "request") => "BYPASS",
        _ => "MISS",
    }
}

/// The current time as nginx's `$time_iso8601`, UTC: `2026-11-22T10:00:00+00:00`.
fn iso8601_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}+00:00", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Year, month, day of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
#[path = "vars_tests.rs"]
mod tests;
