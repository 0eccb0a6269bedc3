//! The plain-HTTP listener (`http_listen`, typically port 80): every request gets
//! `301 Moved Permanently` to the same host, path and query over HTTPS, except ACME
//! HTTP-01 challenges (`GET /.well-known/acme-challenge/TOKEN`), answered from the
//! `.well-known/acme-challenge/` of the root of the site the Host names (certbot's
//! `--webroot -w SITE_ROOT` layout). Every answer is logged in the access log (with
//! `tls=none`) and counted (`ktlsd_plain_http_requests_total`).
//!
//! It runs on a thread of its own with one single-threaded event loop: port-80
//! traffic is a trickle of redirects and challenges, so it needs no share of the
//! workers, and the HTTPS workers' loops stay untouched by it. Each connection is
//! a task, so a slow client holds only its own task. One request per connection,
//! always closed after the answer (`Connection: close`), the head bounded by
//! [`MAX_HEAD`] bytes and the header timeout.

use std::io::Read;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::LocalSet;

use super::{Current, Shared};
use crate::acme::Challenges;
use crate::files::Root;
use crate::handler::sites::Pick;
use crate::handler::{Body, Header, Method, Response, Status};
use crate::http::h1::parse::{self, Head, Version};
use crate::http::h1::write;
use crate::log::{AccessEntry, AccessLog, RequestLine};
use crate::net;
use crate::stats::Metrics;
use crate::vocab::RecordLayer;

/// Largest request head on the plain listener: a redirect needs only the request
/// line and Host.
pub const MAX_HEAD: usize = 8 * 1024;

/// URL path of ACME HTTP-01 challenges (RFC 8555 section 8.3).
const ACME_PREFIX: &str = crate::acme::HTTP01_PATH_PREFIX;

/// Longest challenge token accepted (ACME tokens are 43 characters).
const MAX_TOKEN: usize = 256;

/// Largest challenge file served (a key authorization is under 200 bytes).
const MAX_CHALLENGE_FILE: u64 = 16 * 1024;

/// How long, and how much, is read and discarded after the answer before closing,
/// so that unread request bytes do not make the kernel reset the connection and
/// destroy the answer before the client has read it.
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 * 1024;

/// What the plain listener redirects to and serves from; read per connection, so
/// a reload (ROOT, timeouts) applies to the next connection.
pub struct Target {
    /// The HTTPS port redirects name (omitted from the URL when 443).
    pub https_port: u16,
}

/// Starts the plain listener thread over `listeners` (already bound). It stops
/// accepting when `stop` turns true; connections under way are dropped then
/// (each is a single small answer).
pub fn spawn(
    listeners: Vec<StdListener>,
    target: Target,
    current: watch::Receiver<Current>,
    stop: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) -> anyhow::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ktlsd-http".into())
        .spawn(move || run(listeners, Arc::new(target), current, stop, metrics))
        .context("cannot start the plain-HTTP listener thread")
}

fn run(
    listeners: Vec<StdListener>,
    target: Arc<Target>,
    current: watch::Receiver<Current>,
    mut stop: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("the plain-HTTP listener cannot start its event loop: {e}");
            return;
        }
    };
    let log = std::rc::Rc::new(AccessLog::new(current.borrow().log.clone()).plain_http().counting(metrics));
    LocalSet::new().block_on(&rt, async move {
        for l in listeners {
            match TcpListener::from_std(l) {
                Ok(l) => {
                    tokio::task::spawn_local(accept_loop(l, target.clone(), current.clone(), log.clone()));
                }
                Err(e) => tracing::error!("the plain-HTTP listener cannot use its socket: {e}"),
            }
        }
        let _ = stop.wait_for(|s| *s).await;
    });
}

