//! Records on the wire under kTLS: TLS 1.2 explicit nonces, the record size
//! policies, and a record that fails authentication.

use std::collections::HashMap;
use std::io::Write;

use testkit::{assert_body, pattern};

use crate::harness::*;
use crate::suites::*;
use crate::wire::*;

/// TLS 1.2 AES-GCM records carry an explicit nonce: the kernel must not
/// repeat one that rustls used for the server's Finished (same key), nor any
/// other. Checked on the wire, for both GCM suites.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn tls12_gcm_explicit_nonces_never_repeat() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &["--tls-versions", "1.2"]);
    let mut requests = 0;
    for c in [Cipher::Aes128Gcm, Cipher::Aes256Gcm] {
        let mut client = WireClient::start(server.addr(), &client_config(V::Tls12, Some(rustls_suite(V::Tls12, c))));
        client.raw = Some(Vec::new());
        client.handshake();
        for name in ["one", "r16385", "empty", "big"] {
            assert_eq!(client.get(&format!("/{name}")).status, 200);
            requests += 1;
        }
        client.conn.send_close_notify();
        client.flush();
        assert_eq!(client.until_closed().0, Close::Notify);

        let raw = client.raw.take().unwrap();
        let mut pos = 0;
        let mut encrypted = false;
        let mut nonces: HashMap<[u8; 8], usize> = HashMap::new();
        let mut records = 0;
        while pos + 5 <= raw.len() {
            let typ = raw[pos];
            let len = u16::from_be_bytes([raw[pos + 3], raw[pos + 4]]) as usize;
            let payload = &raw[pos + 5..(pos + 5 + len).min(raw.len())];
            assert!(len <= 16384 + 8 + 16, "{c:?}: record #{records} of {len} bytes exceeds the TLS 1.2 GCM limit");
            if encrypted {
                let nonce: [u8; 8] = payload[..8].try_into().unwrap();
                if let Some(first) = nonces.insert(nonce, records) {
                    panic!("{c:?}: explicit nonce {nonce:02x?} of record #{records} repeats record #{first}'s (AES-GCM nonce reuse)");
                }
            }
            if typ == 20 {
                encrypted = true; // ChangeCipherSpec: everything after is protected
            }
            pos += 5 + len;
            records += 1;
        }
        assert_eq!(pos, raw.len(), "{c:?}: trailing partial record");
        assert!(nonces.len() > 5, "{c:?}: only {} protected records seen", nonces.len());
    }
    let s = server.stop();
    assert_ktls("tls12_gcm_explicit_nonces_never_repeat", &s, &Expect::conns(2, requests));
}

/// Complete TLS records in `raw`: (offset, content type, length of the
/// protected payload).
fn records(raw: &[u8]) -> Vec<(usize, u8, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 5 <= raw.len() {
        let len = u16::from_be_bytes([raw[pos + 3], raw[pos + 4]]) as usize;
        if pos + 5 + len > raw.len() {
            break;
        }
        out.push((pos, raw[pos], len));
        pos += 5 + len;
    }
    out
}

