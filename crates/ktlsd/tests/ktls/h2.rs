//! HTTP/2 over kTLS: bodies intact and one DATA frame per TLS record.

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use testkit::{fetch, run_with_timeout, sha256};

use crate::harness::*;

/// Relays one client connection to `to` and returns the length field of every TLS
/// record the server sent (header type 23, application data), in order.
pub fn record_lengths_proxy(to: SocketAddr) -> (SocketAddr, thread::JoinHandle<Vec<(u8, usize)>>) {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listener");
    let addr = listener.local_addr().expect("proxy address");
    let handle = thread::spawn(move || {
        let (mut client, _) = listener.accept().expect("proxy accept");
        let mut server = TcpStream::connect(to).expect("proxy connect");
        let (mut c2, mut s2) = (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
        let up = thread::spawn(move || {
            let _ = std::io::copy(&mut c2, &mut s2);
            let _ = s2.shutdown(std::net::Shutdown::Write);
        });
        let mut records = Vec::new();
        let mut header = [0u8; 5];
        while server.read_exact(&mut header).is_ok() {
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            let mut body = vec![0u8; len];
            if server.read_exact(&mut body).is_err() {
                break;
            }
            records.push((header[0], len));
            if client.write_all(&header).and_then(|_| client.write_all(&body)).is_err() {
                break;
            }
        }
        let _ = client.shutdown(std::net::Shutdown::Write);
        let _ = up.join();
        records
    });
    (addr, handle)
}

/// HTTP/2 over kTLS: curl `--http2` bodies intact (SHA-256), every connection in
/// the kernel both ways, the access log says `HTTP/2.0` and `tls=ktls`; and on
/// the wire each full DATA frame is exactly one TLS record.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn h2_bodies_and_one_frame_per_record() {
    let test = "h2_bodies_and_one_frame_per_record";
    let files = standard_files();
    let server = KtlsServer::start(&files, &["--tls-versions", "1.3", "--cipher-suites", "TLS_AES_128_GCM_SHA256"]);
    for (name, data) in &files {
        let r = fetch(&server.url(&format!("/{name}")), &["--http2", "--max-time", "90"]);
        assert_eq!((r.version.as_str(), r.status), ("HTTP/2", 200), "/{name}");
        assert_eq!(sha256(&r.body), sha256(data), "/{name} over HTTP/2 ({test})");
    }

    // nghttp through a proxy that notes the record lengths; large windows, so
    // that flow control does not cut frames short.
    let (proxy, records) = record_lengths_proxy(server.addr());
    let url = format!("https://{proxy}/big");
    let out = run_with_timeout(
        std::process::Command::new("nghttp").args(["-nv", "-w", "30", "-W", "30", &url]),
        None,
        Duration::from_secs(90),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "nghttp failed: {}", String::from_utf8_lossy(&out.stderr));
    let frames: Vec<usize> = text
        .lines()
        .filter(|l| l.contains("recv DATA frame"))
        .filter_map(|l| l.split("length=").nth(1)?.split(',').next()?.parse().ok())
        .collect();
    assert_eq!(frames.iter().sum::<usize>(), BIG, "DATA bytes");
    let records = records.join().expect("proxy");
    // TLS 1.3 AES-GCM: a record's length field is its plaintext + 1 (content type) + 16 (tag).
    let full_frames = frames.iter().filter(|&&n| n == 16384 - 9).count();
    let full_records = records.iter().filter(|&&(t, n)| t == 23 && n == 16384 + 17).count();
    assert!(full_frames >= BIG / 16375 - 2, "full DATA frames: {full_frames} of {}", frames.len());
    // The response's HEADERS share the first record with a shorter first DATA frame,
    // which fills that record too: one full record more than full frames at most.
    assert!(
        full_records == full_frames || full_records == full_frames + 1,
        "one full record per full DATA frame: {full_records} full records, {full_frames} full frames; records: {:?}",
        &records[..records.len().min(40)]
    );
    assert!(records.iter().all(|&(_, n)| n <= 16384 + 17 + 256), "no record over the maximum");
    // A frame header sent as a record of its own (9 + 17) would mean the header and
    // its payload were split.
    let lone_headers = records.iter().filter(|&&(t, n)| t == 23 && n == 9 + 17).count();
    assert!(lone_headers <= 2, "{lone_headers} records of a lone frame header");

    frames_one_per_record(&frames, &records, "large windows");

    // Small windows (64 KiB - 1) cut frames at odd sizes wherever the window
    // runs out, so frame edges no longer fall on the record size: a writer that
    // filled full records regardless of frames would show 16384-byte records where
    // these frames are shorter, and one that sent each frame header as a record of
    // its own would show twice as many records.
    let (proxy, records) = record_lengths_proxy(server.addr());
    let out = run_with_timeout(
        std::process::Command::new("nghttp").args(["-nv", "-w", "16", "-W", "16", &format!("https://{proxy}/big")]),
        None,
        Duration::from_secs(90),
    );
    assert!(out.status.success(), "nghttp failed: {}", String::from_utf8_lossy(&out.stderr));
    let frames = data_frames(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(frames.iter().sum::<usize>(), BIG, "DATA bytes");
    assert!(
        frames.iter().any(|&n| n != 16384 - 9 && n != *frames.last().unwrap_or(&0)),
        "no odd-sized frame: {frames:?}"
    );
    frames_one_per_record(&frames, &records.join().expect("proxy"), "small windows");

    let s = server.stop();
    assert_ktls(test, &s, &Expect::conns(files.len() as u64 + 2, files.len() + 2));
    assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
    for line in &s.access_log {
        assert!(line.contains(" HTTP/2.0\" 200 ") && line.ends_with(" tls=ktls"), "{line}");
    }
}

/// The lengths of the DATA frames `nghttp -v` received, in order.
pub fn data_frames(text: &str) -> Vec<usize> {
    text.lines()
        .filter(|l| l.contains("recv DATA frame"))
        .filter_map(|l| l.split("length=").nth(1)?.split(',').next()?.parse().ok())
        .collect()
}

/// The server's application records carry the DATA frames one to one, in order:
/// after the record the first frame shares (with HEADERS and control frames),
/// each following frame is exactly one record whose plaintext is its 9-byte header
/// and payload (TLS 1.3 AES-GCM: length field = plaintext + 1 + 16).
fn frames_one_per_record(frames: &[usize], records: &[(u8, usize)], what: &str) {
    let plain: Vec<usize> = records.iter().filter(|&&(t, _)| t == 23).map(|&(_, n)| n - 17).collect();
    let want: Vec<usize> = frames.iter().skip(1).map(|n| n + 9).collect();
    let first = frames.first().map_or(0, |n| n + 9);
    let found = (1..plain.len().saturating_sub(want.len()) + 1)
        .any(|j| plain[j..j + want.len()] == want[..] && plain[j - 1] >= first);
    assert!(
        found,
        "{what}: the {} DATA frames after the first are not one record each, in order;\nframes + 9: {:?}\nrecords:    {:?}",
        want.len(),
        &want[..want.len().min(60)],
        &plain[..plain.len().min(70)]
    );
}