async fn accept_loop(
    listener: TcpListener,
    target: Arc<Target>,
    current: watch::Receiver<Current>,
    log: std::rc::Rc<AccessLog>,
) {
    let pauses = crate::log::RateLimit::new(1);
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Current { shared, log: out, site_logs, .. } = current.borrow().clone();
                log.switch_sites(&site_logs);
                log.set_format(shared.config.access_log_format);
                log.set_custom(shared.config.access_log_custom.clone());
                log.switch(out);
                let (target, log) = (target.clone(), log.clone());
                tokio::task::spawn_local(async move { connection(stream, peer, &shared, &target, &log).await });
            }
            Err(e) => {
                // EMFILE/ENFILE and friends: back off as the workers do, logged once a second at most.
                let pause = match crate::fds::is_exhaustion(&e) {
                    true => super::worker::ACCEPT_PAUSE,
                    false => Duration::from_millis(100),
                };
                if pauses.check(Instant::now()).0 {
                    tracing::warn!("plain-HTTP accept failed: {e}; accepting again in {} ms", pause.as_millis());
                }
                tokio::time::sleep(pause).await;
            }
        }
    }
}

async fn connection(stream: TcpStream, peer: SocketAddr, shared: &Shared, target: &Target, log: &AccessLog) {
    let cfg = &shared.config;
    let balancer = peer;
    let peer = match super::proxy_protocol::covers(&cfg.proxy_protocol_from, peer.ip()) {
        false => peer,
        true => match super::proxy_protocol::read_header(&stream, peer, cfg.timeouts.header).await {
            Ok(client) => client,
            Err(e) => {
                crate::log::refusal(400, "PROXY protocol", || {
                    format!("plain-HTTP connection from the load balancer {balancer} closed: {e}")
                });
                return;
            }
        },
    };
    let started = Instant::now();
    let deadline = started + cfg.timeouts.header;
    let mut buf = vec![0u8; MAX_HEAD];
    let mut len = 0;
    let parsed = loop {
        if balancer == peer && crate::net::begins_with_proxy_header(&buf[..len]) {
            crate::log::refusal(400, "PROXY protocol", || {
                format!("plain-HTTP connection from {peer} closed: a PROXY protocol header, and its address is not in proxy_protocol_from")
            });
            return;
        }
        match parse::parse(&buf[..len], MAX_HEAD) {
            Ok(Some((req, _))) => break Ok(req),
            Ok(None) => {}
            Err(bad) => break Err((bad.status, bad.reason)),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match net::read_some(&stream, &mut buf[len..], left).await {
            Ok(0) => return,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut && len > 0 => {
                break Err((Status::REQUEST_TIMEOUT, "request head not received in time"))
            }
            Err(_) => return,
        }
    };
    let (response, version) = match &parsed {
        Ok(head) => {
            let root = match shared.sites().pick(head.request.authority.as_deref()) {
                Pick::Site(site) => site.root,
                Pick::Misdirected => &shared.root,
            };
            (answer(head, root, &shared.challenges, target, peer), head.version)
        }
        Err((status, why)) => {
            crate::log::refusal(status.0, why, || {
                format!("refused plain-HTTP request from {peer}: {} {why}", status.0)
            });
            let page = Response::page(*status);
            (if parse::is_head(&buf[..len]) { page.without_body() } else { page }, Version::Http11)
        }
    };
    let body = match &response.body {
        Body::Bytes(b) => b.len() as u64,
        _ => 0,
    };
    let bytes = write::head_and_bytes(&response, version, false);
    let ttfb = started.elapsed();
    let written = net::write_all(&stream, &bytes, cfg.timeouts.send).await;
    let head = parsed.as_ref().ok();
    let host = head.and_then(|h| h.request.authority.as_deref());
    log.write(&AccessEntry {
        peer,
        request: head.map(|h| RequestLine {
            method: &h.request.method,
            target: &h.target,
            version: h.version.as_str(),
        }),
        status: response.status.0,
        bytes: if written.is_ok() { body } else { 0 },
        started,
        ttfb,
        layer: RecordLayer::Userspace,
        body: (body > 0 && written.is_ok()).then_some(crate::vocab::BodyPath::Copy),
        referer: head.and_then(|h| h.referer.as_deref()),
        user_agent: head.and_then(|h| h.user_agent.as_deref()),
        tls: None,
        host,
        site: &shared.sites().label(host),
        client_subject: None,
        notes: head.map(|h| &h.request.notes),
    });
    // Port-80 traffic is a trickle: each line is written at once.
    log.flush();
    if written.is_ok() {
        net::linger(&stream, LINGER_TIME, LINGER_TIME, LINGER_BYTES).await;
    }
}

/// The answer to one parsed request: a challenge file from `root` (the root of
/// the site the Host names), 404, 400 for a missing or invalid Host, or the redirect.
fn answer(head: &Head, root: &Root, challenges: &Challenges, target: &Target, peer: SocketAddr) -> Response {
    let req = &head.request;
    let head_only = req.method == Method::Head;
    let response = if let Some(token) = req.path.strip_prefix(ACME_PREFIX).filter(|_| req.method.is_served()) {
        // ktlsd's own ACME orders first, then files put in the site's root by another client.
        match challenges.http01(token) {
            Some(key_authorization) => {
                tracing::info!("ACME challenge {token} answered for {peer}");
                let body = key_authorization.into_bytes();
                Response {
                    status: Status::OK,
                    headers: vec![
                        Header::ContentType("application/octet-stream".into()),
                        Header::ContentLength(body.len() as u64),
                    ],
                    body: Body::Bytes(body),
                    refused: None,
                }
            }
            None => challenge(token, root, peer),
        }
    } else if let Some(host) = req.authority.as_deref() {
        let location = redirect_location(host, target.https_port, &req.path, req.query.as_deref());
        Response::page(Status::MOVED_PERMANENTLY).with(Header::Location(location))
    } else {
        crate::log::refusal(400, "no Host to redirect to", || {
            format!(
                "refused plain-HTTP request from {peer} \"{} {} {}\": 400 no Host to redirect to",
                req.method,
                head.target,
                head.version.as_str()
            )
        });
        Response::page(Status::BAD_REQUEST)
    };
    if head_only {
        response.without_body()
    } else {
        response
    }
}

/// `https://HOST[:PORT]PATH[?QUERY]`: the Host's name without its (plain-HTTP)
/// port, the HTTPS port unless it is 443, and the path and query as received
/// (still percent-encoded, already checked by the request parser).
pub fn redirect_location(host: &str, https_port: u16, path: &str, query: Option<&str>) -> String {
    let name = match host.strip_prefix('[') {
        Some(rest) => &host[..rest.find(']').map_or(host.len(), |i| i + 2)],
        None => host.split(':').next().unwrap_or(host),
    };
    let mut url = format!("https://{name}");
    if https_port != 443 {
        url.push_str(&format!(":{https_port}"));
    }
    url.push_str(path);
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    url
}

/// Whether `token` can be an ACME challenge token: base64url characters only
/// (RFC 8555 section 8.3), so it names one file in the challenge directory.
pub fn valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= MAX_TOKEN
        && token.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Serves ROOT/.well-known/acme-challenge/TOKEN as text/plain, or 404.
fn challenge(token: &str, root: &Root, peer: SocketAddr) -> Response {
    let not_found = |why: &str| {
        tracing::info!("ACME challenge for {peer} not served: 404 {why}");
        Response::page(Status::NOT_FOUND)
    };
    if !valid_token(token) {
        return not_found("token is not base64url");
    }
    let rel = Path::new(".well-known/acme-challenge").join(token);
    let (mut file, meta) = match root.open(&rel) {
        Ok(f) => f,
        Err(r) => return not_found(&r.reason()),
    };
    if !meta.is_file() || meta.len() > MAX_CHALLENGE_FILE {
        return not_found("not a regular file of at most 16 KiB");
    }
    let mut body = Vec::with_capacity(meta.len() as usize);
    if let Err(e) = (&mut file).take(MAX_CHALLENGE_FILE).read_to_end(&mut body) {
        return not_found(&format!("cannot read it: {e}"));
    }
    tracing::info!("ACME challenge {token} served to {peer}");
    Response {
        status: Status::OK,
        headers: vec![Header::ContentType("text/plain".into()), Header::ContentLength(body.len() as u64)],
        body: Body::Bytes(body),
        refused: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        for (host, port, path, query, want) in [
            ("example.com", 443, "/", None, "https://example.com/"),
            ("example.com:80", 443, "/a/b", Some("x=1&y"), "https://example.com/a/b?x=1&y"),
            ("example.com:8080", 8443, "/a%20b", None, "https://example.com:8443/a%20b"),
            ("[::1]:80", 8443, "/", Some(""), "https://[::1]:8443/?"),
            ("[2001:db8::1]", 443, "//x", None, "https://[2001:db8::1]//x"),
            ("127.0.0.1", 443, "/", None, "https://127.0.0.1/"),
        ] {
            assert_eq!(redirect_location(host, port, path, query), want, "{host} {port} {path} {query:?}");
        }
    }

    /// The whole answer to `request` from a ROOT holding one challenge file.
    fn answer_to(request: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".well-known/acme-challenge")).unwrap();
        std::fs::write(dir.path().join(".well-known/acme-challenge/tok_en-1"), b"tok_en-1.key").unwrap();
        std::fs::write(dir.path().join(".well-known/acme-challenge/big"), vec![b'x'; 16 * 1024 + 1]).unwrap();
        let root = Root::new(dir.path()).unwrap();
        let (head, _) = parse::parse(request.as_bytes(), MAX_HEAD).unwrap().unwrap();
        let peer: SocketAddr = "192.0.2.9:80".parse().unwrap();
        let response = answer(&head, &root, &Challenges::default(), &Target { https_port: 8443 }, peer);
        String::from_utf8(write::head_and_bytes(&response, head.version, false)).unwrap()
    }

    #[test]
    fn answers() {
        for (request, status_line, has, body) in [
            ("GET /a?b HTTP/1.1\r\nHost: h:80\r\n\r\n", "HTTP/1.1 301 ", "\r\nLocation: https://h:8443/a?b\r\n", true),
            ("HEAD /a HTTP/1.1\r\nHost: h\r\n\r\n", "HTTP/1.1 301 ", "\r\nLocation: https://h:8443/a\r\n", false),
            (
                "POST /.well-known/acme-challenge/tok_en-1 HTTP/1.1\r\nHost: h\r\n\r\n",
                "HTTP/1.1 301 ",
                "Location: https://h:8443/.well-known/acme-challenge/tok_en-1\r\n",
                true,
            ),
            ("GET / HTTP/1.0\r\n\r\n", "HTTP/1.1 400 ", "\r\nConnection: close\r\n", true),
            (
                "GET /.well-known/acme-challenge/tok_en-1 HTTP/1.1\r\nHost: h\r\n\r\n",
                "HTTP/1.1 200 ",
                "\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n",
                true,
            ),
            (
                "HEAD /.well-known/acme-challenge/tok_en-1 HTTP/1.1\r\nHost: h\r\n\r\n",
                "HTTP/1.1 200 ",
                "Content-Length: 12\r\n",
                false,
            ),
            ("GET /.well-known/acme-challenge/nope HTTP/1.1\r\nHost: h\r\n\r\n", "HTTP/1.1 404 ", "", true),
            ("GET /.well-known/acme-challenge/big HTTP/1.1\r\nHost: h\r\n\r\n", "HTTP/1.1 404 ", "", true),
            ("GET /.well-known/acme-challenge/a%2Fb HTTP/1.1\r\nHost: h\r\n\r\n", "HTTP/1.1 404 ", "", true),
        ] {
            let out = answer_to(request);
            assert!(out.starts_with(status_line), "{request:?}: {out}");
            assert!(out.contains(has), "{request:?}: {out}");
            assert!(out.contains("\r\nConnection: close\r\n\r\n"), "{request:?}: {out}");
            let after_head = &out[out.find("\r\n\r\n").unwrap() + 4..];
            assert_eq!(!after_head.is_empty(), body, "{request:?}: {out}");
            if status_line == "HTTP/1.1 200 " && body {
                assert_eq!(after_head, "tok_en-1.key");
            }
        }
    }

    #[test]
    fn tokens() {
        assert!(valid_token("LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0"));
        assert!(valid_token("a-b_C9"));
        for bad in ["", "..", "a.b", "a/b", "a%2Fb", "a b", "a+b", "a=", &"a".repeat(257)] {
            assert!(!valid_token(bad), "{bad:?}");
        }
    }
}
