//! `cache_slice`, end to end: the real binary in front of the Python origin of the
//! range fill tests (`tests/range_fill/origin.py`, which honours Range, logs every
//! request with its Range, changes an object's version on `/bump/NAME`, and can
//! ignore Range or answer a wrong one), curl as the client over HTTP/1.1 and
//! HTTP/2. A range in the middle of a 5 MiB object fetches only the 1 MiB slices it
//! spans; the same range again is a hit with the same bytes; a whole-object GET is
//! assembled from the slices, fetching only the missing ones; slices of two
//! versions are never mixed; an origin that ignores Range or answers the wrong one
//! never has a slice stored; a zero-length object and a range past the end. A
//! purge removes an object's slices; hits carry their `Age`; `If-None-Match` and
//! `If-Modified-Since` get `304`s; an HTTP/3 client (aioquic) gets its range.

use std::path::Path;
use std::time::Duration;

use testkit::*;

#[path = "range_fill/client.rs"]
mod client;
use client::*;

#[path = "h3/client.rs"]
mod aioquic;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const PROTOCOLS: [&str; 2] = ["--http1.1", "--http2"];

const M: usize = 1 << 20;

/// The origin, a cache directory, and ktlsd (one worker) caching `/obj/**` in
/// slices of 1 MiB.
fn setup() -> (ScriptUpstream, tempfile::TempDir, Server) {
    setup_with(&[])
}

/// [`setup`]'s configuration, ktlsd started with `args` as well.
fn setup_with(args: &[&str]) -> (ScriptUpstream, tempfile::TempDir, Server) {
    let up = origin();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[proxy]]\npath = \"/obj/**\"\nupstream = [{:?}]\ncache = true\ncache_slice = \"1m\"\n\n\
         [cache]\ndir = {:?}\nmax_size = \"256M\"\n",
        up.url(),
        dir.path().display().to_string()
    );
    let srv = origin::ktlsd(BIN, &config, args);
    (up, dir, srv)
}

/// The Range value asking for 1 MiB slice `i`.
fn slice(i: usize) -> String {
    format!("bytes={}-{}", i * M, (i + 1) * M - 1)
}

fn slices(indices: &[usize]) -> Vec<String> {
    indices.iter().map(|&i| slice(i)).collect()
}

/// Asserts `r` is the 200 of all of `source`.
fn assert_whole(r: &Response, source: &[u8], what: &str) {
    assert_eq!(r.status, 200, "{what}: {}", r.stderr);
    assert_eq!(r.header("content-length"), Some(source.len().to_string().as_str()), "{what}");
    assert_eq!(sha256(&r.body), sha256(source), "{what}: {} bytes", r.body.len());
}

