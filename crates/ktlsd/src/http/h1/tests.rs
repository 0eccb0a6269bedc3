//! The HTTP/1.x connection loop over the in-memory transport: framing, keep-alive,
//! limits, timeouts and shutdown, byte for byte as a client reads them.

use std::net::SocketAddr;
use std::time::Duration;

use tempfile::TempDir;
use tokio::sync::watch;

use super::*;
use crate::files::{Options, Root};
use crate::handler::Sites;
use crate::http::testing::{MemError, Memory, Step};
use crate::log::AccessLog;

const A_TXT: &[u8] = b"inside\n";
const DIGITS: &[u8] = b"0123456789";

struct Fixture {
    _dir: TempDir,
    root: Root,
    settings: Settings,
    hsts: Option<String>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("a.txt"), A_TXT).unwrap();
    std::fs::write(dir.path().join("digits.txt"), DIGITS).unwrap();
    std::fs::write(dir.path().join("empty.txt"), b"").unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("d/index.html"), b"<p>index</p>").unwrap();
    let root = Root::new(dir.path()).unwrap();
    let settings = Settings {
        max_head_bytes: 1024,
        max_body_bytes: 100,
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
    };
    Fixture { _dir: dir, root, settings, hsts: None }
}

impl Fixture {
    fn site(&self) -> Site<'_> {
        let files = Options { dotfiles: false, autoindex: false, cache_entries: 0 };
        Site::new(&self.root, files, self.hsts.as_deref(), crate::handler::Content::none())
    }

    async fn serve(&self, mem: &mut Memory) -> End<MemError> {
        let (_tx, rx) = watch::channel(false);
        self.serve_until(mem, rx).await
    }

    async fn serve_until(&self, mem: &mut Memory, shutdown: watch::Receiver<bool>) -> End<MemError> {
        let log = AccessLog::new(None);
        serve(mem, self.context(&log, shutdown)).await
    }
}

/// One response as a client reads it.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Splits `out` into responses. `head_only[i]`: the i-th final response answers a
/// HEAD (its Content-Length announces no body); missing entries are false.
fn replies(out: &[u8], head_only: &[bool]) -> Vec<Reply> {
    let mut rest = out;
    let mut all = Vec::new();
    let mut finals = 0;
    while !rest.is_empty() {
        let end = rest.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete head") + 4;
        let text = std::str::from_utf8(&rest[..end]).expect("an ASCII head");
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap();
        assert!(status_line.starts_with("HTTP/1.1 "), "{status_line:?}");
        let status: u16 = status_line[9..12].parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (n, v) = l.split_once(": ").expect("name: value");
                (n.to_string(), v.to_string())
            })
            .collect();
        let mut reply = Reply { status, headers, body: Vec::new() };
        let len = match reply.header("Content-Length") {
            _ if status < 200 => 0,
            _ if head_only.get(finals).copied().unwrap_or(false) => 0,
            Some(n) => n.parse().unwrap(),
            None => 0,
        };
        if status >= 200 {
            finals += 1;
        }
        reply.body = rest[end..end + len].to_vec();
        rest = &rest[end + len..];
        all.push(reply);
    }
    all
}

fn statuses(r: &[Reply]) -> Vec<u16> {
    r.iter().map(|r| r.status).collect()
}

#[tokio::test]
async fn serves_a_file_and_keeps_the_connection() {
    let f = fixture();
    let mut mem = Memory::sending(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n");
    let end = f.serve(&mut mem).await;
    assert!(matches!(end, End::Done), "{end:?}");
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [200]);
    assert_eq!(r[0].body, A_TXT);
    let names: Vec<&str> = r[0].headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["Server", "Date", "Content-Type", "Content-Length", "Last-Modified", "ETag", "Accept-Ranges"]);
    assert_eq!(r[0].header("Content-Type"), Some("text/plain; charset=utf-8"));
    assert!(!mem.lingered, "the peer closed first: nothing to drain");
    assert_eq!(mem.read_timeouts[0], f.settings.idle_timeout);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let f = fixture();
    let mut mem = Memory::sending(
        b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\nHEAD /digits.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /digits.txt HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    f.serve(&mut mem).await;
    let r = replies(&mem.output, &[false, false, true, false]);
    assert_eq!(statuses(&r), [200, 404, 200, 200]);
    assert_eq!((r[0].body.as_slice(), r[3].body.as_slice()), (A_TXT, DIGITS));
    assert_eq!((r[2].header("Content-Length"), r[2].body.len()), (Some("10"), 0));
}

