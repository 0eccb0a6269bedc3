//! The basic-auth phase (RFC 7617): `[[auth]]` rules, each a path pattern, a
//! realm and an htpasswd file; the first rule whose pattern matches the request's
//! path asks for credentials. A request without valid ones gets 401 with
//! `WWW-Authenticate: Basic realm="...", charset="UTF-8"`.
//!
//! Failed attempts are counted (`ktlsd_auth_failures_total`) and limited per
//! client address, the TCP peer's (an IPv6 client by its /64): after
//! [`MAX_FAILURES`] within [`WINDOW`] the address gets 429 with Retry-After, its
//! credentials unchecked, until the window ends. The table of addresses holds at
//! most [`TABLE_CAPACITY`] entries whatever the number of clients (the oldest
//! leaves first), so its memory is bounded.
//!
//! Hashes and their verification are [`super::htpasswd`]'s; this module decides
//! who asks what, and reads no file.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::htpasswd::Users;
use super::pattern::PathPattern;
use super::request::Request;
use super::response::{Header, Response, Status};

/// Failed attempts an address may make within [`WINDOW`] before it gets 429.
pub const MAX_FAILURES: u32 = 10;
/// How long failures are remembered, from an address's first one.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Most addresses the failure table holds.
pub const TABLE_CAPACITY: usize = 4096;

/// One `[[auth]]` rule, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub path: PathPattern,
    /// Checked at start-up: visible ASCII and spaces, without `"` or `\`.
    pub realm: String,
    pub users: Arc<Users>,
}

/// The failure table a site's `[[auth]]` rules share (the rules themselves are in the
/// site's location tree, `super::location`, which picks the one for a request).
#[derive(Debug, Default)]
pub struct Auth {
    failures: Mutex<Failures>,
}

/// State, not configuration: any two tables are the same configuration.
impl PartialEq for Auth {
    fn eq(&self, _: &Auth) -> bool {
        true
    }
}

impl Eq for Auth {}

impl Auth {
    /// The phase, for the request `rule` covers: `None` when the request may go on,
    /// else the 401 or 429 answer.
    pub fn check(&self, rule: &Rule, req: &Request, now: Instant) -> Option<Response> {
        let client = req.client.map(client_key);
        if let Some(wait) = client.and_then(|c| self.blocked(c, now)) {
            crate::stats::AUTH_RATE_LIMITED.fetch_add(1, Relaxed);
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            return Some(
                Response::refusal(Status::TOO_MANY_REQUESTS, "too many failed basic-auth attempts")
                    .with(Header::Field("Retry-After".into(), secs.max(1).to_string())),
            );
        }
        let why = match req.headers.authorization.as_deref().map(credentials) {
            None => "credentials required",
            Some(Some((user, password))) if rule.users.check(&user, &password) => return None,
            Some(_) => {
                crate::stats::AUTH_FAILURES.fetch_add(1, Relaxed);
                if let Some(c) = client {
                    self.failed(c, now);
                }
                "wrong or malformed credentials"
            }
        };
        let challenge = format!("Basic realm=\"{}\", charset=\"UTF-8\"", rule.realm);
        Some(Response::refusal(Status::UNAUTHORIZED, why).with(Header::Field("WWW-Authenticate".into(), challenge)))
    }

    /// How long `client` must still wait, when it is over the limit.
    fn blocked(&self, client: IpAddr, now: Instant) -> Option<Duration> {
        let table = self.failures.lock().ok()?;
        let e = table.entries.get(&client)?;
        let left = WINDOW.checked_sub(now.saturating_duration_since(e.since))?;
        (e.count >= MAX_FAILURES && !left.is_zero()).then_some(left)
    }

    fn failed(&self, client: IpAddr, now: Instant) {
        if let Ok(mut table) = self.failures.lock() {
            table.record(client, now);
        }
    }

    /// Addresses in the failure table now.
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.failures.lock().map(|t| t.entries.len()).unwrap_or(0)
    }
}

/// The address failures are counted under: an IPv6 client by its /64 (one
/// host usually holds the whole prefix), an IPv4 one (or IPv4-mapped) as it is.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    count: u32,
    since: Instant,
}

/// Failed attempts by address, at most [`TABLE_CAPACITY`] of them.
#[derive(Debug, Default)]
struct Failures {
    entries: HashMap<IpAddr, Entry>,
}