/// The record size policies on the kernel path: every body intact, and the
/// records on the wire as long as the policy says (`static` below 16 KiB is
/// enforced by the kernel itself where it has TLS_TX_MAX_PAYLOAD_LEN, by one
/// `sendfile` per record elsewhere). `adaptive` sets TCP_NOTSENT_LOWAT
/// (16 KiB); full records with the same low-water mark set by hand, too.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn record_size_policies() {
    let files = standard_files();
    let odd = file(&files, "odd");
    let cases: [(&str, &[&str]); 4] =
        [("static:4k", &[]), ("dynamic", &[]), ("adaptive", &[]), ("static:16k", &["--tcp-notsent-lowat", "16384"])];
    for (policy, extra) in cases {
        // A stall shows as the send timeout cutting the connection.
        let mut args = vec!["--send-timeout", "20", "--record-size", policy];
        args.extend_from_slice(extra);
        let server = KtlsServer::start(&files, &args);
        for v in [V::Tls13, V::Tls12] {
            // AES-128-GCM: 17 bytes of expansion per TLS 1.3 record, 24 per TLS 1.2 one.
            let expansion = if v == V::Tls13 { 17 } else { 24 };
            let mut c = WireClient::start(server.addr(), &client_config(v, Some(rustls_suite(v, Cipher::Aes128Gcm))));
            c.raw = Some(Vec::new());
            c.handshake();
            // A first response, so that session tickets are behind us.
            assert_eq!(c.get("/one").status, 200);
            let mark = c.raw.as_ref().unwrap().len();
            let r = c.get("/odd");
            assert_eq!(r.status, 200);
            assert_body(&format!("{policy} {v:?} /odd (rustls)"), &r.body, odd);
            c.conn.send_close_notify();
            c.flush();
            assert_eq!(c.until_closed().0, Close::Notify);

            let raw = c.raw.take().unwrap();
            let sizes: Vec<usize> = records(&raw)
                .into_iter()
                .filter(|&(off, typ, _)| off >= mark && typ == 23)
                .map(|(_, _, len)| len - expansion)
                .collect();
            // The last one or two may be the close_notify alert (TLS 1.3 hides its type).
            let body_records: Vec<usize> = sizes.iter().copied().filter(|&n| n > 2).collect();
            let total: usize = body_records.iter().sum();
            assert!(
                (ODD..ODD + 1024).contains(&total),
                "{policy} {v:?}: {total} plaintext bytes in the response records"
            );
            let max = body_records.iter().copied().max().unwrap_or(0);
            println!(
                "[record_size_policies] {policy} {v:?}: {} records, max {max}, first {:?}",
                body_records.len(),
                &body_records[..body_records.len().min(6)]
            );
            match policy {
                "static:4k" => {
                    assert!(max <= 4096, "{policy} {v:?}: a record of {max} bytes");
                    let full = body_records.iter().filter(|&&n| n == 4096).count();
                    assert!(full + 2 >= ODD / 4096, "{policy} {v:?}: only {full} records of 4096 bytes");
                }
                "dynamic" => {
                    // lo=1369 for 40 records, hi=4229 for 40 more, then full;
                    // the request for /one used the first.
                    assert!(body_records.len() > 80, "{policy} {v:?}: {} records", body_records.len());
                    assert!(body_records[..38].iter().all(|&n| n <= 1369), "{policy} {v:?}: {:?}", &body_records[..40]);
                    assert!(
                        body_records[40..78].iter().all(|&n| n <= 4229 && n > 1369),
                        "{policy} {v:?}: {:?}",
                        &body_records[38..80]
                    );
                    assert_eq!(max, 16384, "{policy} {v:?}: full records after the ramp");
                }
                _ => assert!(max <= 16384, "{policy} {v:?}: a record of {max} bytes"),
            }

            let (code, body) = curl_get(&server.url("/odd"), &curl_tls_args(v, Cipher::Aes128Gcm), &[]);
            assert_eq!(code, 200);
            assert_body(&format!("{policy} {v:?} /odd (curl)"), &body, odd);
        }
        let s = server.stop();
        assert_ktls(&format!("record_size_policies[{}]", args.join(" ")), &s, &Expect::conns(4, 6));
        assert_eq!(s.stat("errors"), 0, "{}", s.stderr);
    }
}

/// A record that fails authentication: the kernel refuses it (EBADMSG), the
/// server answers bad_record_mac and drops the connection, and goes on serving.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn corrupted_record_gets_bad_record_mac() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &[]);
    let mut requests = 0;
    for v in [V::Tls13, V::Tls12] {
        let mut c = WireClient::connect(server.addr(), &client_config(v, None));
        assert_eq!(c.get("/one").status, 200);
        requests += 1;
        // A well-formed application-data record whose contents are garbage.
        let mut rec = vec![23u8, 3, 3, 0, 64];
        rec.extend_from_slice(&pattern(64, 99));
        c.sock.write_all(&rec).unwrap();
        let (how, stray) = c.until_closed();
        assert!(stray.is_empty());
        // The server answers bad_record_mac; a kernel that has put the
        // socket in an error state may refuse to send it (then: EOF/reset).
        println!("[corrupted_record_gets_bad_record_mac] {v:?}: the client saw {how:?}");
        if let Close::Tls(e) = &how {
            assert!(e.to_lowercase().contains("badrecordmac"), "{v:?}: expected a bad_record_mac alert, got: {e}");
        }
        assert_ne!(how, Close::Notify, "{v:?}: a connection cut for a forged record must not end with close_notify");
    }
    let (code, body) = curl_get(&server.url("/r16385"), &[], &[]);
    assert_eq!(code, 200);
    assert_body("after the corrupted records", &body, file(&files, "r16385"));
    requests += 1;
    let s = server.stop();
    assert_ktls(
        "corrupted_record_gets_bad_record_mac",
        &s,
        &Expect { decrypt_errors: 2, ..Expect::conns(3, requests) },
    );
    assert_eq!(s.stat("ktls_record_errors"), 2, "{}", s.stderr);
}
