//! TLS 1.3 KeyUpdate on kTLS sockets, from rustls and from `openssl s_client`:
//! re-keyed where the kernel can, a clean close where it cannot.

use std::io::Write;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use testkit::{assert_body, get_request, sha256, LineLog};

use crate::harness::*;
use crate::suites::*;
use crate::wire::*;

/// TLS 1.3 KeyUpdate(update_requested) from a rustls client. Kernels that can
/// re-key keep the connection going; older ones close it cleanly, and the
/// server keeps serving.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn key_update_from_rustls_client() {
    let test = "key_update_from_rustls_client";
    let files = standard_files();
    let rekey = kernel_can_rekey();
    let server = KtlsServer::start(&files, &[]);
    let cfg = client_config(V::Tls13, None);
    let mut c = WireClient::connect(server.addr(), &cfg);
    assert_body("before KeyUpdate", &c.get("/r16385").body, file(&files, "r16385"));

    c.conn.refresh_traffic_keys().unwrap();
    c.flush();
    if rekey {
        // The request follows the KeyUpdate at once, under the new key.
        let r = c.get("/big");
        assert_eq!(r.status, 200);
        assert_body("after the first KeyUpdate", &r.body, file(&files, "big"));
        c.conn.refresh_traffic_keys().unwrap();
        c.flush();
        let r = c.get("/r16384");
        assert_body("after the second KeyUpdate", &r.body, file(&files, "r16384"));
        c.conn.send_close_notify();
        c.flush();
        assert_eq!(c.until_closed().0, Close::Notify);

        let s = server.stop();
        assert_ktls(test, &s, &Expect { exact_installs: false, ..Expect::conns(1, 3) });
        assert_eq!(s.stat("key_updates"), 2, "{}", s.stderr);
        assert_eq!(s.stat("rekey_unsupported"), 0);
        assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
        for (name, want) in [("TlsRxRekeyOk", 2), ("TlsTxRekeyOk", 2), ("TlsRxRekeyError", 0), ("TlsTxRekeyError", 0)] {
            assert_eq!(s.tls.get(name), want, "{name}; {}", s.tls.summary());
        }
    } else {
        // Nothing more is sent: the server must end the connection by itself.
        let (how, stray) = c.until_closed();
        assert!(stray.is_empty(), "data after KeyUpdate on a kernel that cannot re-key: {stray:?}");
        assert_eq!(how, Close::Notify, "the server should close cleanly (close_notify) when the kernel cannot re-key");
        // Another connection works.
        let mut other = WireClient::connect(server.addr(), &cfg);
        assert_body("a new connection after the refused KeyUpdate", &other.get("/r16385").body, file(&files, "r16385"));
        other.conn.send_close_notify();
        other.flush();
        assert_eq!(other.until_closed().0, Close::Notify);

        let s = server.stop();
        assert_ktls(test, &s, &Expect::conns(2, 2));
        assert_eq!(s.stat("rekey_unsupported"), 1, "{}", s.stderr);
        assert_eq!(s.stat("key_updates"), 0);
    }
}

