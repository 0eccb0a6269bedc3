//! Table tests of a rule's control: prefixes, field rules, accel paths.

use super::*;
use crate::log::{Notes, RequestLine};
use crate::vocab::{Method, RecordLayer};
use std::time::{Duration, Instant};

#[test]
fn prefixes_are_stripped_at_segment_boundaries() {
    for (prefix, want) in [
        ("/api", Ok("/api")),
        ("/api/", Ok("/api")),
        ("/a/b", Ok("/a/b")),
        ("api", Err(())),
        ("/", Err(())),
        ("/a//b", Err(())),
        ("/a/../b", Err(())),
        ("/a/*", Err(())),
        ("/a?x", Err(())),
        ("/a%2fb", Err(())),
    ] {
        assert_eq!(check_prefix(prefix).map_err(|_| ()), want.map(str::to_string), "{prefix}");
    }
    for (target, want) in [
        ("/api/x", "/x"),
        ("/api/x/y?q=1", "/x/y?q=1"),
        ("/api", "/"),
        ("/api/", "/"),
        ("/api?q=1", "/?q=1"),
        ("/apix", "/apix"),
        ("/other/api/x", "/other/api/x"),
        ("/API/x", "/API/x"),
    ] {
        assert_eq!(strip_prefix(target, "/api"), want, "{target}");
    }
}

fn rules(key: &str, text: &str) -> Result<FieldRules, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    FieldRules::parse(key, &table)
}

#[test]
fn field_rules_parse_and_expand() {
    let r = rules(
        "request_headers",
        r#"set = { X-Real-IP = "$remote_addr", Host = "internal", X-Url = "$scheme://$host$request_uri" }
add = { X-Trace = "id=$request_id" }
remove = ["Cookie", "x-debug"]"#,
    )
    .unwrap();
    let notes = Notes::default();
    notes.with(|n| n.request_id = Some("r-9".into()));
    let line = RequestLine { method: &Method::Get, target: "/a?b=1", version: "HTTP/2.0" };
    let e = AccessEntry {
        peer: "192.0.2.5:443".parse().unwrap(),
        request: Some(line),
        status: 0,
        bytes: 0,
        started: Instant::now(),
        ttfb: Duration::ZERO,
        layer: RecordLayer::Kernel,
        body: None,
        referer: None,
        user_agent: None,
        tls: None,
        client_subject: None,
        host: Some("www.test"),
        site: "www.test",
        notes: Some(&notes),
    };
    let x = r.expand(&e);
    assert_eq!(
        x.fields,
        [("X-Real-IP", "192.0.2.5"), ("Host", "internal"), ("X-Url", "https://www.test/a?b=1"), ("X-Trace", "id=r-9"),]
            .map(|(n, v)| (n.to_string(), v.to_string()))
    );
    assert!(x.drops("cookie") && x.drops("X-DEBUG") && x.drops("x-real-ip") && x.drops("host") && !x.drops("X-Trace"));
    assert_eq!(x.value_of("host"), Some("internal"));
    assert!(rules("response_headers", "set = { X-Up = \"$upstream_addr $upstream_status\" }").is_ok());

    for (key, text, error) in [
        ("request_headers", "set = { X-A = \"$upstream_status\" }", "has no value here"),
        ("request_headers", "set = { X-A = \"$nope\" }", "unknown variable $nope"),
        ("request_headers", "set = { X-A = 5 }", "expected a string"),
        ("request_headers", "set = [\"X-A\"]", "expected a table"),
        ("request_headers", "remove = \"X-A\"", "expected a list"),
        ("request_headers", "remove = [5]", "expected a list of field names"),
        ("request_headers", "drop = [\"X-A\"]", "unknown key \"drop\""),
        ("request_headers", "set = { \"X A\" = \"v\" }", "is not a field name"),
        ("request_headers", "set = { Content-Length = \"0\" }", "the connection's own"),
        ("response_headers", "remove = [\"Transfer-Encoding\"]", "the connection's own"),
        ("response_headers", "add = { Proxy-Authenticate = \"x\" }", "the connection's own"),
        ("response_headers", "set = { X-A = \"a\\nb\" }", "one line"),
    ] {
        let e = rules(key, text).err().unwrap_or_else(|| panic!("{text} was accepted"));
        assert!(e.contains(error) && e.starts_with(key), "{text}: {e}");
    }
}

#[test]
fn cache_bypass_conditions() {
    let table: toml::Table =
        toml::from_str("cookie = [\"session\"]\nheader = [\"X-Debug\", \"Authorization\"]\nquery = [\"nocache\"]")
            .unwrap();
    let b = Bypass::parse(&table).unwrap();
    let f = |list: &[(&str, &str)]| list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect::<Vec<_>>();
    // (fields, query, bypassed)
    for (fields, query, want) in [
        (f(&[]), None, false),
        (f(&[("Cookie", "a=1; session=abc")]), None, true),
        (f(&[("cookie", "session=")]), None, false),
        (f(&[("Cookie", "session=0")]), None, false),
        (f(&[("Cookie", "xsession=1; other=session")]), None, false),
        (f(&[("x-debug", "1")]), None, true),
        (f(&[("X-Debug", "0")]), None, false),
        (f(&[("X-Debug", "")]), None, false),
        (f(&[("Authorization", "Basic eDp5")]), None, true),
        (f(&[]), Some("a=1&nocache=1"), true),
        (f(&[]), Some("nocache=0"), false),
        (f(&[]), Some("nocache"), false),
        (f(&[]), Some("xnocache=1"), false),
    ] {
        assert_eq!(b.applies(&fields, query), want, "{fields:?} {query:?}");
    }
    for (text, error) in [
        ("cookies = [\"a\"]", "unknown key \"cookies\""),
        ("cookie = \"a\"", "expected a list"),
        ("header = [\"\"]", "expected a list"),
    ] {
        let table: toml::Table = toml::from_str(text).unwrap();
        let e = Bypass::parse(&table).unwrap_err();
        assert!(e.contains(error), "{text}: {e}");
    }
    let secs = std::time::Duration::from_secs;
    let valid: Valid = vec![(Some(200), secs(600)), (Some(404), secs(60)), (None, secs(5))];
    for (status, want) in [(200, Some(600)), (404, Some(60)), (302, Some(5))] {
        assert_eq!(valid_for(&valid, status), want.map(secs), "{status}");
    }
    assert_eq!(valid_for(&vec![(Some(200), secs(1))], 404), None);
}
