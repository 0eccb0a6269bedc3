//! `cache_slice`, end to end: the real binary in front of the Python origin of the
//! range fill tests (`tests/range_fill/origin.py`, which honours Range, logs every
//! request with its Range, changes an object's version on `/bump/NAME`, and can
//! ignore Range or answer a wrong one), curl as the client over HTTP/1.1 and
//! HTTP/2. A range in the middle of a 5 MiB object fetches only the 1 MiB slices it
//! spans; the same range again is a hit with the same bytes; a whole-object GET is
//! assembled from the slices, fetching only the missing ones; slices of two
//! versions are never mixed; an origin that ignores Range or answers the wrong one
//! never has a slice stored; a zero-length object and a range past the end.

use testkit::*;

#[path = "range_fill/client.rs"]
mod client;
use client::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const PROTOCOLS: [&str; 2] = ["--http1.1", "--http2"];

const M: usize = 1 << 20;

/// The origin, a cache directory, and ktlsd (one worker) caching `/obj/**` in
/// slices of 1 MiB.
fn setup() -> (ScriptUpstream, tempfile::TempDir, Server) {
    let up = origin();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[proxy]]\npath = \"/obj/**\"\nupstream = [{:?}]\ncache = true\ncache_slice = \"1m\"\n\n\
         [cache]\ndir = {:?}\nmax_size = \"256M\"\n",
        up.url(),
        dir.path().display().to_string()
    );
    let srv = origin::ktlsd(BIN, &config, &[]);
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
