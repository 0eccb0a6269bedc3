//! The `custom` access-log format: a line template with nginx-style variables
//! (`$remote_addr "$request" $status $body_bytes_sent $host`), parsed once when
//! the configuration is read and filled in for each request. Not the fixed
//! formats (see the parent module) or where lines go.

use std::fmt::Write;

use super::{AccessEntry, Escaped, Quoted};

/// What one `$variable` stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Var {
    RemoteAddr,
    TimeLocal,
    TimeIso8601,
    Request,
    RequestMethod,
    RequestUri,
    ServerProtocol,
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
}

/// The variables a template may use, with nginx's names where nginx has one.
const VARS: &[(&str, Var)] = &[
    ("remote_addr", Var::RemoteAddr),
    ("time_local", Var::TimeLocal),
    ("time_iso8601", Var::TimeIso8601),
    ("request", Var::Request),
    ("request_method", Var::RequestMethod),
    ("request_uri", Var::RequestUri),
    ("server_protocol", Var::ServerProtocol),
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
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Var(Var),
}

/// A parsed line template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses `$name` and `${name}` variables; `$$` is a literal `$`. An unknown
    /// variable is an error naming it and the known ones.
    pub fn parse(text: &str) -> Result<Template, String> {
        if text.contains(['\n', '\r']) {
            return Err("access_log_custom must be one line (no line breaks)".into());
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
                    None => return Err(format!("access_log_custom: unclosed ${{ in {text:?}")),
                },
                None => {
                    let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
                    (&after[..end], &after[end..])
                }
            };
            let Some(&(_, var)) = VARS.iter().find(|(n, _)| *n == name) else {
                let known: Vec<String> = VARS.iter().map(|(n, _)| format!("${n}")).collect();
                return Err(format!(
                    "access_log_custom: unknown variable ${name} (known: {}; $$ for a literal $)",
                    known.join(" ")
                ));
            };
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
        for piece in &self.pieces {
            let _ = match piece {
                Piece::Text(t) => line.write_str(t),
                Piece::Var(v) => write_var(&mut line, *v, e, rt, layer),
            };
        }
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
}

fn write_var(out: &mut String, v: Var, e: &AccessEntry<'_>, rt: f64, layer: &str) -> std::fmt::Result {
    let or_dash = |s: Option<&str>| Escaped(s.unwrap_or("-")).to_string();
    let r = e.request;
    match v {
        Var::RemoteAddr => write!(out, "{}", e.peer.ip()),
        Var::TimeLocal => out.write_str(&super::clf_now()),
        Var::TimeIso8601 => out.write_str(&iso8601_now()),
        Var::Request => write!(out, "{}", Quoted(r)),
        Var::RequestMethod => out.write_str(&or_dash(r.map(|r| r.method.as_str()))),
        Var::RequestUri => out.write_str(&or_dash(r.map(|r| r.target))),
        Var::ServerProtocol => out.write_str(&or_dash(r.map(|r| r.version))),
        Var::Status => write!(out, "{}", e.status),
        Var::BodyBytesSent => write!(out, "{}", e.bytes),
        Var::RequestTime => write!(out, "{rt:.3}"),
        Var::Ttfb => write!(out, "{:.3}", e.ttfb.as_secs_f64()),
        Var::HttpReferer => out.write_str(&or_dash(e.referer)),
        Var::HttpUserAgent => out.write_str(&or_dash(e.user_agent)),
        Var::Host => out.write_str(&or_dash(e.host)),
        Var::Site => out.write_str(&Escaped(e.site).to_string()),
        Var::SslProtocol => out.write_str(e.tls.map_or("-", |t| t.version)),
        Var::SslCipher => out.write_str(e.tls.map_or("-", |t| t.cipher)),
        Var::RecordLayer => out.write_str(layer),
        Var::BodyPath => out.write_str(e.body.map_or("-", crate::vocab::BodyPath::label)),
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
mod tests {
    use super::*;
    use crate::log::{RequestLine, TlsInfo};
    use crate::vocab::{BodyPath, Method, RecordLayer};
    use std::time::{Duration, Instant};

    #[test]
    fn templates() {
        let line = RequestLine { method: &Method::Get, target: "/a?b", version: "HTTP/2.0" };
        let e = AccessEntry {
            peer: "192.0.2.1:1234".parse().unwrap(),
            request: Some(line),
            status: 404,
            bytes: 90,
            started: Instant::now(),
            ttfb: Duration::from_millis(2),
            layer: RecordLayer::Kernel,
            body: Some(BodyPath::Sendfile),
            referer: None,
            user_agent: Some("curl/8 \"x\""),
            tls: Some(TlsInfo { version: "TLSv1_3", cipher: "TLS13_AES_128_GCM_SHA256" }),
            host: Some("b.test"),
            site: "b.test",
            client_subject: None,
        };
        // (template, line, or the error's words)
        let table: &[(&str, Result<&str, &str>)] = &[
            (
                "$remote_addr \"$request\" $status $body_bytes_sent $host",
                Ok("192.0.2.1 \"GET /a?b HTTP/2.0\" 404 90 b.test"),
            ),
            ("${site}:$request_method:${request_uri}x", Ok("b.test:GET:/a?bx")),
            ("$http_referer|$http_user_agent|$ssl_protocol", Ok("-|curl/8 \\\"x\\\"|TLSv1_3")),
            ("$$status $record_layer $request_time", Ok("$status ktls 0.250")),
            ("tls=$record_layer body=$body_path", Ok("tls=ktls body=sendfile")),
            ("plain text", Ok("plain text")),
            ("$nope", Err("unknown variable $nope")),
            ("${host", Err("unclosed")),
            ("a\nb", Err("one line")),
        ];
        for (text, want) in table {
            match (Template::parse(text), want) {
                (Ok(t), Ok(line)) => {
                    let mut out = Vec::new();
                    t.write(&mut out, &e, 0.25, "ktls");
                    assert_eq!(String::from_utf8(out).unwrap(), format!("{line}\n"), "{text:?}");
                }
                (Err(got), Err(words)) => assert!(got.contains(words), "{text:?}: {got}"),
                (got, _) => panic!("{text:?}: {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn iso8601_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_779), (2026, 11, 22));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let now = iso8601_now();
        assert_eq!((now.len(), &now[10..11], &now[19..]), (25, "T", "+00:00"), "{now}");
    }
}
