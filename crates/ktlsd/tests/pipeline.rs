//! One request pipeline for every protocol: the same cases sent over HTTP/1.1 and
//! HTTP/2 (curl) and HTTP/3 (`tests/h3/client.py`, aioquic) to one server in front
//! of the Python origin get the same status, the same upstream traffic and the same
//! log: paths that resolve outside a `[[proxy]]` rule are not forwarded (and what is
//! forwarded is the normalised path), guards answer before the body's limit, a
//! request for a site that asks for client certificates on a handshake made for
//! another is misdirected (421) and never forwarded, proxied answers go to the
//! site's own access log, and a compressible file is compressed on its first answer;
//! the location tree holds for every protocol too: a `[[headers]]` rule puts its
//! fields on proxied answers, `[[location]]` blocks give a path its own rate limit
//! (static files beside it never limited) and its own body limit, and `/api/*`
//! takes any depth. `ktlsd check` names the pattern whose meaning changed.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    H1,
    H2,
    H3,
}

const PROTOCOLS: [Proto; 3] = [Proto::H1, Proto::H2, Proto::H3];

/// One request: method, path (sent as it is), the handshake's server name, the
/// Host, extra fields and a body.
struct Ask<'a> {
    method: &'a str,
    path: &'a str,
    sni: &'a str,
    host: &'a str,
    fields: &'a [(&'a str, &'a str)],
    body: Option<&'a str>,
}

impl Default for Ask<'_> {
    fn default() -> Self {
        Ask { method: "GET", path: "/", sni: "open.test", host: "open.test", fields: &[], body: None }
    }
}

/// The answer: status and fields (names lowercase).
#[derive(Debug)]
struct Got {
    status: u16,
    fields: Vec<(String, String)>,
}

impl Got {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

fn ask(srv: &Server, proto: Proto, a: &Ask<'_>) -> Got {
    match proto {
        Proto::H1 | Proto::H2 => {
            let port = srv.port();
            let resolve = format!("{}:{port}:127.0.0.1", a.sni);
            let url = format!("https://{}:{port}{}", a.sni, a.path);
            let host = format!("Host: {}", a.host);
            let flag = if proto == Proto::H1 { "--http1.1" } else { "--http2" };
            let mut args = vec![flag, "--path-as-is", "-sk", "-o", "/dev/null", "-D", "-", "--resolve", &resolve];
            args.extend(["-H", host.as_str(), "-X", a.method]);
            let fields: Vec<String> = a.fields.iter().map(|(n, v)| format!("{n}: {v}")).collect();
            for f in &fields {
                args.extend(["-H", f.as_str()]);
            }
            if let Some(body) = a.body {
                args.extend(["--data-binary", body]);
            }
            args.push(&url);
            let out = curl(&args);
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let (_, status, fields) = parse_head(text.trim_end());
            Got { status, fields: fields.into_iter().map(|(n, v)| (n.to_ascii_lowercase(), v)).collect() }
        }
        Proto::H3 => {
            let mut req = serde_json::json!({
                "path": a.path,
                "method": a.method,
                "authority": a.host,
                "headers": a.fields.iter().map(|(n, v)| [n.to_ascii_lowercase(), v.to_string()]).collect::<Vec<_>>(),
            });
            if let Some(body) = a.body {
                req["body"] = body.into();
            }
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3/client.py");
            let out = run_with_timeout(
                Command::new("/usr/bin/python3")
                    .arg(&script)
                    .args(["127.0.0.1", &srv.port().to_string(), "--sni", a.sni, "requests"])
                    .arg(serde_json::json!([req]).to_string()),
                None,
                Duration::from_secs(60),
            );
            let text = String::from_utf8_lossy(&out.stdout);
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("client output {text:?}: {e}"));
            let r = &v["responses"][0];
            let fields = r["headers"]
                .as_array()
                .map(|hs| {
                    hs.iter().map(|h| (h[0].as_str().unwrap_or("").to_string(), h[1].as_str().unwrap_or("").into()))
                })
                .into_iter()
                .flatten()
                .collect();
            Got { status: r["status"].as_u64().unwrap_or(0) as u16, fields }
        }
    }
}

struct Setup {
    srv: Server,
    origin: Origin,
    /// open.test's own access log.
    open_log: std::path::PathBuf,
}