#[tokio::test]
async fn a_head_split_across_reads_is_one_request() {
    let f = fixture();
    let pieces = ["GE", "T /a.t", "xt HTTP/1.1\r\nHo", "st: x\r", "\n\r\n"];
    let mut mem = Memory::new(pieces.iter().map(|p| Step::Data(p.as_bytes().to_vec())));
    f.serve(&mut mem).await;
    assert_eq!(statuses(&replies(&mem.output, &[])), [200]);
    // Once the head has begun, reads wait at most what is left of the header timeout.
    assert_eq!(mem.read_timeouts[0], f.settings.idle_timeout);
    let during = &mem.read_timeouts[1..pieces.len()];
    assert!(during.iter().all(|t| *t < f.settings.header_timeout), "{:?}", mem.read_timeouts);
    assert_eq!(mem.read_timeouts[pieces.len()], f.settings.idle_timeout, "then idle again");
}

#[tokio::test]
async fn connection_close_ends_after_the_answer() {
    let f = fixture();
    let mut mem = Memory::sending(
        b"GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    let end = f.serve(&mut mem).await;
    assert!(matches!(end, End::Done));
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [200], "the request after close is not answered");
    assert_eq!(r[0].header("Connection"), Some("close"));
    assert!(mem.lingered);
}

#[tokio::test]
async fn http10_closes_unless_asked_to_keep_alive() {
    let f = fixture();
    let mut mem = Memory::sending(b"GET /a.txt HTTP/1.0\r\n\r\nGET /a.txt HTTP/1.0\r\n\r\n");
    f.serve(&mut mem).await;
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [200]);
    assert_eq!(r[0].header("Connection"), Some("close"));

    let mut mem = Memory::sending(b"GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /a.txt HTTP/1.0\r\n\r\n");
    f.serve(&mut mem).await;
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [200, 200]);
    assert_eq!((r[0].header("Connection"), r[1].header("Connection")), (Some("keep-alive"), Some("close")));
    assert!(mem.output.starts_with(b"HTTP/1.1 200 OK\r\n"), "the status line names the server's version");
}

