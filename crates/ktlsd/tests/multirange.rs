//! Several byte ranges with the real binary and curl, over HTTP/1.1 and HTTP/2,
//! on the kernel record layer (where the kernel has it) and in user space:
//! `206 multipart/byteranges` bodies checked byte for byte against the file,
//! coalesced overlaps, unsatisfiable members left out, too many ranges ignored
//! (200), HEAD, and If-Range.

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// A file of `n` bytes that differ from one offset to the next.
fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// The multipart body the server must send for `ranges` (inclusive, as written) of `file`.
fn expected(file: &[u8], ranges: &[(usize, usize)], boundary: &str, part_type: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, &(a, b)) in ranges.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b"\r\n");
        }
        let head =
            format!("--{boundary}\r\nContent-Type: {part_type}\r\nContent-Range: bytes {a}-{b}/{}\r\n\r\n", file.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(&file[a..=b]);
    }
    out.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    out
}

fn boundary_of(r: &Response) -> String {
    let t = r.header("content-type").unwrap_or_else(|| panic!("no Content-Type: {r:?}"));
    let b = t.strip_prefix("multipart/byteranges; boundary=").unwrap_or_else(|| panic!("Content-Type {t}"));
    assert!(b.len() >= 16 && b.bytes().all(|c| c.is_ascii_hexdigit()), "boundary {b}");
    b.to_string()
}

#[test]
fn several_ranges_over_both_protocols_and_record_layers() {
    let file = data(300_000);
    for ktls in ["auto", "off"] {
        let srv = Server::builder(BIN).file("d.bin", &file).args(["--ktls", ktls]).start();
        let url = srv.url("/d.bin");
        for proto in ["--http1.1", "--http2"] {
            let cases: &[(&str, &[(usize, usize)])] = &[
                ("bytes=0-9,20-29", &[(0, 9), (20, 29)]),
                // Large parts cross many records and DATA frames; the client's order is kept.
                ("bytes=200000-299989,1-70000,-5", &[(200_000, 299_989), (1, 70_000), (299_995, 299_999)]),
                // Overlapping members are coalesced; an unsatisfiable one is left out.
                ("bytes=0-9,5-14,100-109,400000-", &[(0, 14), (100, 109)]),
            ];
            for (range, parts) in cases {
                let r = fetch(&url, &[proto, "-H", &format!("Range: {range}")]);
                assert_eq!(r.status, 206, "{ktls} {proto} {range}");
                assert!(r.header("content-range").is_none());
                let b = boundary_of(&r);
                let want = expected(&file, parts, &b, "application/octet-stream");
                assert_eq!(r.header("content-length"), Some(want.len().to_string().as_str()));
                assert!(
                    r.body == want,
                    "{ktls} {proto} {range}: body differs ({} vs {} bytes)",
                    r.body.len(),
                    want.len()
                );
            }
            // Coalesced into one range: a single part.
            let r = fetch(&url, &[proto, "-H", "Range: bytes=0-4,5-9"]);
            assert_eq!((r.status, r.header("content-range")), (206, Some("bytes 0-9/300000")), "{proto}");
            assert_eq!(r.body, &file[..10]);
            // Nothing satisfiable: 416.
            let r = fetch(&url, &[proto, "-H", "Range: bytes=300000-,400000-400001"]);
            assert_eq!((r.status, r.header("content-range")), (416, Some("bytes */300000")), "{proto}");
            // More than 16 ranges: the field is ignored, the whole file is sent.
            let many = (0..17).map(|i| format!("{}-{}", i * 10, i * 10 + 1)).collect::<Vec<_>>().join(",");
            let r = fetch(&url, &[proto, "-H", &format!("Range: bytes={many}")]);
            assert_eq!(r.status, 200, "{proto}");
            assert!(r.body == file, "{proto}: whole file");
            // HEAD: the same head, no body.
            let r = fetch(&url, &[proto, "-I", "-H", "Range: bytes=0-9,20-29"]);
            assert_eq!(r.status, 206, "{proto} HEAD");
            let b = boundary_of(&r);
            let len = expected(&file, &[(0, 9), (20, 29)], &b, "application/octet-stream").len();
            assert_eq!(r.header("content-length"), Some(len.to_string().as_str()), "{proto} HEAD");
            // If-Range: the current ETag gets the parts, another the whole file.
            let etag = fetch(&url, &[proto, "-I"]).header("etag").expect("ETag").to_string();
            let r = fetch(&url, &[proto, "-H", "Range: bytes=0-0,2-2", "-H", &format!("If-Range: {etag}")]);
            assert_eq!(r.status, 206, "{proto} If-Range matching");
            let r = fetch(&url, &[proto, "-H", "Range: bytes=0-0,2-2", "-H", "If-Range: \"other\""]);
            assert_eq!(r.status, 200, "{proto} If-Range not matching");
            assert!(r.body == file);
        }
    }
}

#[test]
fn part_type_follows_the_file() {
    let srv = Server::builder(BIN).file("t.txt", "abcdefghijklmnopqrstuvwxyz").start();
    let r = fetch(&srv.url("/t.txt"), &["-H", "Range: bytes=0-1,-2"]);
    assert_eq!(r.status, 206);
    let b = boundary_of(&r);
    let want = expected(b"abcdefghijklmnopqrstuvwxyz", &[(0, 1), (24, 25)], &b, "text/plain; charset=utf-8");
    assert_eq!(r.body_str(), String::from_utf8_lossy(&want));
    // Each response gets its own boundary.
    let again = fetch(&srv.url("/t.txt"), &["-H", "Range: bytes=0-1,-2"]);
    assert_ne!(boundary_of(&again), b);
}