/// Sites secure.test (client certificates required) and open.test (its own access
/// log), both proxying `/api/*` to the origin with `X-Frame-Options: DENY` on its
/// answers, `/api/secret/*` behind basic auth, `/api/limited/H1/*` (H2, H3) at one
/// request a minute each, `/api/upload/*` taking bodies of 5000 bytes (the server: 1000), gzip on
/// the fly; HTTP/3 on.
fn setup() -> Setup {
    let origin = Origin::start("a");
    let b = Server::builder(BIN).workers(Some(1)).args(["--http3", "--max-body-bytes", "1000"]);
    let dir = b.dir().to_path_buf();
    let root = dir.join("site");
    let text = "compress me, compress me, compress me. ".repeat(200);
    for name in ["h1.txt", "h2.txt", "h3.txt"] {
        write_file(&root.join(name), text.as_bytes());
    }
    let (ca_pem, _) = client_ca(&dir, "good");
    let users = dir.join("users");
    let out = run_with_timeout(
        Command::new("htpasswd").args(["-nbB", "-C", "5", "alice", "s3cret"]),
        None,
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "htpasswd (apache2-utils) failed");
    std::fs::write(&users, &out.stdout).expect("users");
    let open_log = dir.join("open.log");
    let site = |names: &str, extra: &str| {
        format!(
            "[[site]]\nnames = [{names:?}]\nroot = {root:?}\ncompress = [\"gzip\"]\n{extra}\n\
             [[site.proxy]]\npath = \"/api/*\"\nupstream = [{:?}]\n\
             [[site.auth]]\npath = \"/api/secret/*\"\nusers = {users:?}\n\
             [[site.headers]]\npath = \"/api/*\"\nset = {{ X-Frame-Options = \"DENY\" }}\n\
             [[site.location]]\npath = \"/api/limited/H1/*\"\nrate_limit = {{ requests = 1, per = \"1m\", burst = 1 }}\n\
             [[site.location]]\npath = \"/api/limited/H2/*\"\nrate_limit = {{ requests = 1, per = \"1m\", burst = 1 }}\n\
             [[site.location]]\npath = \"/api/limited/H3/*\"\nrate_limit = {{ requests = 1, per = \"1m\", burst = 1 }}\n\
             [[site.location]]\npath = \"/api/upload/*\"\nmax_body_bytes = 5000\n",
            origin.url()
        )
    };
    let config = format!(
        "{}{}",
        site("secure.test", &format!("client_ca = {ca_pem:?}\nclient_auth = \"require\"")),
        site("open.test", &format!("access_log = {open_log:?}"))
    );
    let srv = b.config(&config).start();
    Setup { srv, origin, open_log }
}