#[test]
fn a_range_fetches_only_its_slices_and_is_then_a_hit() {
    let (up, _dir, srv) = setup();
    let n = 5 * M;
    let source = object(0, n);
    for proto in PROTOCOLS {
        let t = format!("/obj/mid{proto}?size={n}");
        // 2,500,000 to 3,600,000: slices 2 and 3, and nothing else.
        let first = get(&srv, &t, proto, Some("2500000-3600000"));
        assert_part(&first, &source, 2_500_000..3_600_001, proto);
        assert_eq!(cache_status(&first), "ktlsd; fwd=miss", "{proto}");
        assert_eq!(asked(&up, &t), slices(&[2, 3]), "only the slices the range spans ({proto})");

        let again = get(&srv, &t, proto, Some("2500000-3600000"));
        assert_part(&again, &source, 2_500_000..3_600_001, proto);
        assert_eq!(cache_status(&again), "ktlsd; hit", "{proto}");
        assert!(again.header("via").is_some_and(|v| v.ends_with("1.1 ktlsd")), "{proto}: {:?}", again.headers);
        // Within one stored slice: the entry file's bytes.
        let inner = get(&srv, &t, proto, Some("3200000-3200099"));
        assert_part(&inner, &source, 3_200_000..3_200_100, proto);
        assert_eq!(cache_status(&inner), "ktlsd; hit", "{proto}");
        assert_eq!(asked(&up, &t), slices(&[2, 3]), "hits ask nothing ({proto})");

        // The whole object: assembled, only the missing slices fetched.
        let whole = get(&srv, &t, proto, None);
        assert_whole(&whole, &source, proto);
        assert_eq!(cache_status(&whole), "ktlsd; fwd=miss", "{proto}");
        assert_eq!(asked(&up, &t), slices(&[2, 3, 0, 1, 4]), "{proto}");
        let whole = get(&srv, &t, proto, None);
        assert_whole(&whole, &source, proto);
        assert_eq!(cache_status(&whole), "ktlsd; hit", "{proto}");

        // A suffix and an open range, from the stored slices.
        let last = get(&srv, &t, proto, Some("-1000"));
        assert_part(&last, &source, n - 1000..n, proto);
        assert_eq!(cache_status(&last), "ktlsd; hit", "{proto}");
        let open = get(&srv, &t, proto, Some("1000000-"));
        assert_part(&open, &source, 1_000_000..n, proto);
        assert_eq!(cache_status(&open), "ktlsd; hit", "{proto}");
        assert_eq!(asked(&up, &t), slices(&[2, 3, 0, 1, 4]), "{proto}");

        // Past the end: 416 with the object's size.
        let past = get(&srv, &t, proto, Some("6000000-"));
        assert_eq!(past.status, 416, "{proto}");
        assert_eq!(past.header("content-range"), Some(format!("bytes */{n}").as_str()), "{proto}");
    }
}

#[test]
fn the_last_slice_may_be_short_and_an_empty_object_has_none() {
    let (up, _dir, srv) = setup();
    let n = 4 * M + 12_345;
    let source = object(0, n);
    for proto in PROTOCOLS {
        let t = format!("/obj/odd{proto}?size={n}");
        let tail = get(&srv, &t, proto, Some(&format!("{}-", 4 * M - 10)));
        assert_part(&tail, &source, 4 * M - 10..n, proto);
        assert_eq!(asked(&up, &t), [slice(3), slice(4)], "{proto}");
        let whole = get(&srv, &t, proto, None);
        assert_whole(&whole, &source, proto);

        let t = format!("/obj/empty{proto}?size=0");
        let empty = get(&srv, &t, proto, None);
        assert_eq!((empty.status, empty.body.len()), (200, 0), "{proto}");
        assert_eq!(empty.header("content-length"), Some("0"), "{proto}");
        let none = get(&srv, &t, proto, Some("0-"));
        assert_eq!(none.status, 416, "{proto}");
    }
}

