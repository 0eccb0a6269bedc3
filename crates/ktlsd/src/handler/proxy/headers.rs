//! The header rules of a proxied exchange, as pure functions: the upstream request
//! head built from the client's (hop-by-hop fields removed, RFC 9110 section 7.6.1;
//! `X-Forwarded-For`/`-Proto`/`-Host`, `Forwarded` of RFC 7239 and `Via` of RFC 9110
//! section 7.6.3 added; Host as the rule says), and the client's response fields built
//! from the upstream's.
//!
//! No I/O here, and no framing decisions beyond the request's own body length: the
//! upstream response's framing is `parse`'s, the client's the codec's.

use super::control::Expanded;
use crate::handler::response::FieldName;
use std::net::IpAddr;

/// The name by which this server appears in `Via` and `Cache-Status`.
pub const PSEUDONYM: &str = "ktlsd";

/// Fields never forwarded in either direction (RFC 9110 section 7.6.1 and RFC 9112
/// section 9.6; `Proxy-*` fields are the hop's own), besides those `Connection` names.
fn is_hop_by_hop(name: &str) -> bool {
    const HOP: [&str; 7] =
        ["connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "http2-settings"];
    HOP.iter().any(|h| name.eq_ignore_ascii_case(h)) || name.get(..6).is_some_and(|p| p.eq_ignore_ascii_case("proxy-"))
}

/// The field names the `Connection` fields of `fields` list (as sent: compare them
/// ignoring case). Most heads list only `keep-alive` or `close`, no field: empty.
fn connection_options<'f>(fields: impl Iterator<Item = (&'f str, &'f str)>) -> Vec<&'f str> {
    fields
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

/// Whether `name` is hop-by-hop or one of the `named` Connection options.
fn dropped(name: &str, named: &[&str]) -> bool {
    is_hop_by_hop(name) || named.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// Which of the fields a proxy rewrites `name` is (any case).
fn which<'n>(name: &str, of: &[&'n str]) -> Option<&'n str> {
    of.iter().find(|n| n.eq_ignore_ascii_case(name)).copied()
}

/// What the upstream request says about its client and its body.
#[derive(Debug, Clone)]
pub struct Forwarding {
    pub method: String,
    /// The origin-form target: path and query as the client sent them.
    pub target: String,
    /// The client's Host or `:authority`.
    pub authority: Option<String>,
    pub peer: IpAddr,
    /// The client's protocol version as `Via` names it: `1.0`, `1.1` or `2`.
    pub version: &'static str,
    /// The request body's length; `None`: none at all; `Some(None)`: of unknown length
    /// (sent chunked).
    pub body: Option<Option<u64>>,
    /// A tunnel's request: the protocol the upstream is asked to switch to.
    pub upgrade: Option<Upgrade>,
    /// The request id the upstream gets in `X-Request-Id`.
    pub request_id: String,
    /// The path prefix taken off `target` in the request line (`strip_prefix`).
    pub strip: Option<String>,
    /// The rule's `request_headers`, filled in for this request.
    pub control: Expanded,
    /// Where the exchange notes its upstreams for the access log.
    pub notes: crate::log::Notes,
    /// The rule's `cache_key`, filled in; `None`: the target keys the entry.
    pub cache_key: Option<String>,
}

/// What an upstream request asks to switch to (RFC 9110 section 7.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgrade {
    /// The `Upgrade` value: `websocket`.
    pub protocol: String,
    /// The `Sec-WebSocket-Key` this hop made, when it translates an HTTP/2 extended
    /// CONNECT (RFC 8441) into an HTTP/1.1 upgrade; `None` when the client's own goes.
    pub key: Option<String>,
}

/// The upstream request head: request line (the rule's prefix taken off) and the
/// fields of [`request_fields`], as HTTP/1.1 writes them.
pub fn request_head(fwd: &Forwarding, fields: &[(String, String)], host: &str) -> Vec<u8> {
    let mut out = String::with_capacity(512);
    out.push_str(&fwd.method);
    out.push(' ');
    out.push_str(&request_target(fwd));
    out.push_str(" HTTP/1.1\r\n");
    request_fields(fwd, fields, host, &mut |name, value| {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    });
    out.push_str("\r\n");
    out.into_bytes()
}

/// The upstream request's origin-form target: the client's, the rule's prefix taken off.
pub fn request_target(fwd: &Forwarding) -> std::borrow::Cow<'_, str> {
    match &fwd.strip {
        Some(prefix) => super::control::strip_prefix(&fwd.target, prefix).into(),
        None => fwd.target.as_str().into(),
    }
}