#[test]
fn the_same_cases_get_the_same_answers_over_http1_http2_and_http3() {
    let s = setup();
    for proto in PROTOCOLS {
        // A path that resolves outside the proxied location is not forwarded: it is
        // matched (and served) as the path it resolves to.
        for path in ["/api/../internal", "/api/%2e%2e/internal", "/api/.%2E/internal"] {
            let got = ask(&s.srv, proto, &Ask { path, ..Ask::default() });
            assert_eq!(got.status, 404, "{proto:?} {path}: {got:?}");
        }
        assert!(s.origin.requests().iter().all(|l| !l.contains("internal")), "{proto:?}: {:?}", s.origin.requests());
        // Inside it, what goes upstream is the normalised path.
        let before = s.origin.count("/api/name");
        let got = ask(&s.srv, proto, &Ask { path: "/api/x/%2e%2e/name", ..Ask::default() });
        assert_eq!(got.status, 200, "{proto:?}: {got:?}");
        assert_eq!(s.origin.count("/api/name"), before + 1, "{proto:?}: {:?}", s.origin.requests());
        assert!(s.origin.requests().iter().all(|l| !l.contains("%2e")), "{proto:?}: {:?}", s.origin.requests());

        // The guards answer before the body's limit: 401, not 413, and nothing upstream.
        let big = "x".repeat(2000);
        let fields = [("Content-Type", "text/plain")];
        let a = Ask { method: "POST", path: "/api/secret/echo", fields: &fields, body: Some(&big), ..Ask::default() };
        let got = ask(&s.srv, proto, &a);
        assert_eq!(got.status, 401, "{proto:?}: {got:?}");
        assert!(got.field("www-authenticate").is_some(), "{proto:?}: {got:?}");
        let a = Ask { method: "POST", path: "/api/echo", fields: &fields, body: Some(&big), ..Ask::default() };
        assert_eq!(ask(&s.srv, proto, &a).status, 413, "{proto:?}");
        assert_eq!(s.origin.count("/api/secret/echo") + s.origin.count("/api/echo"), 0, "{proto:?}");

        // A site that asks for client certificates, named on a handshake made for
        // another (or on QUIC, whose handshakes ask for none): 421, nothing forwarded.
        let a = Ask { method: "POST", path: "/api/echo?mis", host: "secure.test", body: Some("hi"), ..Ask::default() };
        assert_eq!(ask(&s.srv, proto, &a).status, 421, "{proto:?}");
        assert_eq!(s.origin.count("/api/echo?mis"), 0, "{proto:?}: a misdirected request reached the origin");

        // A compressible file is compressed on its first answer.
        let path = match proto {
            Proto::H1 => "/h1.txt",
            Proto::H2 => "/h2.txt",
            Proto::H3 => "/h3.txt",
        };
        let got = ask(&s.srv, proto, &Ask { path, fields: &[("Accept-Encoding", "gzip")], ..Ask::default() });
        assert_eq!((got.status, got.field("content-encoding")), (200, Some("gzip")), "{proto:?}: {got:?}");

        // The site's header rule on a proxied answer (the origin's 404 for a path it
        // does not know), any depth under `/api/*`.
        let before = s.origin.count("/api/deep/er/name");
        let got = ask(&s.srv, proto, &Ask { path: "/api/deep/er/name", ..Ask::default() });
        assert_eq!((got.status, got.field("x-frame-options")), (404, Some("DENY")), "{proto:?}: {got:?}");
        assert_eq!(s.origin.count("/api/deep/er/name"), before + 1, "{proto:?}: not forwarded");
        // A location's body limit: 2000 bytes go up there, not elsewhere (413 above).
        let before = s.origin.count("/api/upload/echo");
        let a = Ask { method: "POST", path: "/api/upload/echo", fields: &fields, body: Some(&big), ..Ask::default() };
        assert_eq!(ask(&s.srv, proto, &a).status, 404, "{proto:?}: the origin's answer");
        assert_eq!(s.origin.count("/api/upload/echo"), before + 1, "{proto:?}: not forwarded");
        // A location's rate limit (its own table: a block per protocol, one client):
        // the second request is refused, the static files beside it never are.
        let limited = format!("/api/limited/{proto:?}/x");
        let statuses: Vec<u16> =
            (0..2).map(|_| ask(&s.srv, proto, &Ask { path: &limited, ..Ask::default() }).status).collect();
        assert_eq!(statuses, [404, 429], "{proto:?}: the origin's answer, then the limit");
        for _ in 0..3 {
            assert_eq!(
                ask(&s.srv, proto, &Ask { path, ..Ask::default() }).status,
                200,
                "{proto:?}: a static file limited"
            );
        }
    }
    // Every answer of open.test, proxied ones included, is in its own log, with
    // the protocol it came over; none in the main one.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let read = || std::fs::read_to_string(&s.open_log).unwrap_or_default();
    while read().lines().count() < 3 * 16 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = read();
    for version in ["HTTP/1.1", "HTTP/2.0", "HTTP/3.0"] {
        let proxied = log.lines().filter(|l| l.contains("GET /api/x/%2e%2e/name") && l.contains(version)).count();
        assert_eq!(proxied, 1, "{version}: {log}");
    }
    let main = s.srv.access_log();
    assert!(main.iter().all(|l| !l.contains("/api/x/%2e%2e/name")), "a proxied answer in the main log: {main:?}");
}

/// `ktlsd check` names each `[[proxy]]` or `[[headers]]` path whose meaning the one
/// pattern dialect changed, and still accepts the file.
#[test]
fn check_names_the_patterns_whose_meaning_changed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ktlsd.toml");
    std::fs::write(
        &cfg,
        "[[proxy]]\npath = \"/api/*\"\nupstream = [\"http://127.0.0.1:9\"]\n\
         [[proxy]]\npath = \"/v2/**\"\nupstream = [\"http://127.0.0.1:9\"]\n\
         [[headers]]\npath = \"*.css\"\nset = { X-A = \"1\" }\n",
    )
    .unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["check", "--ephemeral-cert", "--listen", "127.0.0.1:0", "--config"]).arg(&cfg);
    cmd.args(allow_root_args()).arg(dir.path()).env_remove("KTLSD_LOG");
    let out = run_with_timeout(&mut cmd, None, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("now matches")).collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(notes[0].contains("proxy 1: path \"/api/*\" now matches across `/`"), "{err}");
}