#[test]
fn slices_of_two_versions_are_never_mixed() {
    let (up, _dir, srv) = setup();
    let n = 5 * M;
    let (v0, v1, v2) = (object(0, n), object(1, n), object(2, n));
    for proto in PROTOCOLS {
        let name = format!("ver{}", &proto[2..]).replace('.', "");
        let t = format!("/obj/{name}?size={n}");
        let bump = || assert!(curl(&["-o", "/dev/null", &format!("{}/bump/{name}", up.url())]).status.success());
        // Slice 2 of version 0 stored; then the object changes at the origin.
        assert_part(&get(&srv, &t, proto, Some("2200000-2200099")), &v0, 2_200_000..2_200_100, proto);
        bump();
        // The whole object: slice 0 (version 1) sets the version; the stored slice 2 of
        // version 0 is fetched again.
        let whole = get(&srv, &t, proto, None);
        assert_whole(&whole, &v1, proto);
        assert_eq!(whole.header("etag"), Some(format!("\"{name}-1\"").as_str()), "{proto}");
        assert_eq!(asked(&up, &t), slices(&[2, 0, 1, 2, 3, 4]), "{proto}");
        assert_eq!(sha256(&get(&srv, &t, proto, None).body), sha256(&v1), "{proto}: all version 1 now");

        // Slice 0 of version 1 is stored and fresh; the origin goes to version 2 and
        // slice 1 is gone: an answer that started from version 1 cannot go on with
        // version 2's slice 1, and is cut rather than mixed.
        let t2 = format!("/obj/{name}?size={n}&cc=max-age%3D3600");
        assert_part(&get(&srv, &t2, proto, Some("0-9")), &v1, 0..10, proto);
        bump();
        let out = curl(&[proto, "-o", "/dev/null", "-w", "%{size_download}", &srv.url(&t2)]);
        let got: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
        assert!(!out.status.success() && got < n, "{proto}: a mixed answer must not complete ({got} bytes)");
        assert!(srv.stderr().contains("not mixed"), "{proto}: the refusal is logged");
        // The stale slice 0 was purged: the next answer is version 2 throughout.
        let whole = get(&srv, &t2, proto, None);
        assert_whole(&whole, &v2, proto);
        assert_eq!(whole.header("etag"), Some(format!("\"{name}-2\"").as_str()), "{proto}");
    }
}

#[test]
fn an_origin_that_ignores_range_is_answered_from_its_body_and_never_stored() {
    let (up, _dir, srv) = setup();
    let n = 3 * M;
    let source = object(0, n);
    for proto in PROTOCOLS {
        let t = format!("/obj/ignore{proto}?size={n}&ranges=ignore");
        for _ in 0..2 {
            let r = get(&srv, &t, proto, Some("1500000-1500099"));
            assert_part(&r, &source, 1_500_000..1_500_100, proto);
            assert_eq!(cache_status(&r), "ktlsd; fwd=miss", "{proto}");
        }
        assert_eq!(asked(&up, &t), [slice(1), slice(1)], "nothing stored: asked again ({proto})");
        let whole = get(&srv, &t, proto, None);
        assert_whole(&whole, &source, proto);
        assert!(srv.stderr().contains("ignored Range"), "{proto}: logged");
    }
}

#[test]
fn a_wrong_content_range_is_refused_and_never_stored() {
    let (up, _dir, srv) = setup();
    let n = 3 * M;
    assert!(!srv.stderr().contains("not the slice asked for"));
    for proto in PROTOCOLS {
        let t = format!("/obj/wrong{proto}?size={n}&ranges=wrong");
        for _ in 0..2 {
            let r = get(&srv, &t, proto, Some("1500000-1500099"));
            assert_eq!(r.status, 502, "{proto}: {:?}", r.headers);
        }
        // The refused answer marks the upstream failed for fail_timeout (passive
        // health): the later requests may get their 502 without asking it.
        let seen = asked(&up, &t);
        assert!(seen.len() <= 2 && seen.iter().all(|r| *r == slice(1)), "{proto}: {seen:?}");
        assert!(srv.stderr().contains("not the slice asked for"), "{proto}: logged");
    }
}

