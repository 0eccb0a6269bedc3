//! Logs and metrics as an operator reads them: access-log entries of every
//! protocol with the bytes sent, the admin socket reachable by a non-root
//! scraper, per-request refusals kept out of the error log's flood.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

fn builder() -> ServerBuilder {
    ServerBuilder::new(BIN).bin_from_env()
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// The bytes field of a line in the default format (`... "REQUEST" STATUS BYTES ...`).
fn logged_bytes(line: &str) -> u64 {
    let after_request = line.split('"').nth(2).unwrap_or_default();
    let bytes = after_request.split_whitespace().nth(1);
    bytes.and_then(|b| b.parse().ok()).unwrap_or_else(|| panic!("no byte count in {line:?}"))
}

/// A built-in error page over HTTP/2 is logged with the bytes of its body, as
/// over HTTP/1.1.
#[test]
fn built_in_error_pages_are_logged_with_their_bytes_over_both_protocols() {
    let srv = builder().file("a.txt", "a\n").start();
    let h2 = fetch(&srv.url("/missing"), &["--http2"]);
    let h1 = fetch(&srv.url("/missing"), &["--http1.1"]);
    assert_eq!((h2.status, h1.status), (404, 404));
    assert!(!h2.body.is_empty());
    let log = srv.wait_access_log(2, Duration::from_secs(10));
    assert_eq!(log.len(), 2, "{log:?}");
    let line = |v: &str| log.iter().find(|l| l.contains(v)).unwrap_or_else(|| panic!("no {v} line in {log:?}"));
    assert_eq!(logged_bytes(line("HTTP/2.0")), h2.body.len() as u64, "{log:?}");
    assert_eq!(logged_bytes(line("HTTP/1.1")), h1.body.len() as u64, "{log:?}");
}

/// The admin Unix socket, made by root before the switch to `--user`, accepts a
/// scraper that is not root.
#[test]
fn a_non_root_scraper_connects_to_the_admin_socket() {
    assert!(running_as_root(), "this test starts ktlsd as root with --user nobody");
    let b = builder().file("a.txt", "a\n").args(["--user", "nobody"]);
    chmod(b.dir(), 0o755);
    let sock = b.dir().join("admin.sock");
    let srv = b.arg("--admin").arg(&sock).start();
    let out = run_with_timeout(
        Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "curl", "-sS", "--unix-socket"])
            .arg(&sock)
            .arg("http://admin/status"),
        None,
        Duration::from_secs(30),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("\"uptime"), "{out:?}");
    srv.stop();
}