/// TLS 1.3 KeyUpdate typed into an interactive `openssl s_client`: `k`
/// (update not requested), then `K` (update requested).
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn key_update_from_openssl_s_client() {
    let test = "key_update_from_openssl_s_client";
    let rekey = kernel_can_rekey();
    let bodies: Vec<(String, Vec<u8>)> = (1..=3)
        .map(|i| (format!("ku{i}.txt"), format!("key-update-body-{i}-{}\n", sha256(&[i])).into_bytes()))
        .collect();
    let files: Vec<(&str, Vec<u8>)> = bodies.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    let server = KtlsServer::start(&files, &[]);

    // Not -quiet (nor -ign_eof): s_client only takes `k`/`K` commands without
    // them. Each command must arrive as its own read from stdin.
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &server.addr().to_string(), "-servername", "localhost", "-tls1_3", "-msg"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl s_client");
    let mut stdin = child.stdin.take().unwrap();
    let (out, out_reader) = LineLog::spawn(child.stdout.take().unwrap());
    let (err, err_reader) = LineLog::spawn(child.stderr.take().unwrap());
    let t = Duration::from_secs(30);
    let diag = |out: &LineLog, err: &LineLog| {
        let out = out.text();
        let tail = out.chars().rev().take(3000).collect::<String>().chars().rev().collect::<String>();
        format!("\n--- s_client stdout (tail):\n{tail}\n--- stderr:\n{}", err.text())
    };
    let wait_for = |log: &LineLog, what: &str, pred: &dyn Fn(&[String]) -> bool| {
        assert!(log.wait_until(t, pred), "timed out waiting for {what}{}", diag(&out, &err));
    };
    // Body `i` (one line) shows up on s_client's stdout.
    let body_seen = |i: usize| {
        let line = String::from_utf8_lossy(&bodies[i].1).trim_end().to_owned();
        move |lines: &[String]| lines.iter().any(|l| l.contains(&line))
    };
    let keyupdates = |lines: &[String]| lines.iter().map(|l| l.matches("KEYUPDATE").count()).sum::<usize>();

    let request = |stdin: &mut std::process::ChildStdin, i: usize| {
        let req = get_request(&format!("/{}", bodies[i].0));
        stdin.write_all(req.as_bytes()).and_then(|()| stdin.flush())
    };
    request(&mut stdin, 0).unwrap();
    wait_for(&out, "the first response", &body_seen(0));

    stdin.write_all(b"k\n").unwrap();
    wait_for(&err, "s_client to announce KEYUPDATE", &|l| keyupdates(l) >= 1);
    let mut served = 1;
    if rekey {
        request(&mut stdin, 1).unwrap();
        wait_for(&out, "the response after `k`", &body_seen(1));
        stdin.write_all(b"K\n").unwrap();
        wait_for(&err, "the second KEYUPDATE", &|l| keyupdates(l) >= 2);
        request(&mut stdin, 2).unwrap();
        wait_for(&out, "the response after `K`", &body_seen(2));
        served = 3;
        // EOF on stdin: s_client sends close_notify and exits.
        drop(stdin);
    }
    // Without re-keying, s_client has sent the KeyUpdate at once: the server
    // must end the connection by itself, and s_client exits when it does.
    let deadline = Instant::now() + t;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("s_client did not exit (rekey={rekey}){}", diag(&out, &err));
        }
        thread::sleep(Duration::from_millis(20));
    };
    // The readers finish once the pipes close.
    let _ = out_reader.join();
    let _ = err_reader.join();
    let stdout_text = out.text();
    // -msg shows the KeyUpdate messages themselves.
    let sent_updates = stdout_text.matches(">>> TLS 1.3, Handshake [length 0005], KeyUpdate").count();
    let got_updates = stdout_text.matches("<<< TLS 1.3, Handshake [length 0005], KeyUpdate").count();

    let s = server.stop();
    if rekey {
        assert!(status.success(), "s_client: {status}{}", diag(&out, &err));
        assert_eq!(sent_updates, 2, "KeyUpdates s_client sent{}", diag(&out, &err));
        assert_eq!(
            got_updates,
            1,
            "the server answers `K` (update requested) with its own KeyUpdate{}",
            diag(&out, &err)
        );
        assert_ktls(test, &s, &Expect { exact_installs: false, ..Expect::conns(1, served) });
        assert_eq!(s.stat("key_updates"), 2, "{}", s.stderr);
        assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
        assert!(s.tls.get("TlsRxRekeyOk") == 2 && s.tls.get("TlsTxRekeyOk") == 1, "{}", s.tls.summary());
    } else {
        assert_eq!(sent_updates, 1, "KeyUpdates s_client sent{}", diag(&out, &err));
        assert!(
            stdout_text.contains("<<< TLS 1.3, Alert [length 0002], warning close_notify"),
            "the server should close cleanly (close_notify) when the kernel cannot re-key{}",
            diag(&out, &err)
        );
        assert_ktls(test, &s, &Expect::conns(1, served));
        assert_eq!(s.stat("rekey_unsupported"), 1, "{}", s.stderr);
    }
}
