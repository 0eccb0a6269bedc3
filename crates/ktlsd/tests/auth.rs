//! Basic auth with the real binary: an htpasswd file made by `htpasswd -B`
//! (apache2-utils) plus an argon2id line, curl `-u` over HTTP/1.1 and HTTP/2,
//! wrong passwords counted and limited per client address (429 with
//! Retry-After, in /metrics), a forged X-Forwarded-For that changes nothing, a
//! huge Authorization header bounded by the header limits, per-site rules, and
//! an MD5 (`$apr1$`) file refused at start naming its line.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// `htpasswd -B` lines for alice (bcrypt, cost 5) and an argon2id line for carol, in DIR/users.
fn htpasswd(dir: &Path) -> std::path::PathBuf {
    let out = run_with_timeout(
        Command::new("htpasswd").args(["-nbB", "-C", "5", "alice", "s3cret"]),
        None,
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "htpasswd (apache2-utils) failed: {}", String::from_utf8_lossy(&out.stderr));
    let alice = String::from_utf8(out.stdout).expect("utf-8");
    assert!(alice.starts_with("alice:$2y$"), "{alice}");
    use argon2::password_hash::{PasswordHasher, SaltString};
    let salt = SaltString::encode_b64(b"a salt of sixteen").expect("salt");
    let a = argon2::Argon2::new(
        argon2::Algorithm::Argon2id,
        argon2::Version::V0x13,
        argon2::Params::new(1024, 2, 1, None).expect("params"),
    );
    let carol = format!("carol:{}\n", a.hash_password("pässwörd".as_bytes(), &salt).expect("hash"));
    let path = dir.join("users");
    std::fs::write(&path, format!("# staff\n{}\n{carol}", alice.trim())).expect("write users");
    path
}

fn server(extra: &str) -> (Server, std::path::PathBuf) {
    let b = Server::builder(BIN).file("private/doc.txt", "secret doc").file("public.txt", "public");
    let users = htpasswd(b.dir());
    let sock = b.dir().join("admin.sock");
    let config = format!(
        "{extra}[[auth]]\npath = \"/private/*\"\nusers = {:?}\nrealm = \"Staff only\"\n",
        users.display().to_string()
    );
    (b.config(&config).arg("--admin").arg(&sock).start(), sock)
}

#[test]
fn credentials_over_http1_and_http2() {
    let (srv, sock) = server("");
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/public.txt"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "public"), "{proto}");
        let r = fetch(&srv.url("/private/doc.txt"), &[proto]);
        assert_eq!(r.status, 401, "{proto}");
        assert_eq!(r.header("www-authenticate"), Some("Basic realm=\"Staff only\", charset=\"UTF-8\""), "{proto}");
        assert!(!r.body_str().contains("secret doc"));
        for user in ["alice:s3cret", "carol:pässwörd"] {
            let r = fetch(&srv.url("/private/doc.txt"), &[proto, "-u", user]);
            assert_eq!((r.status, r.body_str().as_str()), (200, "secret doc"), "{proto} {user}");
        }
        for user in ["alice:wrong", "mallory:s3cret", "carol:s3cret"] {
            let r = fetch(&srv.url("/private/doc.txt"), &[proto, "-u", user]);
            assert_eq!(r.status, 401, "{proto} {user}");
        }
        // Another spelling of the path is the same path.
        let r = fetch(&srv.url("/%70rivate/doc.txt"), &[proto, "--path-as-is"]);
        assert_eq!(r.status, 401, "{proto} percent-encoded path");
    }
    let (_, metrics) = admin_get(&sock, "/metrics");
    assert!(metrics.contains("ktlsd_auth_failures_total 6"), "{metrics}");
}

