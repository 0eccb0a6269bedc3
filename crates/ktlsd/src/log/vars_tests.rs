//! Table tests of the variables and their templates.
use super::*;
use crate::log::{RequestLine, TlsInfo};
use crate::vocab::{BodyPath, Method, RecordLayer};
use std::time::{Duration, Instant};

#[test]
fn templates() {
    let line = RequestLine { method: &Method::Get, target: "/a?b", version: "HTTP/2.0" };
    let notes = Notes::default();
    notes.with(|n| {
        n.request_id = Some("abc-1".into());
        n.remote_user = Some("alice".into());
        n.cache_status = Some("MISS");
        n.upstream = vec![
            Attempt {
                addr: "10.0.0.1:80".into(),
                status: Some(502),
                connect: Some(Duration::from_millis(1)),
                ..Attempt::default()
            },
            Attempt {
                addr: "10.0.0.2:80".into(),
                status: Some(200),
                connect: Some(Duration::ZERO),
                header: Some(Duration::from_millis(12)),
                response: Some(Duration::from_millis(30)),
            },
        ];
    });
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
        notes: Some(&notes),
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
        ("$request_id $remote_user $scheme", Ok("abc-1 alice https")),
        ("$upstream_addr|$upstream_status", Ok("10.0.0.1:80, 10.0.0.2:80|502, 200")),
        ("$upstream_connect_time|$upstream_header_time|$upstream_response_time", Ok("0.001, 0.000|-, 0.012|-, 0.030")),
        ("${upstream_cache_status}", Ok("MISS")),
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

#[test]
fn field_values_take_the_variables_a_field_may_carry() {
    let line = RequestLine { method: &Method::Post, target: "/api/x?q=\"1\"", version: "HTTP/1.1" };
    let notes = Notes::default();
    notes.with(|n| n.request_id = Some("r1".into()));
    let e = AccessEntry {
        peer: "[2001:db8::1]:1234".parse().unwrap(),
        request: Some(line),
        status: 0,
        bytes: 0,
        started: Instant::now(),
        ttfb: Duration::ZERO,
        layer: RecordLayer::Kernel,
        body: None,
        referer: None,
        user_agent: Some("a \"b\""),
        tls: None,
        host: Some("api.test"),
        site: "api.test",
        client_subject: None,
        notes: Some(&notes),
    };
    // (text, the value, or the error's words): values as they are, nothing escaped, absent ones empty.
    let table: &[(&str, Result<&str, &str>)] = &[
        ("$remote_addr", Ok("2001:db8::1")),
        ("$scheme://$host$request_uri", Ok("https://api.test/api/x?q=\"1\"")),
        ("id=$request_id; ua=$http_user_agent; ref=$http_referer", Ok("id=r1; ua=a \"b\"; ref=")),
        ("$request_method $server_protocol $$5", Ok("POST HTTP/1.1 $5")),
        ("$site", Err("$site has no value here")),
        ("$status", Err("$status has no value here")),
        ("$upstream_addr", Err("$upstream_addr has no value here")),
        ("$body_bytes_sent", Err("has no value here")),
        ("$nope", Err("unknown variable $nope")),
        ("a\r\nX-Evil: 1", Err("one line")),
    ];
    for (text, want) in table {
        match (Template::parse_for("request_headers", text, When::Request), want) {
            (Ok(t), Ok(v)) => assert_eq!(t.value(&e), *v, "{text:?}"),
            (Err(got), Err(words)) => {
                assert!(got.contains(words) && got.starts_with("request_headers"), "{text:?}: {got}")
            }
            (got, _) => panic!("{text:?}: {got:?}, expected {want:?}"),
        }
    }
    // Response fields may name the upstream's answer.
    assert!(Template::parse_for("response_headers", "$upstream_status $upstream_addr", When::Upstream).is_ok());
    assert!(Template::parse_for("response_headers", "$request_time", When::Upstream).is_err());
}

#[test]
fn request_ids_users_and_cache_statuses() {
    let a = new_request_id();
    let b = new_request_id();
    assert_eq!((a.len(), b.len()), (32, 32));
    assert!(a != b && a.bytes().all(|c| c.is_ascii_hexdigit()), "{a} {b}");
    let many: std::collections::HashSet<String> = (0..500).map(|_| new_request_id()).collect();
    assert_eq!(many.len(), 500, "ids drawn across batches are all different");
    for (id, ok) in [
        ("6f1c2b9e-8d44-4a5e-9b0e-3f6f7c2d1a90", true),
        ("abc123", true),
        ("YWJj+/==", true),
        ("", false),
        ("a b", false),
        ("a\"b", false),
        ("a,b", false),
        (&"x".repeat(129), false),
        (&"x".repeat(128), true),
    ] {
        assert_eq!(valid_request_id(id), ok, "{id:?}");
    }
    for (authorization, user) in [
        ("Basic YWxpY2U6c2VjcmV0", Some("alice")),
        ("basic   Ym9iOg==", Some("bob")),
        ("Basic Ym9i", None),
        ("Bearer YWxpY2U6c2VjcmV0", None),
        ("Basic !!!", None),
        ("Basic", None),
    ] {
        assert_eq!(basic_user(authorization).as_deref(), user, "{authorization}");
    }
    for (rfc, nginx) in [
        ("ktlsd; hit", "HIT"),
        ("ktlsd; hit; detail=stale-while-revalidate", "UPDATING"),
        ("ktlsd; fwd=stale; fwd-status=500; detail=stale-if-error", "STALE"),
        ("ktlsd; fwd=stale; detail=stale-if-error", "STALE"),
        ("ktlsd; fwd=miss; stored", "MISS"),
        ("ktlsd; fwd=vary-miss", "MISS"),
        ("ktlsd; fwd=stale; fwd-status=304", "REVALIDATED"),
        ("ktlsd; fwd=stale", "EXPIRED"),
        ("ktlsd; fwd=method", "BYPASS"),
        ("ktlsd; fwd=bypass", "BYPASS"),
        ("ktlsd; fwd=request", "BYPASS"),
    ] {
        assert_eq!(nginx_cache_status(rfc), nginx, "{rfc}");
    }
}