/// `POST /cache/purge?url=TARGET` on the admin socket `sock`: its status and body.
fn purge(sock: &Path, target: &str) -> (u16, String) {
    let url =
        format!("http://admin/cache/purge?url={}", target.replace('?', "%3F").replace('=', "%3D").replace('&', "%26"));
    let out = curl(&["-s", "-X", "POST", "--unix-socket", sock.to_str().unwrap(), "-w", "\n%{http_code}", &url]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or_else(|| panic!("curl: {text:?}"));
    (status.parse().unwrap_or(0), body.to_string())
}

#[test]
fn a_purge_removes_the_objects_slices() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("admin.sock");
    let (up, _cache, srv) = setup_with(&["--admin", sock.to_str().unwrap()]);
    let n = 5 * M;
    let source = object(0, n);
    let proto = "--http1.1";

    // Slices 0, 2 and 3 stored: slice 0 gives the size, the keys of slices 0 to 4 are purged.
    let t = format!("/obj/purged?size={n}");
    assert_part(&get(&srv, &t, proto, Some("2500000-3600000")), &source, 2_500_000..3_600_001, "fill");
    assert_part(&get(&srv, &t, proto, Some("0-9")), &source, 0..10, "fill");
    assert_eq!(cache_status(&get(&srv, &t, proto, Some("0-3600000"))), "ktlsd; fwd=miss", "slice 1 is missing");
    assert_eq!(cache_status(&get(&srv, &t, proto, Some("0-3600000"))), "ktlsd; hit");
    assert_eq!(asked(&up, &t), slices(&[2, 3, 0, 1]));
    let (status, body) = purge(&sock, &t);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("4 slice(s) removed"), "{body}");
    let again = get(&srv, &t, proto, Some("2500000-3600000"));
    assert_part(&again, &source, 2_500_000..3_600_001, "after the purge");
    assert_eq!(cache_status(&again), "ktlsd; fwd=miss", "after the purge");
    assert_eq!(asked(&up, &t), slices(&[2, 3, 0, 1, 2, 3]), "the slices are fetched again");

    // Slice 0 not stored: the index is walked for the object's slices.
    let t = format!("/obj/unseen?size={n}");
    assert_part(&get(&srv, &t, proto, Some("4200000-4200099")), &source, 4_200_000..4_200_100, "fill");
    let (status, body) = purge(&sock, &t);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("1 slice(s) removed"), "{body}");
    assert_eq!(purge(&sock, &t).0, 404, "nothing left");
    assert_part(&get(&srv, &t, proto, Some("4200000-4200099")), &source, 4_200_000..4_200_100, "again");
    assert_eq!(asked(&up, &t), slices(&[4, 4]), "fetched again after the purge");
}

/// The answer's `Age` in seconds.
fn age(r: &Response) -> Option<u64> {
    r.header("age").map(|v| v.parse().unwrap_or_else(|_| panic!("Age {v:?}")))
}

#[test]
fn a_sliced_hit_carries_the_age_of_its_oldest_slice() {
    let (_up, _dir, srv) = setup();
    let n = 5 * M;
    let source = object(0, n);
    for proto in PROTOCOLS {
        let t = format!("/obj/aged{proto}?size={n}");
        let fetched = get(&srv, &t, proto, Some("2200000-2200099"));
        assert_part(&fetched, &source, 2_200_000..2_200_100, proto);
        assert_eq!(age(&fetched), None, "{proto}: every byte from the upstream now");
        std::thread::sleep(Duration::from_millis(2200));
        assert_eq!(age(&get(&srv, &t, proto, Some("3200000-3200099"))), None, "{proto}");
        let young = get(&srv, &t, proto, Some("3200000-3200099"));
        assert_eq!(cache_status(&young), "ktlsd; hit", "{proto}");
        assert!(age(&young).is_some_and(|a| a <= 1), "{proto}: {:?}", young.headers);
        let old = get(&srv, &t, proto, Some("2200000-2200099"));
        assert!(age(&old).is_some_and(|a| (2..60).contains(&a)), "{proto}: {:?}", old.headers);
        // Slices 2 and 3: the older one's.
        let both = get(&srv, &t, proto, Some("2200000-3200099"));
        assert_part(&both, &source, 2_200_000..3_200_100, proto);
        assert_eq!(cache_status(&both), "ktlsd; hit", "{proto}");
        assert!(age(&both).is_some_and(|a| (2..60).contains(&a)), "{proto}: {:?}", both.headers);
    }
}