#[test]
fn failures_are_limited_per_address_and_forwarded_for_is_ignored() {
    let (srv, sock) = server("");
    let url = srv.url("/private/doc.txt");
    for i in 0..10 {
        let forged = format!("X-Forwarded-For: 198.51.100.{i}");
        let r = fetch(&url, &["-u", "alice:wrong", "-H", &forged]);
        assert_eq!(r.status, 401, "attempt {i}");
    }
    for proto in ["--http1.1", "--http2"] {
        // Over the limit: 429 even with the right password, whatever the forged address.
        let r = fetch(&url, &[proto, "-u", "alice:s3cret", "-H", "X-Forwarded-For: 203.0.113.9"]);
        assert_eq!(r.status, 429, "{proto}");
        let wait: u64 = r.header("retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
        assert!((1..=60).contains(&wait), "Retry-After {wait}");
    }
    // Paths without a rule are served as before.
    assert_eq!(fetch(&srv.url("/public.txt"), &[]).status, 200);
    let (_, metrics) = admin_get(&sock, "/metrics");
    assert!(metrics.contains("ktlsd_auth_failures_total 10"), "{metrics}");
    assert!(metrics.contains("ktlsd_auth_rate_limited_total 2"), "{metrics}");
}

#[test]
fn a_huge_authorization_header_is_answered_at_once() {
    let (srv, _) = server("");
    let huge = format!("Authorization: Basic {}", "QUFB".repeat(20_000));
    for (proto, want) in [("--http1.1", 431), ("--http2", 431)] {
        let started = std::time::Instant::now();
        let out = curl(&[
            proto,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            huge.as_str(),
            srv.url("/private/doc.txt").as_str(),
        ]);
        let code = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(started.elapsed() < Duration::from_secs(5), "{proto} took {:?}", started.elapsed());
        // HTTP/2 may also refuse the stream (curl then reports 000 and fails).
        assert!(code == want.to_string() || (proto == "--http2" && !out.status.success()), "{proto}: {code}");
    }
    // A large one within the limits is checked and refused.
    let big = format!("Authorization: Basic {}", "QUFB".repeat(1_000));
    assert_eq!(fetch(&srv.url("/private/doc.txt"), &["-H", &big]).status, 401);
}

#[test]
fn sites_have_their_own_rules() {
    let b = Server::builder(BIN).file("private/doc.txt", "default private");
    let users = htpasswd(b.dir());
    let other = b.dir().join("other");
    std::fs::create_dir_all(other.join("private")).expect("mkdir");
    std::fs::write(other.join("private/doc.txt"), "other private").expect("write");
    let config = format!(
        "[[site]]\nnames = [\"a.test\"]\nroot = {:?}\n[[site.auth]]\npath = \"/private/*\"\nusers = {:?}\n",
        other.display().to_string(),
        users.display().to_string()
    );
    let srv = b.config(&config).start();
    let resolve = format!("a.test:{}:127.0.0.1", srv.port());
    let url = format!("https://a.test:{}/private/doc.txt", srv.port());
    let r = fetch(&url, &["--resolve", &resolve]);
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Basic realm=\"Restricted\", charset=\"UTF-8\""));
    let r = fetch(&url, &["--resolve", &resolve, "-u", "alice:s3cret"]);
    assert_eq!((r.status, r.body_str().as_str()), (200, "other private"));
    // The default site has no rule.
    assert_eq!(fetch(&srv.url("/private/doc.txt"), &[]).status, 200);
}

#[test]
fn an_md5_file_is_refused_at_start() {
    let b = Server::builder(BIN);
    let users = b.dir().join("users");
    let out = run_with_timeout(Command::new("htpasswd").args(["-nbm", "bob", "pw"]), None, Duration::from_secs(30));
    assert!(out.status.success(), "htpasswd -m failed");
    std::fs::write(&users, [b"# legacy\n".as_slice(), &out.stdout].concat()).expect("write");
    let config = format!("[[auth]]\npath = \"/*\"\nusers = {:?}\n", users.display().to_string());
    let exited = b.config(&config).run_to_exit();
    assert!(!exited.status.success());
    assert!(
        exited.stderr.contains("line 2 (user bob): an MD5-crypt hash is refused; use bcrypt (htpasswd -B) or argon2id"),
        "{}",
        exited.stderr
    );
}