/// The upstream request's fields, in order, each given to `emit` as (name, value):
/// Host first (`host` is its value unless the rule sets one), the client's
/// end-to-end fields, the forwarding fields, `X-Request-Id`, the rule's fields, a
/// tunnel's `Connection`/`Upgrade` and the body's framing. A client's `X-Real-IP`
/// and `X-Request-Id` never pass: the rule may set the first, the second is the
/// request's id. A field the rule sets or removes goes, this hop's own included.
/// One list for the HTTP/1.1 head and the HTTP/2 request, which drops the framing.
pub fn request_fields(fwd: &Forwarding, fields: &[(String, String)], host: &str, emit: &mut dyn FnMut(&str, &str)) {
    let named = connection_options(fields.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    let rules = &fwd.control;
    // Always one Host: the rule's when it sets one.
    emit("Host", rules.value_of("host").unwrap_or(host));
    // The client's fields and this hop's, each unless the rule removes it.
    {
        let mut line = |name: &str, value: &str| {
            if !rules.drops(name) {
                emit(name, value);
            }
        };
        let (mut xff, mut forwarded, mut via) = (Vec::new(), Vec::new(), Vec::new());
        const REWRITTEN: [&str; 9] = [
            "x-forwarded-for",
            "forwarded",
            "via",
            "host",
            "x-forwarded-proto",
            "x-forwarded-host",
            "content-length",
            "x-real-ip",
            "x-request-id",
        ];
        for (name, value) in fields {
            match which(name, &REWRITTEN) {
                Some("x-forwarded-for") => xff.push(value.as_str()),
                Some("forwarded") => forwarded.push(value.as_str()),
                Some("via") => via.push(value.as_str()),
                // Replaced by this hop's own; the body's framing is set below.
                Some(_) => {}
                None if dropped(name, &named) => {}
                None => line(name, value),
            }
        }
        // Each list: the values received, then this hop's, in one value.
        let mut value = String::with_capacity(128);
        let mut list = |line: &mut dyn FnMut(&str, &str), name: &str, values: &[&str], own: &dyn Fn(&mut String)| {
            value.clear();
            for v in values {
                value.push_str(v);
                value.push_str(", ");
            }
            own(&mut value);
            line(name, &value);
        };
        list(&mut line, "X-Forwarded-For", &xff, &|out| {
            use std::fmt::Write;
            let _ = write!(out, "{}", fwd.peer);
        });
        line("X-Forwarded-Proto", "https");
        if let Some(a) = &fwd.authority {
            line("X-Forwarded-Host", a);
        }
        list(&mut line, "Forwarded", &forwarded, &|out| {
            out.push_str("for=");
            out.push_str(&forwarded_node(fwd.peer));
            if let Some(a) = &fwd.authority {
                out.push_str(";host=");
                out.push_str(&quoted_if_needed(a));
            }
            out.push_str(";proto=https");
        });
        list(&mut line, "Via", &via, &|out| {
            out.push_str(fwd.version);
            out.push(' ');
            out.push_str(PSEUDONYM);
        });
        line("X-Request-Id", &fwd.request_id);
    }
    for (name, value) in &rules.fields {
        if !name.eq_ignore_ascii_case("host") {
            emit(name, value);
        }
    }
    let mut line = |name: &str, value: &str| {
        if !rules.drops(name) {
            emit(name, value);
        }
    };
    if let Some(u) = &fwd.upgrade {
        line("Connection", "upgrade");
        line("Upgrade", &u.protocol);
        if let Some(key) = &u.key {
            line("Sec-WebSocket-Key", key);
            if !fields.iter().any(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-version")) {
                line("Sec-WebSocket-Version", "13");
            }
        }
    }
    match fwd.body {
        Some(Some(n)) => line("Content-Length", itoa::Buffer::new().format(n)),
        Some(None) => line("Transfer-Encoding", "chunked"),
        // A method whose semantics expect a body says it is empty (RFC 9110 section 8.6).
        None if matches!(fwd.method.as_str(), "POST" | "PUT" | "PATCH") => line("Content-Length", "0"),
        None => {}
    }
}

/// A `Forwarded` node (RFC 7239 section 6): an IPv6 address is bracketed and quoted.
fn forwarded_node(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

/// A `Forwarded` parameter value: a token as it is, anything else quoted.
fn quoted_if_needed(v: &str) -> String {
    let token = !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if token {
        v.to_string()
    } else {
        format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

/// The fields the client gets from the upstream's: hop-by-hop fields, those its
/// `Connection` names, the framing (`Content-Length`, which the codec writes from the
/// body's length) and `Server`/`Date` (the codec writes its own) removed; `Via` with
/// this hop appended (`version` is the upstream's: `1.0` or `1.1`) and the RFC 9211
/// `Cache-Status` given as `cache_status`. The upstream's list is reused: the fields
/// kept are moved, not copied.
pub fn response_fields(
    mut upstream: Vec<(FieldName, String)>,
    version: &'static str,
    cache_status: &str,
) -> Vec<(FieldName, String)> {
    let mut via = String::new();
    let keep: Vec<bool> = {
        let named = connection_options(upstream.iter().map(|(n, v)| (n.as_ref(), v.as_str())));
        upstream
            .iter()
            .map(|(name, value)| {
                match which(name, &["via", "content-length", "server", "date", "cache-status", "x-accel-redirect"]) {
                    Some("via") => {
                        via.push_str(value);
                        via.push_str(", ");
                        false
                    }
                    Some(_) => false,
                    None => !dropped(name, &named),
                }
            })
            .collect()
    };
    let mut keep = keep.into_iter();
    upstream.retain(|_| keep.next().unwrap_or(false));
    via.push_str(version);
    via.push(' ');
    via.push_str(PSEUDONYM);
    upstream.push(("Via".into(), via));
    upstream.push(("Cache-Status".into(), cache_status.to_string()));
    upstream
}

/// The fields of an upstream's 103 (Early Hints) as the client gets them: the
/// upstream's hints (`Link` above all) without the hop-by-hop fields, those its
/// `Connection` names, and what only a final response may carry of this hop's
/// (length, Server, Date, `X-Accel-Redirect`).
pub fn interim_fields(mut upstream: Vec<(FieldName, String)>) -> Vec<(FieldName, String)> {
    let keep: Vec<bool> = {
        let named = connection_options(upstream.iter().map(|(n, v)| (n.as_ref(), v.as_str())));
        upstream
            .iter()
            .map(|(name, _)| {
                which(name, &["content-length", "server", "date", "x-accel-redirect"]).is_none()
                    && !dropped(name, &named)
            })
            .collect()
    };
    let mut keep = keep.into_iter();
    upstream.retain(|_| keep.next().unwrap_or(false));
    upstream
}

/// Via on an answer from the cache, the value the miss that stored it had: the
/// stored `Via` fields (the upstream's), then this hop. An entry does not keep the
/// upstream's HTTP version: this hop is named `1.1`, the version every upstream
/// speaks but an HTTP/1.0 one.
pub fn hit_via(stored: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let mut via = String::new();
    for v in stored {
        via.push_str(v.as_ref());
        via.push_str(", ");
    }
    via.push_str("1.1 ");
    via.push_str(PSEUDONYM);
    via
}

/// The request's regular fields from an HTTP/1.x head as received (`raw`: request line,
/// fields, blank line); empty when it cannot be read again (it was parsed once already).
pub fn fields_of_head(raw: &[u8]) -> Vec<(String, String)> {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(raw) {
        Ok(httparse::Status::Complete(_)) => req
            .headers
            .iter()
            .map(|h| {
                let value = match std::str::from_utf8(h.value) {
                    Ok(v) => v.trim().to_string(),
                    Err(_) => String::from_utf8_lossy(h.value).trim().to_string(),
                };
                (h.name.to_string(), value)
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    fn response_pairs(list: &[(&str, &str)]) -> Vec<(FieldName, String)> {
        list.iter().map(|(n, v)| (crate::handler::response::field_name(n), v.to_string())).collect()
    }

    fn fwd(method: &'static str, body: Option<Option<u64>>) -> Forwarding {
        Forwarding {
            method: method.into(),
            target: "/api/x?q=1".into(),
            authority: Some("www.example:8443".into()),
            peer: "192.0.2.7".parse().unwrap(),
            version: "1.1",
            body,
            upgrade: None,
            request_id: "rid".into(),
            strip: None,
            control: Expanded::default(),
            notes: Default::default(),
            cache_key: None,
        }
    }

    #[test]
    fn upstream_request_heads() {
        let client = pairs(&[
            ("Host", "www.example:8443"),
            ("User-Agent", "curl/8"),
            ("Connection", "keep-alive, X-Secret"),
            ("X-Secret", "hop"),
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Trailer", "X-T"),
            ("Upgrade", "websocket"),
            ("Proxy-Authorization", "Basic x"),
            ("Proxy-Connection", "keep-alive"),
            ("X-Forwarded-For", "198.51.100.1"),
            ("X-Forwarded-Proto", "http"),
            ("X-Forwarded-Host", "evil"),
            ("Forwarded", "for=198.51.100.1"),
            ("Via", "1.1 edge"),
            ("Content-Length", "999"),
            ("X-Real-IP", "6.6.6.6"),
            ("x-request-id", "client-chosen"),
            ("Accept", "*/*"),
        ]);
        let head = String::from_utf8(request_head(&fwd("GET", None), &client, "www.example:8443")).unwrap();
        let want = "GET /api/x?q=1 HTTP/1.1\r\n\
            Host: www.example:8443\r\n\
            User-Agent: curl/8\r\n\
            Accept: */*\r\n\
            X-Forwarded-For: 198.51.100.1, 192.0.2.7\r\n\
            X-Forwarded-Proto: https\r\n\
            X-Forwarded-Host: www.example:8443\r\n\
            Forwarded: for=198.51.100.1, for=192.0.2.7;host=\"www.example:8443\";proto=https\r\n\
            Via: 1.1 edge, 1.1 ktlsd\r\n\
            X-Request-Id: rid\r\n\r\n";
        assert_eq!(head, want);

        // A tunnel's handshake: this hop's Connection and Upgrade (the client's are
        // hop-by-hop), its key and version when it translates an extended CONNECT.
        let ws = pairs(&[("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Key", "a2V5")]);
        let asked = Upgrade { protocol: "websocket".into(), key: None };
        let h1 = Forwarding { upgrade: Some(asked), ..fwd("GET", None) };
        let head = String::from_utf8(request_head(&h1, &ws, "up")).unwrap();
        assert!(head.contains("\r\nSec-WebSocket-Key: a2V5\r\n"), "{head}");
        assert!(
            head.ends_with("ktlsd\r\nX-Request-Id: rid\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"),
            "{head}"
        );
        assert_eq!((head.matches("\r\nUpgrade:").count(), head.matches("\r\nConnection:").count()), (1, 1), "{head}");
        let translated = Upgrade { protocol: "websocket".into(), key: Some("bXkga2V5".into()) };
        let h2 = Forwarding { upgrade: Some(translated), version: "2", ..fwd("GET", None) };
        let head = String::from_utf8(request_head(&h2, &pairs(&[("sec-websocket-protocol", "chat")]), "up")).unwrap();
        let tail = "Connection: upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: bXkga2V5\r\nSec-WebSocket-Version: 13\r\n\r\n";
        assert!(head.starts_with("GET /api/x?q=1 HTTP/1.1\r\n") && head.ends_with(tail), "{head}");
        assert!(head.contains("\r\nsec-websocket-protocol: chat\r\n"), "{head}");

        for (method, body, framing) in [
            ("POST", Some(Some(5)), Some("Content-Length: 5")),
            ("PUT", Some(None), Some("Transfer-Encoding: chunked")),
            ("POST", None, Some("Content-Length: 0")),
            ("DELETE", None, None),
        ] {
            let head = String::from_utf8(request_head(&fwd(method, body), &[], "up:9000")).unwrap();
            assert!(head.starts_with(&format!("{method} /api/x?q=1 HTTP/1.1\r\nHost: up:9000\r\n")), "{head}");
            assert!(head.contains("X-Forwarded-For: 192.0.2.7\r\n"), "{head}");
            match framing {
                Some(f) => assert!(head.ends_with(&format!("{f}\r\n\r\n")), "{method}: {head}"),
                None => assert!(!head.contains("Content-Length") && !head.contains("Transfer-Encoding"), "{head}"),
            }
        }
        let v6 = Forwarding { peer: "2001:db8::1".parse().unwrap(), authority: None, version: "2", ..fwd("GET", None) };
        let head = String::from_utf8(request_head(&v6, &[], "up")).unwrap();
        assert!(head.contains("Forwarded: for=\"[2001:db8::1]\";proto=https\r\n"), "{head}");
        assert!(head.contains("Via: 2 ktlsd\r\n") && !head.contains("X-Forwarded-Host"), "{head}");
        assert_eq!(quoted_if_needed("a\"b"), "\"a\\\"b\"");
    }

    #[test]
    fn rules_and_prefixes_shape_the_upstream_head() {
        let client = pairs(&[
            ("Host", "www.example"),
            ("Cookie", "s=1"),
            ("X-Real-IP", "6.6.6.6"),
            ("X-Keep", "1"),
            ("X-Add", "client"),
        ]);
        let control = Expanded {
            dropped: ["Cookie", "X-Forwarded-Host", "host", "X-Real-IP"].map(str::to_string).to_vec(),
            fields: [("Host", "internal"), ("X-Real-IP", "192.0.2.7"), ("X-Add", "rule")]
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .to_vec(),
        };
        let f = Forwarding { strip: Some("/api".into()), control, ..fwd("GET", None) };
        let head = String::from_utf8(request_head(&f, &client, "www.example")).unwrap();
        let want = "GET /x?q=1 HTTP/1.1\r\n\
            Host: internal\r\n\
            X-Keep: 1\r\n\
            X-Add: client\r\n\
            X-Forwarded-For: 192.0.2.7\r\n\
            X-Forwarded-Proto: https\r\n\
            Forwarded: for=192.0.2.7;host=\"www.example:8443\";proto=https\r\n\
            Via: 1.1 ktlsd\r\n\
            X-Request-Id: rid\r\n\
            X-Real-IP: 192.0.2.7\r\n\
            X-Add: rule\r\n\r\n";
        assert_eq!(head, want);
        // A rule may replace the request id's field too.
        let control =
            Expanded { dropped: vec!["X-Request-Id".into()], fields: vec![("X-Request-Id".into(), "mine".into())] };
        let head = String::from_utf8(request_head(&Forwarding { control, ..fwd("GET", None) }, &[], "h")).unwrap();
        assert_eq!(head.matches("X-Request-Id").count(), 1, "{head}");
        assert!(head.contains("X-Request-Id: mine\r\n"), "{head}");
    }

    #[test]
    fn client_response_fields() {
        let upstream = response_pairs(&[
            ("Content-Type", "text/plain"),
            ("Content-Length", "5"),
            ("Connection", "close, X-Hop"),
            ("X-Hop", "1"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("Server", "gunicorn"),
            ("Date", "Mon, 01 Jan 2024 00:00:00 GMT"),
            ("Set-Cookie", "a=1"),
            ("Set-Cookie", "b=2"),
            ("Via", "1.0 app"),
            ("Proxy-Authenticate", "Basic"),
            ("Cache-Status", "app; hit"),
            ("X-Accel-Redirect", "/internal/a.bin"),
        ]);
        let got = response_fields(upstream, "1.1", "ktlsd; fwd=uri-miss");
        assert_eq!(
            got,
            response_pairs(&[
                ("Content-Type", "text/plain"),
                ("Set-Cookie", "a=1"),
                ("Set-Cookie", "b=2"),
                ("Via", "1.0 app, 1.1 ktlsd"),
                ("Cache-Status", "ktlsd; fwd=uri-miss"),
            ])
        );
    }

    #[test]
    fn early_hints_fields() {
        let upstream = response_pairs(&[
            ("Link", "</style.css>; rel=preload; as=style"),
            ("Link", "</app.js>; rel=preload; as=script"),
            ("Connection", "X-Hop"),
            ("X-Hop", "1"),
            ("Content-Length", "0"),
            ("Server", "app"),
            ("Date", "Mon, 01 Jan 2024 00:00:00 GMT"),
            ("X-Accel-Redirect", "/internal/a"),
            ("Transfer-Encoding", "chunked"),
            ("Content-Security-Policy", "default-src 'self'"),
        ]);
        assert_eq!(
            interim_fields(upstream),
            response_pairs(&[
                ("Link", "</style.css>; rel=preload; as=style"),
                ("Link", "</app.js>; rel=preload; as=script"),
                ("Content-Security-Policy", "default-src 'self'"),
            ])
        );
    }

    #[test]
    fn via_of_a_hit() {
        for (stored, want) in [
            (&[][..], "1.1 ktlsd"),
            (&["1.0 app"][..], "1.0 app, 1.1 ktlsd"),
            (&["1.0 a", "1.1 b"][..], "1.0 a, 1.1 b, 1.1 ktlsd"),
        ] {
            assert_eq!(hit_via(stored), want);
        }
    }

    #[test]
    fn fields_read_again_from_the_raw_head() {
        let raw = b"POST /a HTTP/1.1\r\nHost: h\r\nX-A:  b \r\n\r\n";
        assert_eq!(fields_of_head(raw), pairs(&[("Host", "h"), ("X-A", "b")]));
        assert!(fields_of_head(b"garbage").is_empty());
    }
}