#[test]
fn conditionals_get_304_from_the_first_slice_validators() {
    let (up, _dir, srv) = setup();
    let n = 3 * M;
    let source = object(0, n);
    let modified = "Mon, 02 Nov 2026 10:00:00 GMT";
    for proto in PROTOCOLS {
        let name = format!("cond{}", &proto[2..]).replace('.', "");
        let t = format!("/obj/{name}?size={n}");
        let etag = format!("\"{name}-0\"");
        let ask = |fields: &[String]| {
            let mut args = vec![proto];
            for f in fields {
                args.extend(["-H", f.as_str()]);
            }
            fetch(&srv.url(&t), &args)
        };
        // A miss: slice 0 is fetched (and stored) for its validators.
        let first = ask(&[format!("If-None-Match: {etag}")]);
        assert_eq!((first.status, first.body.len()), (304, 0), "{proto}: {}", first.stderr);
        assert_eq!(first.header("etag"), Some(etag.as_str()), "{proto}");
        assert_eq!(cache_status(&first), "ktlsd; fwd=miss", "{proto}");
        assert_eq!(asked(&up, &t), [slice(0)], "{proto}");
        for (fields, want) in [
            (vec![format!("If-None-Match: {etag}")], 304),
            (vec![format!("If-None-Match: W/{etag}")], 304),
            (vec![format!("If-None-Match: \"other\", {etag}")], 304),
            (vec!["If-None-Match: \"other\"".to_string()], 200),
            (vec![format!("If-Modified-Since: {modified}")], 304),
            (vec!["If-Modified-Since: Mon, 02 Nov 2026 09:00:00 GMT".to_string()], 200),
            // If-None-Match takes precedence.
            (vec!["If-None-Match: \"other\"".to_string(), format!("If-Modified-Since: {modified}")], 200),
            // Conditionals come before the range.
            (vec![format!("If-None-Match: {etag}"), "Range: bytes=100-199".to_string()], 304),
        ] {
            let r = ask(&fields);
            assert_eq!(r.status, want, "{proto} {fields:?}: {}", r.stderr);
            if want == 304 {
                assert!(r.body.is_empty(), "{proto} {fields:?}");
                assert_eq!(r.header("etag"), Some(etag.as_str()), "{proto} {fields:?}");
                assert_eq!(r.header("last-modified"), Some(modified), "{proto} {fields:?}");
                assert_eq!(cache_status(&r), "ktlsd; hit", "{proto} {fields:?}");
                assert!(age(&r).is_some(), "{proto} {fields:?}: {:?}", r.headers);
                assert!(r.header("content-range").is_none(), "{proto} {fields:?}");
            } else {
                assert_whole(&r, &source, proto);
            }
        }
        // If-Range: a match lets the range through, another validator gets the whole object.
        let r = ask(&[format!("If-Range: {etag}"), "Range: bytes=100-199".to_string()]);
        assert_part(&r, &source, 100..200, proto);
        let r = ask(&["If-Range: \"other\"".to_string(), "Range: bytes=100-199".to_string()]);
        assert_whole(&r, &source, proto);
    }
}

#[test]
fn an_http3_client_gets_its_range_from_the_slices() {
    let (up, _dir, srv) = setup_with(&["--http3"]);
    let n = 5 * M;
    let source = object(0, n);
    let t = format!("/obj/quic?size={n}");
    let range = serde_json::json!([["range", "bytes=2500000-3600000"]]);
    for want in ["ktlsd; fwd=miss", "ktlsd; hit"] {
        let r = aioquic::requests(&srv, "localhost", &serde_json::json!([{"path": t, "headers": range}]));
        let got = &r["responses"][0];
        assert_eq!(got["status"], 206, "{r}");
        assert_eq!(aioquic::header(got, "content-range"), Some(format!("bytes 2500000-3600000/{n}").as_str()), "{r}");
        assert_eq!(got["len"], 1_100_001, "{r}");
        assert_eq!(got["sha256"], sha256(&source[2_500_000..3_600_001]), "{r}");
        assert_eq!(aioquic::header(got, "cache-status"), Some(want), "{r}");
    }
    assert_eq!(asked(&up, &t), slices(&[2, 3]));
}
