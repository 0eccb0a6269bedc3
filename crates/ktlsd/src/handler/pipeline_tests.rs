//! The pipeline in process, phase by phase: one site whose location tree holds a
//! redirect, an IP rule, a `[[proxy]]` rule and `[[location]]` blocks, an in-memory
//! downstream that records what the codec would send, and an upstream on a loopback
//! socket of this test that answers every request alike and records what it got.

use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::access::{AccessRule, Addresses};
use super::downstream::{Answer, BodyError, Downstream, Outcome};
use super::failure::Failure;
use super::limit::Limiter;
use super::location::{Block, Locations, Rules, SiteWide};
use super::pattern::PathPattern;
use super::pipeline::{Decision, Exchange, Handshake, RequestBody, Upstreamed};
use super::proxy::{Balance, HostMode, Rule, Timeouts, Upstream};
use super::redirect::Redirect;
use super::rules::{HeaderRule, PathMatch};
use super::*;

/// What the codec was asked to send; `upload`: the request body the client sends.
#[derive(Default)]
struct Recorded {
    upload: Vec<u8>,
    head: Option<Response>,
    body: Vec<u8>,
    ended: bool,
}

impl Downstream for Recorded {
    type Error = ();

    async fn read_body(&mut self, into: &mut Vec<u8>) -> Result<bool, BodyError<()>> {
        into.append(&mut self.upload);
        Ok(false)
    }

    async fn send_head(
        &mut self,
        head: Response,
        _: Option<u64>,
        first: &[u8],
        end: bool,
        _: Option<BorrowedFd<'_>>,
    ) -> Result<(), ()> {
        self.head = Some(head);
        self.body.extend_from_slice(first);
        self.ended = end;
        Ok(())
    }

    async fn send_body(&mut self, piece: &[u8], end: bool) -> Result<(), ()> {
        self.body.extend_from_slice(piece);
        self.ended = end;
        Ok(())
    }

    fn abort(&mut self, _: &Failure) {}
}

/// An upstream answering `200 up` to every request; the request lines it got.
async fn upstream() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let lines = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let lines = lines.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&buf);
                lines.lock().unwrap().push(text.lines().next().unwrap_or("").to_string());
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nup").await;
            });
        }
    });
    (url, seen)
}

fn proxy_rule(path: &str, url: &str) -> Arc<Rule> {
    Arc::new(Rule {
        path: PathPattern::new(path).unwrap(),
        upstreams: vec![Upstream::parse(url).unwrap()],
        cache: false,
        host: HostMode::Preserve,
        balance: Balance::RoundRobin,
        timeouts: Timeouts {
            connect: Duration::from_secs(5),
            read: Duration::from_secs(5),
            send: Duration::from_secs(5),
            tunnel_idle: Duration::from_secs(5),
        },
        fail_timeout: Duration::from_secs(1),
        keepalive: 0,
        tls: None,
        control: Default::default(),
        health_check: None,
    })
}

fn block(path: &str) -> Block {
    Block {
        path: PathPattern::new(path).unwrap(),
        rate_limit: None,
        max_body_bytes: None,
        compress: None,
        error_pages: None,
        try_files: None,
    }
}

/// How a case ends.
#[derive(Debug, PartialEq, Eq)]
enum Ends {
    /// A phase refused it with this status.
    Refused(u16),
    /// The static answer, with this status.
    Static(u16),
    /// Forwarded: the upstream's status, and whether the site's header rule and HSTS
    /// were on it.
    Forwarded(u16, bool),
}

