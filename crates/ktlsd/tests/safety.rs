//! Path safety end to end: no request may read outside ROOT, whatever its encoding,
//! and nothing outside ROOT may be reached through a symlink. The full table of
//! spellings and links runs in-process (`handler::tests::path_safety`); these cases
//! prove the same through the real binary, its log and a real client. curl runs with
//! `--path-as-is` (and the raw client is used where even that would rewrite the
//! target), so the server sees the bytes exactly as written.

use std::os::unix::fs::symlink;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const SECRET: &str = "TOP-SECRET-3f9c1a outside the root\n";
const A_TXT: &[u8] = b"inside\n";

/// A server whose ROOT holds a.txt and sub/b.txt, with DIR/secret.txt (outside
/// ROOT) and DIR/outside/secret.txt next to it.
fn setup() -> ServerBuilder {
    let b = Server::builder(BIN).file("a.txt", A_TXT).file("sub/b.txt", b"bee\n");
    write_file(&b.dir().join("secret.txt"), SECRET.as_bytes());
    write_file(&b.dir().join("outside/secret.txt"), SECRET.as_bytes());
    b
}

/// GETs `path` exactly as written, asserts `status` and that nothing secret came back.
fn get_as_is(srv: &Server, path: &str, status: u16) -> Response {
    // HTTP/2 first, then HTTP/1.1 (whose refusal lines the tests look for in the log).
    let r2 = fetch(&srv.url(path), &["--http2", "--path-as-is"]);
    assert_eq!(r2.status, status, "GET {path} over HTTP/2: body {:?}", r2.body_str());
    assert_no_secret(&r2.body);
    let r = fetch(&srv.url(path), &["--http1.1", "--path-as-is"]);
    assert_eq!(r.status, status, "GET {path}: body {:?}", r.body_str());
    assert_no_secret(&r.body);
    r
}

fn assert_no_secret(body: &[u8]) {
    let text = String::from_utf8_lossy(body);
    assert!(!text.contains("TOP-SECRET"), "leaked a file from outside the root: {text}");
    assert!(!text.contains("root:x:0:0"), "leaked /etc/passwd: {text}");
}

/// Sends a raw request line (for targets no client would send) and returns the status.
fn raw_status(srv: &Server, target: &[u8]) -> u16 {
    let mut c = TlsClient::connect(srv.addr());
    let mut req = b"GET ".to_vec();
    req.extend_from_slice(target);
    req.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    c.send(&req);
    let r = c.read_response();
    assert_no_secret(&r.body);
    r.status
}

fn assert_still_serving(srv: &Server) {
    let r = fetch(&srv.url("/a.txt"), &["--http1.1"]);
    assert_eq!((r.status, r.body.as_slice()), (200, A_TXT));
}

#[test]
fn dotdot_plain() {
    let srv = setup().start();
    get_as_is(&srv, "/../secret.txt", 400);
    assert!(
        srv.wait_stderr("\"GET /../secret.txt HTTP/1.1\": 400", Duration::from_secs(5)).is_some(),
        "{}",
        srv.stderr()
    );
    assert_still_serving(&srv);
}

#[test]
fn nul_byte_is_400() {
    let srv = setup().start();
    get_as_is(&srv, "/a.txt%00.html", 400);
    get_as_is(&srv, "/%00", 400);
    assert!(srv.wait_stderr("NUL", Duration::from_secs(5)).is_some(), "{}", srv.stderr());
    assert_still_serving(&srv);
}

#[test]
fn target_not_a_path_is_400() {
    let srv = setup().start();
    assert_eq!(raw_status(&srv, b"a.txt"), 400);
    assert_eq!(raw_status(&srv, b"*"), 400);
}

#[test]
fn symlink_to_etc_passwd_is_refused() {
    let srv = setup().start();
    symlink("/etc/passwd", srv.root().join("passwd")).unwrap();
    get_as_is(&srv, "/passwd", 403);
    assert!(srv.wait_stderr("\"GET /passwd HTTP/1.1\": 403", Duration::from_secs(5)).is_some(), "{}", srv.stderr());
}

#[test]
fn symlink_to_directory_outside_root_is_refused() {
    let srv = setup().start();
    symlink(srv.dir().join("outside"), srv.root().join("out")).unwrap();
    symlink("../outside", srv.root().join("relout")).unwrap();
    get_as_is(&srv, "/out/secret.txt", 403);
    get_as_is(&srv, "/relout/secret.txt", 403);
    // A listing of it is refused too.
    drop(srv);
    let b = setup().arg("--autoindex");
    symlink(b.dir().join("outside"), b.root().join("out")).unwrap();
    let srv = b.start();
    let r = get_as_is(&srv, "/out/", 403);
    assert!(!r.body_str().contains("secret.txt"), "{}", r.body_str());
}

#[test]
fn symlink_loop_is_refused() {
    let srv = setup().start();
    symlink("loop2", srv.root().join("loop1")).unwrap();
    symlink("loop1", srv.root().join("loop2")).unwrap();
    let r = fetch(&srv.url("/loop1"), &[]);
    assert!(r.status == 403 || r.status == 404, "{}", r.status);
    assert_still_serving(&srv);
}

#[test]
fn dotfiles_hidden_by_default() {
    let srv = setup()
        .file(".hidden", b"h")
        .file(".git/config", b"[core]")
        .file("sub/.env", b"PASSWORD=x")
        .file(".well-known/thing", b"w")
        .file(".well-known/.env", b"PASSWORD=y")
        .start();
    for p in ["/.hidden", "/.git/config", "/.git/", "/sub/.env", "/%2ehidden", "/sub/%2Eenv", "/.well-known/.env"] {
        let r = get_as_is(&srv, p, 404);
        assert!(!r.body_str().contains("PASSWORD"), "{p}");
    }
    // RFC 8615 well-known URIs are public by design.
    assert_eq!(get_as_is(&srv, "/.well-known/thing", 200).body_str(), "w");
    assert!(srv.wait_stderr("dot-file", Duration::from_secs(5)).is_some(), "{}", srv.stderr());
}

#[test]
fn fifo_is_refused_without_hanging() {
    let srv = setup().start();
    let fifo = srv.root().join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let r = fetch(&srv.url("/pipe"), &["--max-time", "10"]);
    assert_eq!(r.status, 403);
    assert_still_serving(&srv);
}

#[test]
fn special_file_via_symlink_is_refused() {
    let srv = setup().start();
    symlink("/dev/zero", srv.root().join("zero")).unwrap();
    let r = fetch(&srv.url("/zero"), &["--max-time", "10"]);
    assert_eq!(r.status, 403);
    assert_still_serving(&srv);
}

#[test]
fn redirect_location_stays_on_this_host() {
    // A directory asked for without its slash is redirected; a Location starting
    // with `//` would be a network-path reference to another host (an open redirect).
    let srv = setup().start();
    for p in ["//sub", "///sub", "//evil.example/../sub", "//evil.example/%2e%2e/sub"] {
        let r = get_as_is(&srv, p, 301);
        let loc = r.header("location").unwrap_or("");
        assert!(loc.starts_with('/') && !loc.starts_with("//"), "GET {p} -> Location {loc:?} leaves this host");
    }
}