impl Failures {
    fn record(&mut self, client: IpAddr, now: Instant) {
        if let Some(e) = self.entries.get_mut(&client) {
            if now.saturating_duration_since(e.since) >= WINDOW {
                *e = Entry { count: 0, since: now };
            }
            e.count = e.count.saturating_add(1);
            return;
        }
        if self.entries.len() >= TABLE_CAPACITY {
            self.entries.retain(|_, e| now.saturating_duration_since(e.since) < WINDOW);
        }
        if self.entries.len() >= TABLE_CAPACITY {
            // Still full of live entries: the oldest goes.
            if let Some(oldest) = self.entries.iter().min_by_key(|(_, e)| e.since).map(|(k, _)| *k) {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(client, Entry { count: 1, since: now });
    }
}

/// The user and password of an `Authorization: Basic` value; `None` when it is
/// another scheme or malformed (bad base64, no colon, not UTF-8 in the user).
pub(crate) fn credentials(value: &str) -> Option<(String, Vec<u8>)> {
    let (scheme, token) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64_decode(token.trim())?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

/// Standard base64 with padding (RFC 4648 section 4), as RFC 7617 uses.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    if bytes.is_empty() || bytes.len() % 4 != 0 {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let chunks = bytes.len() / 4;
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && i + 1 != chunks) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | value(c)?;
        }
        n <<= 6 * pad as u32;
        let three = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&three[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::location::{Locations, Rules, SiteWide};
    use super::*;

    /// `htpasswd -nbB -C 4 alice secret`.
    const ALICE: &str = "alice:$2y$04$xv3tiIRfQ2/K60COWsW03eSiLkHaf8h7g8msiH5r7gkzEJBAdn73e";

    /// The rules for `paths`, in the tree that picks one per request, and their table.
    fn auth(paths: &[&str]) -> (Auth, Locations) {
        let users = Arc::new(Users::parse(ALICE).expect("parses"));
        let auth = paths
            .iter()
            .map(|p| Rule { path: PathPattern::new(p).expect(p), realm: "Staff".into(), users: users.clone() })
            .collect();
        (Auth::default(), Locations::new(Rules { auth, ..Rules::default() }, SiteWide::default()))
    }

    fn check(a: &(Auth, Locations), r: &Request, now: Instant) -> Option<Response> {
        let path = super::super::pattern::route_path(&r.path);
        a.0.check(a.1.find(path.as_deref()).auth?, r, now)
    }

    fn req(path: &str, authorization: Option<&str>, client: &str) -> Request {
        let mut r = Request::new(super::super::Method::Get, path);
        r.headers.authorization = authorization.map(String::from);
        r.client = Some(client.parse().expect("address"));
        r
    }

    fn status(a: &(Auth, Locations), r: &Request) -> u16 {
        check(a, r, Instant::now()).map_or(200, |r| r.status.0)
    }

    const GOOD: &str = "Basic YWxpY2U6c2VjcmV0"; // alice:secret
    const BAD: &str = "Basic YWxpY2U6d3Jvbmc="; // alice:wrong

    #[test]
    fn rules_cover_their_paths() {
        let a = auth(&["/private/*", "/exact.html"]);
        for (path, authorization, want) in [
            ("/", None, 200),
            ("/public/x", None, 200),
            ("/private", None, 401),
            ("/privates", None, 200),
            ("/private.html", None, 200),
            ("/private/", None, 401),
            ("/private/a/b.txt", None, 401),
            ("/%70rivate/a", None, 401),
            ("/public/../private/a", None, 401),
            ("//private//a", None, 401),
            ("/private/./a", None, 401),
            ("/../private/a", None, 401), // not normalisable: the first rule asks
            ("/%zz", None, 401),
            ("/exact.html", None, 401),
            ("/exact.html/x", None, 200),
            ("/private/a", Some(GOOD), 200),
            ("/private/a", Some("basic   YWxpY2U6c2VjcmV0"), 200),
            ("/private/a", Some(BAD), 401),
            ("/private/a", Some("Bearer abc"), 401),
            ("/private/a", Some("Basic !!!!"), 401),
            ("/private/a", Some("Basic YWxpY2U"), 401),
            ("/private/a", Some("Basic"), 401),
        ] {
            assert_eq!(status(&a, &req(path, authorization, "192.0.2.1")), want, "{path} {authorization:?}");
        }
        let r = check(&a, &req("/private/", None, "192.0.2.1"), Instant::now()).expect("401");
        assert_eq!(
            r.header("www-authenticate").map(|h| h.to_string()).as_deref(),
            Some("Basic realm=\"Staff\", charset=\"UTF-8\"")
        );
    }

    #[test]
    fn failures_are_limited_per_client() {
        let a = auth(&["/*"]);
        let now = Instant::now();
        for _ in 0..MAX_FAILURES {
            assert_eq!(check(&a, &req("/x", Some(BAD), "192.0.2.7"), now).map(|r| r.status.0), Some(401));
        }
        let limited = check(&a, &req("/x", Some(GOOD), "192.0.2.7"), now).expect("429");
        assert_eq!(limited.status.0, 429);
        assert_eq!(limited.header("retry-after").map(|h| h.to_string()).as_deref(), Some("60"));
        // Another address, and the same one once the window has passed, are answered.
        assert!(check(&a, &req("/x", Some(GOOD), "192.0.2.8"), now).is_none());
        assert!(check(&a, &req("/x", Some(GOOD), "192.0.2.7"), now + WINDOW).is_none());
        // An IPv6 client is one /64.
        for i in 0..MAX_FAILURES {
            let _ = check(&a, &req("/x", Some(BAD), &format!("2001:db8::{i:x}")), now);
        }
        assert_eq!(status(&a, &req("/x", Some(GOOD), "2001:db8::ffff")), 429);
        assert_eq!(status(&a, &req("/x", Some(GOOD), "2001:db8:0:1::1")), 200);
    }

    #[test]
    fn table_is_bounded() {
        let a = auth(&["/*"]);
        let now = Instant::now();
        for i in 0..10_000u32 {
            let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i);
            a.0.failed(IpAddr::V4(ip), now + Duration::from_millis(u64::from(i)));
        }
        assert_eq!(a.0.tracked(), TABLE_CAPACITY);
        // The newest are kept.
        a.0.failed("10.0.39.15".parse().expect("ip"), now);
        assert!(a.0.failures.lock().expect("lock").entries.contains_key(&"10.0.39.15".parse::<IpAddr>().expect("ip")));
    }

    #[test]
    fn base64() {
        for (s, want) in [
            ("YWxpY2U6c2VjcmV0", Some(&b"alice:secret"[..])),
            ("YQ==", Some(b"a")),
            ("YWI=", Some(b"ab")),
            ("YQ", None),
            ("Y===", None),
            ("YQ==YQ==", None),
            ("", None),
            ("YW\u{e9}=", None),
        ] {
            assert_eq!(base64_decode(s).as_deref(), want, "{s}");
        }
        assert_eq!(credentials("Basic OnB3"), Some((String::new(), b"pw".to_vec())));
        assert_eq!(credentials("Basic /w=="), None, "no colon");
    }
}