#[tokio::test]
async fn each_phase_answers_in_its_order_for_the_path_it_matched() {
    let (url, seen) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.png"), b"png").unwrap();
    let root = crate::files::Root::new(dir.path()).unwrap();
    let rules = Rules {
        redirects: vec![Redirect {
            path: PathPattern::new("/old/*").unwrap(),
            to: "/new/{*}".into(),
            status: Status(301),
        }],
        access: vec![AccessRule {
            path: Some(PathPattern::new("/api/admin/*").unwrap()),
            rules: vec![(false, Addresses::All)],
        }],
        auth: Vec::new(),
        proxy: vec![proxy_rule("/api/*", &url)],
        blocks: vec![
            Block {
                rate_limit: Some(Arc::new(Limiter::new(1, Duration::from_secs(60), 1, 64))),
                ..block("/api/slow/*")
            },
            Block { max_body_bytes: Some(10), ..block("/api/small/*") },
        ],
    };
    let content = Content {
        canonical: Some("a.test".into()),
        headers: vec![HeaderRule::new(
            PathMatch::Pattern(PathPattern::new("/api/*").unwrap()),
            vec![("X-Frame-Options".into(), "DENY".into())],
            vec![],
            None,
        )
        .unwrap()],
        locations: Locations::new(rules, SiteWide::default()),
        ..Content::NONE
    };
    let files = crate::files::Options { dotfiles: false, autoindex: false, cache_entries: 0 };
    let site = Site::new(&root, files, Some("max-age=1"), &content);
    let sites = Sites::single(site);
    let client: IpAddr = "192.0.2.1".parse().unwrap();
    for (host, method, path, body, ends, upstream_saw) in [
        // Canonical host first, even for a path a redirect or the proxy would take.
        ("www.a.test", Method::Get, "/old/x", RequestBody::None, Ends::Refused(301), None),
        ("www.a.test", Method::Get, "/api/x", RequestBody::None, Ends::Refused(301), None),
        // The redirect, on the normalised path.
        ("a.test", Method::Get, "/x/../old/y", RequestBody::None, Ends::Refused(301), None),
        // The IP rule inside the proxied location, on its normalised spelling.
        ("a.test", Method::Get, "/api/%61dmin/x", RequestBody::None, Ends::Refused(403), None),
        // The body's limit: the server's (1000), a location's own (10).
        ("a.test", Method::Post, "/api/echo", RequestBody::Length(2000), Ends::Refused(413), None),
        ("a.test", Method::Post, "/api/small/echo", RequestBody::Length(20), Ends::Refused(413), None),
        (
            "a.test",
            Method::Post,
            "/api/echo",
            RequestBody::Length(20),
            Ends::Forwarded(200, true),
            Some("POST /api/echo"),
        ),
        // A location's rate limit counts there only.
        ("a.test", Method::Get, "/api/slow/1", RequestBody::None, Ends::Forwarded(200, true), Some("GET /api/slow/1")),
        ("a.test", Method::Get, "/api/slow/2", RequestBody::None, Ends::Refused(429), None),
        ("a.test", Method::Get, "/a.png", RequestBody::None, Ends::Static(200), None),
        ("a.test", Method::Get, "/a.png", RequestBody::None, Ends::Static(200), None),
        // One dialect: `/api/*` takes any depth, and what goes upstream is normalised.
        ("a.test", Method::Get, "/api/a/b/../c", RequestBody::None, Ends::Forwarded(200, true), Some("GET /api/a/c")),
        ("a.test", Method::Get, "/api", RequestBody::None, Ends::Forwarded(200, true), Some("GET /api")),
        ("a.test", Method::Get, "/apiary", RequestBody::None, Ends::Static(404), None),
    ] {
        let sent = method.to_string();
        let req = Request { authority: Some(host.into()), client: Some(client), ..Request::new(method, path) };
        let before = super::pipeline::count::site_lookups();
        let x = Exchange::begin(req, &sites, Handshake::Tcp(Some(host))).unwrap_or_else(|_| panic!("{path}: no site"));
        assert_eq!(super::pipeline::count::site_lookups(), before + 1, "{path}: one site lookup");
        let upstreamed = || Upstreamed { method: sent.clone(), fields: Vec::new(), version: "1.1", body };
        let before = seen.lock().unwrap().len();
        let got = match x.decide(body, 1000, upstreamed).await {
            Decision::Respond(r) => Ends::Refused(r.status.0),
            Decision::Static(r) => Ends::Static(r.status.0),
            Decision::Forward(f) => {
                let len = if let RequestBody::Length(n) = body { n as usize } else { 0 };
                let mut d = Recorded { upload: vec![b'b'; len], ..Recorded::default() };
                match f.run(&x.req, &mut d).await {
                    Outcome::Streamed(s) => {
                        let head = d.head.expect("a head");
                        let fields = head.header("X-Frame-Options").is_some()
                            && head.header("Strict-Transport-Security").is_some();
                        assert_eq!((d.body.as_slice(), d.ended), (&b"up"[..], true), "{path}");
                        Ends::Forwarded(s.status, fields)
                    }
                    Outcome::Answer { answer: Answer::Response(r), .. } => Ends::Forwarded(r.status.0, false),
                    Outcome::Answer { answer: Answer::Failed(f, _), .. } => panic!("{path}: {f}"),
                    Outcome::Answer { answer: Answer::Accel(a), .. } => panic!("{path}: accel {}", a.value),
                    Outcome::ClientGone(()) => panic!("{path}: client gone"),
                }
            }
        };
        assert_eq!(got, ends, "{host} {path}");
        let lines = seen.lock().unwrap();
        assert_eq!(lines.get(before).map(|l| l.trim_end_matches(" HTTP/1.1")), upstream_saw, "{path}");
        assert_eq!(lines.len(), before + usize::from(upstream_saw.is_some()), "{path}: {lines:?}");
    }
}