#[tokio::test]
async fn malformed_heads_are_refused_and_closed() {
    let f = fixture();
    let long_target = format!("GET /{} HTTP/1.1\r\n", "a".repeat(2000));
    let big_header = format!("GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n", "a".repeat(2000));
    let many_headers = format!("GET / HTTP/1.1\r\nHost: x\r\n{}\r\n", "X: y\r\n".repeat(101));
    for (input, want) in [
        ("GET / HTTP/1.1\r\n\r\n", 400),
        ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        ("GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
        ("GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        ("GET / HTTZ/1.1\r\nHost: x\r\n\r\n", 400),
        ("G@T / HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("GET https://u@h/ HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("\x16\x03\x01\x02\x00\x01\x00\x01\x7c\x03\x03\r\n\r\n", 400),
        (long_target.as_str(), 414),
        (big_header.as_str(), 431),
        (many_headers.as_str(), 431),
        ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n\r\n", 400),
        ("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        ("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\n", 400),
        ("GET / HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n\r\n", 417),
        ("GET /a.txt HTTP/1.1\r\nHost x\r\n\r\n", 400),
        ("\x01\x02\x03 nonsense\r\n\r\n", 400),
        ("GET\r\n\r\n", 400),
        ("GET /a.txt HTTP/1.1 extra\r\nHost: x\r\n\r\n", 400),
        ("GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n", 400),
        ("GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
        ("GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
    ] {
        let mut mem = Memory::sending(input.as_bytes());
        let end = f.serve(&mut mem).await;
        assert!(matches!(end, End::Done), "{input:?}: {end:?}");
        let r = replies(&mem.output, &[]);
        assert_eq!(statuses(&r), [want], "{input:?}");
        assert_eq!(r[0].header("Connection"), Some("close"), "{input:?}");
        assert!(String::from_utf8_lossy(&r[0].body).contains(&format!("<h1>{want} ")), "{input:?}");
        assert!(mem.lingered, "{input:?}");
    }
}

/// `OPTIONS *` gets the answer HTTP/2's `:path *` gets: 204 with Allow.
#[tokio::test]
async fn options_asterisk_is_204_with_allow() {
    let f = fixture();
    let mut mem = Memory::sending(b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n");
    f.serve(&mut mem).await;
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [204]);
    assert_eq!(r[0].header("Allow"), Some("GET, HEAD, OPTIONS"));
}

#[tokio::test]
async fn refusals_of_head_requests_have_no_body() {
    let f = fixture();
    for input in
        ["HEAD / HTTP/2.0\r\nHost: x\r\n\r\n", "HEAD / HTTP/1.1\r\n\r\n", "HEAD /nope HTTP/1.1\r\nHost: x\r\n\r\n"]
    {
        let mut mem = Memory::sending(input.as_bytes());
        f.serve(&mut mem).await;
        let r = replies(&mem.output, &[true]);
        assert_eq!(r.len(), 1, "{input:?}: {}", mem.output_text());
        assert!(r[0].header("Content-Length").is_some_and(|n| n != "0"), "{input:?}");
        assert!(mem.output.ends_with(b"\r\n\r\n"), "{input:?}");
    }
}

#[tokio::test]
async fn request_bodies_are_read_and_dropped() {
    let f = fixture();
    // The body arrives in pieces, the next request right behind it.
    let mut mem = Memory::new([
        Step::Data(b"POST /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123".to_vec()),
        Step::Data(b"456789GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
    ]);
    f.serve(&mut mem).await;
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [405, 200]);
    assert_eq!(r[0].header("Allow"), Some("GET, HEAD, OPTIONS"));
    assert_eq!(r[0].header("Connection"), None, "a refused method keeps the connection");
    assert_eq!(r[1].body, A_TXT);
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused_unread() {
    let f = fixture();
    for input in [
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\nExpect: 100-continue\r\n\r\n",
    ] {
        let mut mem = Memory::new([Step::Data(input.as_bytes().to_vec()), Step::Fail]);
        let end = f.serve(&mut mem).await;
        assert!(matches!(end, End::Done), "{input:?}: {end:?}");
        let r = replies(&mem.output, &[]);
        assert_eq!(statuses(&r), [413], "{input:?}");
        assert_eq!(r[0].header("Connection"), Some("close"));
        assert_eq!(mem.read_timeouts.len(), 1, "the body is not read");
        assert!(mem.lingered);
    }
    // At the limit, it is read.
    let mut mem = Memory::sending(
        format!("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}", "b".repeat(100)).as_bytes(),
    );
    f.serve(&mut mem).await;
    assert_eq!(statuses(&replies(&mem.output, &[])), [405]);
}

#[tokio::test]
async fn expect_continue() {
    let f = fixture();
    // A served method: 100, then the body is read, then the answer.
    let mut mem = Memory::new([
        Step::Data(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n".to_vec()),
        Step::Data(b"abc".to_vec()),
    ]);
    f.serve(&mut mem).await;
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [100, 200]);
    assert!(mem.output.starts_with(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"));

    // A refused method: 405 at once, no 100, the body never read.
    let mut mem = Memory::new([
        Step::Data(b"PUT /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n".to_vec()),
        Step::Fail,
    ]);
    let end = f.serve(&mut mem).await;
    assert!(matches!(end, End::Done), "{end:?}");
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [405]);
    assert_eq!((r[0].header("Allow"), r[0].header("Connection")), (Some("GET, HEAD, OPTIONS"), Some("close")));
    assert!(mem.lingered);

    // Without a body there is nothing to invite.
    let mut mem = Memory::sending(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n");
    f.serve(&mut mem).await;
    assert_eq!(statuses(&replies(&mem.output, &[])), [200]);
    // HTTP/1.0 clients cannot read 100: no interim answer.
    let mut mem = Memory::sending(b"GET /a.txt HTTP/1.0\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\nx");
    f.serve(&mut mem).await;
    assert_eq!(statuses(&replies(&mem.output, &[])), [200]);
}

#[tokio::test]
async fn a_body_cut_short_ends_the_connection() {
    let f = fixture();
    let mut mem = Memory::sending(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc");
    assert!(matches!(f.serve(&mut mem).await, End::Truncated));
    assert!(mem.output.is_empty());
    let mut mem =
        Memory::new([Step::Data(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n".to_vec()), Step::Timeout]);
    assert!(matches!(f.serve(&mut mem).await, End::Error(MemError::Timeout)));
}

#[tokio::test]
async fn timeouts() {
    let f = fixture();
    // Idle between requests: the connection ends quietly.
    let mut mem = Memory::new([Step::Timeout]);
    assert!(matches!(f.serve(&mut mem).await, End::Timeout));
    assert!(mem.output.is_empty());
    let mut mem = Memory::new([Step::Data(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()), Step::Timeout]);
    assert!(matches!(f.serve(&mut mem).await, End::Timeout));
    assert_eq!(statuses(&replies(&mem.output, &[])), [200]);
    // A head begun and not finished in time: 408.
    let mut mem = Memory::new([Step::Data(b"GET /a.txt HTTP/1.1\r\n".to_vec()), Step::Timeout]);
    assert!(matches!(f.serve(&mut mem).await, End::Timeout));
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [408]);
    assert_eq!(r[0].header("Connection"), Some("close"));
    let mut mem = Memory::new([Step::Data(b"HEAD /a.txt HTTP/1.1\r\n".to_vec()), Step::Timeout]);
    f.serve(&mut mem).await;
    assert!(mem.output.ends_with(b"\r\n\r\n"), "no body for a HEAD: {}", mem.output_text());
}

#[tokio::test]
async fn transport_failures_are_handed_back() {
    let f = fixture();
    let mut mem = Memory::new([Step::Fail]);
    assert!(matches!(f.serve(&mut mem).await, End::Error(MemError::Broken)));
    let mut mem = Memory::new([Step::Data(b"GET /a.txt HTTP/1.1\r\n".to_vec()), Step::Fail]);
    assert!(matches!(f.serve(&mut mem).await, End::Error(MemError::Broken)));
    assert!(mem.output.is_empty());
    // A send that fails: error, or timeout for a client that stopped reading.
    for (e, want_timeout) in [(MemError::Broken, false), (MemError::Timeout, true)] {
        let mut mem = Memory::sending(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n");
        mem.fail_sends = Some((0, e));
        let end = f.serve(&mut mem).await;
        assert_eq!(matches!(end, End::Timeout), want_timeout, "{end:?}");
        assert_eq!(matches!(end, End::Error(MemError::Broken)), !want_timeout, "{end:?}");
        assert!(!mem.lingered, "an incomplete response is not closed gracefully");
    }
    // The 100 Continue cannot be sent.
    let mut mem = Memory::sending(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n");
    mem.fail_sends = Some((0, MemError::Broken));
    assert!(matches!(f.serve(&mut mem).await, End::Error(MemError::Broken)));
}

#[tokio::test]
async fn shutdown() {
    let f = fixture();
    // An idle connection ends at once.
    let (tx, rx) = watch::channel(false);
    let mut mem = Memory::new([Step::Silence]);
    let serving = f.serve_until(&mut mem, rx);
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(serving, async { tx.send(true).unwrap() }).0
    })
    .await
    .expect("shutdown ends an idle connection");
    assert!(matches!(end, End::Done));
    // A request read as shutdown begins is answered, with Connection: close.
    let (tx, rx) = watch::channel(false);
    let mut mem = Memory::new([Step::DataThenShutdown(
        b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
    )]);
    mem.shutdown = Some(tx);
    f.serve_until(&mut mem, rx).await;
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [200]);
    assert_eq!(r[0].header("Connection"), Some("close"));
    assert!(mem.lingered);
}

/// A keep-alive connection waiting between requests when it is retired: a request
/// that arrives as the signal comes is answered, with `Connection: close`; with
/// nothing received the connection ends.
#[tokio::test]
async fn shutdown_between_requests_answers_a_request_arriving_with_it() {
    let f = fixture();
    let get = b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n";
    for (then, want) in [(Some(get), vec![200, 200]), (None, vec![200])] {
        let (tx, rx) = watch::channel(false);
        // The wait for the second request sees nothing; the look after the signal sees `then`.
        let script = [Step::Data(get.to_vec()), Step::Silence].into_iter().chain(then.map(|b| Step::Data(b.to_vec())));
        let mut mem = Memory::new(script.chain([Step::Silence]));
        let serving = f.serve_until(&mut mem, rx);
        let signal = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.send_replace(true);
        };
        let end = tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(serving, signal).0 })
            .await
            .expect("shutdown ends the connection");
        assert!(matches!(end, End::Done), "{end:?}");
        let r = replies(&mem.output, &[]);
        assert_eq!(statuses(&r), want);
        assert_eq!(r[0].header("Connection"), None, "the first answer keeps the connection");
        if want.len() == 2 {
            assert_eq!(r[1].header("Connection"), Some("close"));
        }
    }
}

#[tokio::test]
async fn hsts_is_on_every_response() {
    let mut f = fixture();
    f.hsts = Some("max-age=60".into());
    for (input, want) in [
        ("GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n", 200),
        ("GET /digits.txt HTTP/1.1\r\nHost: x\r\nRange: bytes=1-2\r\n\r\n", 206),
        ("GET /digits.txt HTTP/1.1\r\nHost: x\r\nRange: bytes=20-\r\n\r\n", 416),
        ("GET /d HTTP/1.1\r\nHost: x\r\n\r\n", 301),
        ("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        ("DELETE / HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        ("GET / HTTP/1.1\r\n\r\n", 400),
        ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n", 413),
        ("PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n", 405),
    ] {
        let mut mem = Memory::sending(input.as_bytes());
        f.serve(&mut mem).await;
        let r = replies(&mem.output, &[]);
        assert_eq!(statuses(&r), [want], "{input:?}");
        assert_eq!(r[0].header("Strict-Transport-Security"), Some("max-age=60"), "{input:?}");
    }
    // A 304 too; its ETag comes from the 200.
    let mut mem = Memory::sending(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n");
    f.serve(&mut mem).await;
    let etag = replies(&mem.output, &[])[0].header("ETag").unwrap().to_string();
    let mut mem =
        Memory::sending(format!("GET /a.txt HTTP/1.1\r\nHost: x\r\nIf-None-Match: {etag}\r\n\r\n").as_bytes());
    f.serve(&mut mem).await;
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [304]);
    assert_eq!(r[0].header("Strict-Transport-Security"), Some("max-age=60"));
    assert_eq!(r[0].header("Content-Length"), None);
}

#[tokio::test]
async fn ranges_send_exact_bytes() {
    let f = fixture();
    let mut mem = Memory::sending(
        b"GET /digits.txt HTTP/1.1\r\nHost: x\r\nRange: bytes=2-4\r\n\r\nGET /digits.txt HTTP/1.1\r\nHost: x\r\nRange: bytes=-3\r\n\r\nGET /empty.txt HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    f.serve(&mut mem).await;
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [206, 206, 200]);
    assert_eq!((r[0].body.as_slice(), r[0].header("Content-Range")), (&b"234"[..], Some("bytes 2-4/10")));
    assert_eq!((r[1].body.as_slice(), r[1].header("Content-Range")), (&b"789"[..], Some("bytes 7-9/10")));
    assert_eq!((r[2].body.len(), r[2].header("Content-Length")), (0, Some("0")));
}

#[tokio::test]
async fn redirects_keep_the_query() {
    let f = fixture();
    let mut mem = Memory::sending(b"GET /d?x=1&y HTTP/1.1\r\nHost: x\r\n\r\nGET /d/ HTTP/1.1\r\nHost: x\r\n\r\n");
    f.serve(&mut mem).await;
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [301, 200]);
    assert_eq!(r[0].header("Location"), Some("/d/?x=1&y"));
    assert_eq!(r[1].body, b"<p>index</p>");
}

#[tokio::test]
async fn heads_up_to_the_limit_are_served() {
    let f = fixture();
    let max = f.settings.max_head_bytes;
    let line = |target_len: usize| format!("GET /a.txt?{} HTTP/1.1\r\nHost: x\r\n\r\n", "q".repeat(target_len));
    let fits = line(max - line(0).len());
    assert_eq!(fits.len(), max);
    let mut mem = Memory::sending(fits.as_bytes());
    f.serve(&mut mem).await;
    assert_eq!(statuses(&replies(&mem.output, &[])), [200]);
    let mut mem = Memory::sending(line(max - line(0).len() + 1).as_bytes());
    f.serve(&mut mem).await;
    assert_eq!(statuses(&replies(&mem.output, &[])), [431], "the line fitted, the head did not");
    // Headers just under the limit.
    let filler = format!("X-Filler: {}\r\n", "v".repeat(max - 60));
    let req = format!("GET /a.txt HTTP/1.1\r\nHost: x\r\n{filler}\r\n");
    assert!(req.len() < max);
    let mut mem = Memory::sending(req.as_bytes());
    f.serve(&mut mem).await;
    assert_eq!(statuses(&replies(&mem.output, &[])), [200]);
}

#[tokio::test]
async fn targets_and_methods() {
    let f = fixture();
    for (input, want, body) in [
        ("GET https://localhost/a.txt HTTP/1.1\r\nHost: localhost\r\n\r\n", 200, Some(A_TXT)),
        ("GET /a.txt?v=1&x=%2e%2e HTTP/1.1\r\nHost: x\r\n\r\n", 200, Some(A_TXT)),
        ("GET /a.txt#frag HTTP/1.1\r\nHost: x\r\n\r\n", 200, Some(A_TXT)),
        ("GET a.txt HTTP/1.1\r\nHost: x\r\n\r\n", 400, None),
        ("GET /a.txt/below HTTP/1.1\r\nHost: x\r\n\r\n", 404, None),
        ("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 403, None),
        ("DELETE /a.txt HTTP/1.1\r\nHost: x\r\n\r\n", 405, None),
        ("BREW /a.txt HTTP/1.1\r\nHost: x\r\n\r\n", 405, None),
    ] {
        // Each answer keeps the connection: the request behind it is answered too.
        let mut mem = Memory::sending(format!("{input}GET /digits.txt HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
        f.serve(&mut mem).await;
        let r = replies(&mem.output, &[]);
        assert_eq!(statuses(&r), [want, 200], "{input:?}");
        if let Some(b) = body {
            assert_eq!(r[0].body, b, "{input:?}");
        }
        assert_eq!(r[1].body, DIGITS);
    }
    assert_eq!(std::fs::read(f._dir.path().join("a.txt")).unwrap(), A_TXT, "DELETE deleted nothing");
}

#[tokio::test]
async fn not_modified_keeps_the_connection() {
    let f = fixture();
    let mut mem = Memory::sending(b"HEAD /a.txt HTTP/1.1\r\nHost: x\r\n\r\n");
    f.serve(&mut mem).await;
    let etag = replies(&mem.output, &[true])[0].header("ETag").unwrap().to_string();
    let mut mem = Memory::sending(
        format!("GET /a.txt HTTP/1.1\r\nHost: x\r\nIf-None-Match: {etag}\r\n\r\nGET /a.txt HTTP/1.1\r\nHost: x\r\nIf-Match: \"x\"\r\n\r\nGET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    );
    f.serve(&mut mem).await;
    let r = replies(&mem.output, &[]);
    assert_eq!(statuses(&r), [304, 412, 200]);
    assert!(r[0].body.is_empty());
    assert_eq!(r[0].header("ETag"), Some(etag.as_str()));
}

#[tokio::test]
async fn every_request_is_logged() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let log = AccessLog::new(Some(std::sync::Arc::new(std::fs::File::create(&path).unwrap())));
    let (_tx, rx) = watch::channel(false);
    let mut mem = Memory::sending(
        b"GET /digits.txt HTTP/1.1\r\nHost: x\r\n\r\nHEAD /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /nope?q HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/9.9\r\n\r\n",
    );
    serve(&mut mem, f.context(&log, rx)).await;
    log.flush();
    let text = std::fs::read_to_string(&path).unwrap();
    let got: Vec<String> = text
        .lines()
        .map(|l| {
            // `IP - - [time] "request" status bytes rt=.. tls=..` without the time and rt.
            let (ip, rest) = l.split_once(" - - [").unwrap();
            let rest = &rest[rest.find("] ").unwrap() + 2..];
            let (before_rt, after_rt) = rest.split_once(" rt=").unwrap();
            let label = after_rt.split_once(' ').unwrap().1;
            format!("{ip} {before_rt} {label}")
        })
        .collect();
    // Error pages count their body, as nginx's $body_bytes_sent does.
    let page = |s: u16| match crate::handler::Response::page(crate::handler::Status(s)).body {
        crate::handler::Body::Bytes(b) => b.len(),
        _ => 0,
    };
    assert!(page(404) > 0 && page(505) > 0);
    assert_eq!(
        got,
        [
            "192.0.2.7 \"GET /digits.txt HTTP/1.1\" 200 10 tls=userspace".to_string(),
            "192.0.2.7 \"HEAD /a.txt HTTP/1.0\" 200 0 tls=userspace".to_string(),
            format!("192.0.2.7 \"GET /nope?q HTTP/1.1\" 404 {} tls=userspace", page(404)),
            format!("192.0.2.7 \"-\" 505 {} tls=userspace", page(505)),
        ]
    );
}

#[tokio::test]
async fn small_details_of_the_head() {
    let f = fixture();
    for (input, want) in [
        // Empty lines before a request line are tolerated (RFC 9112 section 2.2).
        ("\r\nGET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n", 200),
        // HTTP/1.0 needs no Host, and may send an empty one.
        ("GET /a.txt HTTP/1.0\r\nHost:\r\n\r\n", 200),
        // Methods are case-sensitive.
        ("get /a.txt HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        // Minor versions above 1 are read as 1.1.
        ("GET /a.txt HTTP/1.7\r\nHost: x\r\n\r\n", 200),
        ("GET /a.txt HTTP/1.1\r\nhost: x\r\nRANGE: bytes=0-0\r\n\r\n", 206),
    ] {
        let mut mem = Memory::sending(input.as_bytes());
        f.serve(&mut mem).await;
        assert_eq!(statuses(&replies(&mem.output, &[])), [want], "{input:?}");
    }
}

#[tokio::test]
async fn shutdown_does_not_cut_a_head_under_way() {
    let f = fixture();
    let (tx, rx) = watch::channel(false);
    let mut mem = Memory::new([
        Step::Data(b"GET /a.txt HT".to_vec()),
        Step::DataThenShutdown(b"TP/1.1\r\nHost: x\r\n\r\n".to_vec()),
    ]);
    mem.shutdown = Some(tx);
    let end = f.serve_until(&mut mem, rx).await;
    assert!(matches!(end, End::Done));
    let r = replies(&mem.output, &[]);
    assert_eq!((statuses(&r), r[0].header("Connection")), (vec![200], Some("close")));
}

#[tokio::test]
async fn head_of_a_range_has_no_body() {
    let f = fixture();
    let mut mem = Memory::sending(
        b"HEAD /digits.txt HTTP/1.1\r\nHost: x\r\nRange: bytes=2-4\r\n\r\nGET /digits.txt HTTP/1.1\r\nHost: x\r\nRange: bytes=2-4\r\n\r\n",
    );
    f.serve(&mut mem).await;
    let r = replies(&mem.output, &[true, false]);
    assert_eq!(statuses(&r), [206, 206]);
    assert_eq!((r[0].header("Content-Length"), r[0].body.len()), (Some("3"), 0));
    assert_eq!(r[0].header("Content-Range"), r[1].header("Content-Range"));
    assert_eq!(r[1].body, b"234");
}

#[tokio::test]
async fn a_zero_body_limit_refuses_any_body() {
    let mut f = fixture();
    f.settings.max_body_bytes = 0;
    let mut mem = Memory::sending(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx");
    f.serve(&mut mem).await;
    assert_eq!(statuses(&replies(&mem.output, &[])), [413]);
    let mut mem = Memory::sending(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    f.serve(&mut mem).await;
    assert_eq!(statuses(&replies(&mem.output, &[])), [200]);
}

#[tokio::test]
async fn a_send_that_fails_later_ends_the_connection() {
    let f = fixture();
    let mut mem = Memory::sending(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /digits.txt HTTP/1.1\r\nHost: x\r\n\r\n");
    mem.fail_sends = Some((1, MemError::Broken));
    assert!(matches!(f.serve(&mut mem).await, End::Error(MemError::Broken)));
    assert_eq!(statuses(&replies(&mem.output, &[])), [200], "the first answer went out whole");
    assert!(!mem.lingered);
}

// ---- the states one by one ----

impl Fixture {
    fn context<'a>(&'a self, log: &'a AccessLog, shutdown: watch::Receiver<bool>) -> Context<'a, Settings> {
        let peer: SocketAddr = "192.0.2.7:4000".parse().unwrap();
        Context { peer, settings: &self.settings, sites: Sites::single(self.site()), log, shutdown, alt_svc: None }
    }
}

/// Each transition on its own: two pipelined requests go head -> body -> answer
/// -> head -> body -> answer -> closed, the second asking to close.
#[tokio::test]
async fn each_state_leads_to_the_next() {
    let f = fixture();
    let (log, (_tx, rx)) = (AccessLog::new(None), watch::channel(false));
    let mut mem = Memory::sending(
        b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\nHEAD /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let mut c = Connection::new(&mut mem, f.context(&log, rx));
    let stop = std::future::pending::<()>();
    tokio::pin!(stop);
    for (target, keep_alive) in [("/a.txt", true), ("/a.txt", false)] {
        let State::Body(x) = c.read_head(stop.as_mut()).await else { panic!("a whole head") };
        assert_eq!((x.head.target.as_str(), x.keep_alive), (target, keep_alive));
        let lookups = crate::handler::pipeline::count::site_lookups();
        let State::Answer(x, response) = c.read_body(x).await else { panic!("no body to read") };
        assert_eq!(crate::handler::pipeline::count::site_lookups(), lookups + 1, "one site lookup per request");
        match c.answer(x, response).await {
            State::Head => assert!(keep_alive),
            State::Closed(End::Done) => assert!(!keep_alive),
            _ => panic!("an answer sent leads to the next head or the end"),
        }
    }
    let r = replies(&mem.output, &[false, true]);
    assert_eq!(statuses(&r), [200, 200]);
    assert!(mem.lingered, "a closing answer drains the client's input");
}

/// A head whose body is over the limit never reaches the answer state.
#[tokio::test]
async fn a_body_over_the_limit_closes_from_the_body_state() {
    let f = fixture();
    let (log, (_tx, rx)) = (AccessLog::new(None), watch::channel(false));
    let mut mem = Memory::sending(b"PUT /a.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n");
    let mut c = Connection::new(&mut mem, f.context(&log, rx));
    let stop = std::future::pending::<()>();
    tokio::pin!(stop);
    let State::Body(x) = c.read_head(stop.as_mut()).await else { panic!("a whole head") };
    assert!(matches!(c.read_body(x).await, State::Closed(End::Done)));
    assert_eq!(statuses(&replies(&mem.output, &[])), [413]);
}
