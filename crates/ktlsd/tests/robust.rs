//! Robustness and HTTP/1.1 conformance through the real binary on real sockets:
//! the file-descriptor budget and the open-file cache, lingering close, HEAD
//! error responses, `Expect: 100-continue`, and the finer points of request
//! parsing (versions, Host, absolute-form, transfer codings, preconditions).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use common::*;

const A_TXT: &[u8] = b"alpha\n";

// ---------------------------------------------------------------------------
// File descriptors: the limit is raised, the open-file cache stays within budget.
// ---------------------------------------------------------------------------

/// A script that runs the server binary under `prlimit --nofile=SOFT:HARD`.
fn limited_bin(dir: &std::path::Path, soft: u64, hard: u64) -> PathBuf {
    let script = dir.join(format!("ktlsd-nofile-{soft}-{hard}"));
    let text = format!("#!/bin/sh\nexec prlimit --nofile={soft}:{hard} {} \"$@\"\n", BIN);
    std::fs::write(&script, text).expect("write wrapper script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod wrapper script");
    script
}

fn nofile_limits(pid: i32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read /proc/PID/limits");
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("Max open files line");
    let nums: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (nums[0], nums[1])
}

#[test]
fn soft_fd_limit_is_raised_to_the_hard_limit_and_logged() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let srv = Server::builder().file("a.txt", A_TXT).bin(limited_bin(tmp.path(), 128, 700)).start();
    assert_eq!(nofile_limits(srv.pid()), (700, 700), "the soft limit should be raised to the hard limit");
    let line = srv.wait_stderr("file descriptors", Duration::from_secs(5)).unwrap_or_else(|| srv.stderr());
    assert!(line.contains("700") && line.contains("128"), "fd budget line should name both limits: {line}");
}

#[test]
fn open_file_cache_never_exhausts_a_low_fd_limit() {
    const FILES: usize = 400;
    const SPELLINGS: usize = 300;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut b = Server::builder().bin(limited_bin(tmp.path(), 256, 256));
    for i in 0..FILES {
        b = b.file(&format!("f{i}"), format!("file {i}\n"));
    }
    let srv = b.file("x", b"ex\n").start();

    // Many distinct files, pipelined on one connection so they all land within
    // the cache's validity time.
    let mut c = TlsClient::connect(srv.addr());
    let all: String = (0..FILES).map(|i| get_request(&format!("/f{i}"))).collect();
    c.send(all.as_bytes());
    for i in 0..FILES {
        let r = c.read_response();
        assert_eq!((r.status, r.body_str()), (200, format!("file {i}\n")), "file {i} of {FILES}");
    }
    // One file under many spellings: one cache entry, not hundreds.
    let spellings: String = (0..SPELLINGS)
        .map(|i| match i % 3 {
            0 => get_request(&format!("/{}x", "./".repeat(i / 3 + 1))),
            1 => get_request(&format!("/{}%78", "/".repeat(i / 3 + 1))),
            _ => get_request(&format!("/f0/..{}/x", "/.".repeat(i / 3))),
        })
        .collect();
    c.send(spellings.as_bytes());
    for i in 0..SPELLINGS {
        let r = c.read_response();
        assert_eq!((r.status, r.body.as_slice()), (200, b"ex\n".as_slice()), "spelling {i}");
    }
    drop(c);

    // New connections and normal requests still work, now and after expiry.
    for round in 0..2 {
        for i in 0..20 {
            let cfg = client_config(&[&rustls::version::TLS13]);
            let mut c = TlsClient::connect_with(srv.addr(), cfg)
                .unwrap_or_else(|e| panic!("round {round}: new connection {i} failed: {e}"));
            c.set_read_timeout(Duration::from_secs(10));
            let r = c.get(&format!("/f{}", FILES - 1 - i));
            assert_eq!(r.status, 200, "round {round}, connection {i}");
        }
        std::thread::sleep(Duration::from_millis(1500));
    }
    let r = fetch(&srv.url("/a.txt"), &[]);
    assert_eq!(r.status, 404, "a file that does not exist is still just missing");
    let r = fetch(&srv.url("/x"), &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, b"ex\n".as_slice()));
    assert!(!srv.stderr().contains("accept failed"), "{}", srv.stderr());
}
