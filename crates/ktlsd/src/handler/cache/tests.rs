//! The cache's API with real files in a temporary directory: storing, hits as
//! file-range responses, RFC 9111 rules, revalidation, RFC 5861, Vary, ranges and
//! conditionals, coalescing, purge, the index rebuild, corruption and eviction.

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant, SystemTime};

use http::HeaderMap;

use super::*;
use crate::handler::request::HeaderFields;
use crate::handler::{Body, Request, Response};

fn config(dir: &std::path::Path) -> Settings {
    Settings { dir: dir.to_path_buf(), max_size: 64 << 20, max_object_size: 1 << 20, ..Settings::default() }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn fields(list: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in list {
        h.append(http::HeaderName::from_bytes(n.as_bytes()).unwrap(), v.parse().unwrap());
    }
    h
}

fn response(status: u16, list: &[(&str, &str)]) -> http::response::Parts {
    let mut parts = http::Response::builder().status(status).body(()).unwrap().into_parts().0;
    parts.headers = fields(list);
    parts
}

/// Looks `key` up for `req`; on a miss stores `resp` with `body` received at `received`.
fn store(
    cache: &Arc<Cache>,
    key: &Key,
    req: &HeaderMap,
    resp: &http::response::Parts,
    body: &[u8],
    received: SystemTime,
) -> Result<(), NotStored> {
    let Lookup::Miss(fill) = rt().block_on(cache.lookup(key, req)) else { panic!("expected a miss") };
    let mut w = fill.admit(resp, received)?;
    w.write(body).unwrap();
    w.commit().unwrap();
    Ok(())
}

fn get(path: &str, list: &[(&str, &str)]) -> Request {
    let mut f = HeaderFields::default();
    for (n, v) in list {
        f.add(n, v);
    }
    Request { headers: f.parse(), ..Request::new(crate::handler::Method::Get, path) }
}

/// The body a response would send.
fn body_of(r: &Response) -> Vec<u8> {
    match &r.body {
        Body::File { found, range } => {
            let mut buf = vec![0u8; (range.end - range.start) as usize];
            found.file.read_exact_at(&mut buf, range.start).unwrap();
            buf
        }
        Body::Bytes(b) => b.clone(),
        Body::Empty => Vec::new(),
        Body::Parts { .. } => panic!("a multipart body was not expected here"),
    }
}

fn field(r: &Response, name: &str) -> Option<String> {
    r.headers.iter().find(|h| h.name().eq_ignore_ascii_case(name)).map(|h| h.to_string())
}

fn lookup(cache: &Arc<Cache>, key: &Key, req: &HeaderMap) -> Lookup {
    rt().block_on(cache.lookup(key, req))
}

#[test]
fn a_stored_response_is_a_hit_sent_from_the_file_at_the_body_offset() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let key = Key::new("", "/a?x=1");
    let resp = response(
        200,
        &[
            ("cache-control", "max-age=60"),
            ("content-type", "text/plain"),
            ("etag", "\"v1\""),
            ("server", "origin"),
            ("connection", "close"),
        ],
    );
    store(&cache, &key, &HeaderMap::new(), &resp, b"hello world", SystemTime::now()).unwrap();
    let Lookup::Hit(hit) = lookup(&cache, &key, &HeaderMap::new()) else { panic!("expected a hit") };
    let r = hit.into_response(&get("/a", &[]), &CacheStatus::hit());
    assert_eq!(r.status.0, 200);
    assert_eq!(body_of(&r), b"hello world");
    let Body::File { range, .. } = &r.body else { panic!("a hit's body is the entry file") };
    assert!(range.start > entry::PREFIX, "the body starts after the head: {range:?}");
    assert_eq!(field(&r, "content-type").as_deref(), Some("text/plain"));
    assert_eq!(field(&r, "cache-status").as_deref(), Some("ktlsd; hit"));
    assert_eq!(field(&r, "age").as_deref(), Some("0"));
    assert_eq!(field(&r, "content-length").as_deref(), Some("11"));
    assert_eq!(field(&r, "server"), None, "the codec writes its own Server");
    assert_eq!(field(&r, "connection"), None, "hop-by-hop fields are not stored");
    // Another target, or another site's host, is another key.
    assert!(matches!(lookup(&cache, &Key::new("", "/a?x=2"), &HeaderMap::new()), Lookup::Miss(_)));
    assert!(matches!(lookup(&cache, &Key::new("b.example", "/a?x=1"), &HeaderMap::new()), Lookup::Miss(_)));
    let f = cache.figures();
    assert_eq!((f.hits, f.misses, f.entries), (1, 3, 1));
    assert!(f.bytes > 11);
}

/// Status, response fields, request fields, and whether it is stored.
type Case<'a> = (u16, Vec<(&'a str, &'a str)>, &'a [(&'a str, &'a str)], Result<(), NotStored>);

#[test]
fn what_is_stored_follows_rfc_9111() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let lm = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(86_400));
    let auth = [("authorization", "Basic eDp5")];
    let cases: Vec<Case> = vec![
        (200, vec![("cache-control", "max-age=60")], &[][..], Ok(())),
        (200, vec![("expires", "Thu, 01 Jan 2099 00:00:00 GMT")], &[], Ok(())),
        (200, vec![("last-modified", lm.as_str())], &[], Ok(())),
        (404, vec![], &[], Ok(())),
        (200, vec![("cache-control", "no-store")], &[], Err(NotStored::NotStorable)),
        (200, vec![("cache-control", "private, max-age=60")], &[], Err(NotStored::NotStorable)),
        (200, vec![("cache-control", "max-age=60")], &[("cache-control", "no-store")], Err(NotStored::NotStorable)),
        (200, vec![("cache-control", "max-age=60")], &auth, Err(NotStored::NotStorable)),
        (200, vec![("cache-control", "public, max-age=60")], &auth, Ok(())),
        (200, vec![("cache-control", "s-maxage=60")], &auth, Ok(())),
        (302, vec![("location", "/b")], &[], Err(NotStored::NotStorable)),
        (206, vec![("cache-control", "max-age=60")], &[], Err(NotStored::NotStorable)),
        (200, vec![("cache-control", "max-age=60"), ("set-cookie", "a=b")], &[], Err(NotStored::SetCookie)),
        (200, vec![("cache-control", "max-age=60"), ("vary", "*")], &[], Err(NotStored::VaryAll)),
        (200, vec![("cache-control", "max-age=60"), ("content-length", "2000000")], &[], Err(NotStored::TooLarge)),
    ];
    for (i, (status, resp, req, want)) in cases.into_iter().enumerate() {
        let key = Key::new("", &format!("/{i}"));
        let got = store(&cache, &key, &fields(req), &response(status, &resp), b"", SystemTime::now());
        assert_eq!(got, want, "case {i}: {status} {resp:?} for {req:?}");
    }
    assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0, "refused fills leave no file");
}

#[test]
fn a_stale_entry_is_revalidated_and_a_304_refreshes_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let key = Key::new("", "/r");
    let lm = "Tue, 14 Nov 2023 22:13:20 GMT";
    let resp =
        response(200, &[("cache-control", "max-age=10"), ("etag", "\"v1\""), ("last-modified", lm), ("x-a", "1")]);
    store(&cache, &key, &HeaderMap::new(), &resp, b"body", SystemTime::now() - Duration::from_secs(20)).unwrap();
    let Lookup::Stale(stale) = lookup(&cache, &key, &HeaderMap::new()) else { panic!("expected stale") };
    assert!(!stale.serve_while_revalidating);
    assert!(stale.fill.as_ref().is_some_and(FillGuard::leads));
    assert_eq!(stale.revalidate.get("if-none-match").unwrap(), "\"v1\"");
    assert_eq!(stale.revalidate.get("if-modified-since").unwrap(), lm);
    // A 304 for another representation refreshes nothing.
    assert!(cache.refresh(&stale.hit.entry(), &fields(&[("etag", "\"v2\"")])).is_none());
    assert!(
        cache.refresh(&stale.hit.entry(), &fields(&[("x-a", "3")])).is_none(),
        "a 304 without the validators selects nothing"
    );
    let refreshed = cache
        .refresh(&stale.hit.entry(), &fields(&[("etag", "\"v1\""), ("cache-control", "max-age=100"), ("x-a", "2")]));
    let hit = refreshed.expect("a matching 304 refreshes the entry");
    let status = CacheStatus { fwd: Some(Fwd::Stale), fwd_status: Some(304), ..CacheStatus::default() };
    let r = hit.into_response(&get("/r", &[]), &status);
    assert_eq!(body_of(&r), b"body", "the body is kept");
    assert_eq!(field(&r, "x-a").as_deref(), Some("2"), "the 304's fields replace the stored ones");
    assert_eq!(field(&r, "cache-status").as_deref(), Some("ktlsd; fwd=stale; fwd-status=304"));
    drop(stale);
    assert!(matches!(lookup(&cache, &key, &HeaderMap::new()), Lookup::Hit(_)), "fresh again for 100 s");
    // The refreshed head was written to disk: a new cache reads it back.
    drop(cache);
    let again = Cache::open(&config(dir.path())).unwrap();
    let Lookup::Hit(hit) = lookup(&again, &key, &HeaderMap::new()) else { panic!("the refresh is on disk") };
    assert_eq!(body_of(&hit.into_response(&get("/r", &[]), &CacheStatus::hit())), b"body");
    assert_eq!(again.figures().entries, 1);
}

#[test]
fn stale_while_revalidate_and_stale_if_error_have_their_windows() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let old = SystemTime::now() - Duration::from_secs(30);
    for (i, cc, req, swr, on_error) in [
        (0, "max-age=10, stale-while-revalidate=60", &[][..], true, false),
        (1, "max-age=10, stale-while-revalidate=5", &[], false, false),
        (2, "max-age=10, stale-while-revalidate=60, must-revalidate", &[], false, false),
        (3, "max-age=10, stale-while-revalidate=60", &[("cache-control", "no-cache")], false, false),
        (4, "max-age=10, stale-if-error=60", &[], false, true),
        (5, "max-age=10, stale-if-error=5", &[], false, false),
        (6, "max-age=10", &[("cache-control", "stale-if-error=100")], false, true),
        (7, "max-age=10", &[], false, false),
    ] {
        let key = Key::new("", &format!("/s{i}"));
        store(&cache, &key, &HeaderMap::new(), &response(200, &[("cache-control", cc)]), b"x", old).unwrap();
        let Lookup::Stale(stale) = lookup(&cache, &key, &fields(req)) else { panic!("case {i}: expected stale") };
        assert_eq!(stale.serve_while_revalidating, swr, "case {i}: {cc}");
        assert_eq!(stale.on_error(&cache, &fields(req)), on_error, "case {i}: {cc}");
    }
    assert_eq!(cache.figures().stale, 3, "one served while revalidating, two on error");
}

#[test]
fn vary_keeps_one_variant_per_request_field_value() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let key = Key::new("a.example", "/v");
    let vary = |enc: &str| {
        response(200, &[("cache-control", "max-age=60"), ("vary", "Accept-Encoding"), ("content-encoding", enc)])
    };
    let gzip = fields(&[("accept-encoding", "gzip")]);
    let br = fields(&[("accept-encoding", "br")]);
    store(&cache, &key, &gzip, &vary("gzip"), b"GZ", SystemTime::now()).unwrap();
    store(&cache, &key, &br, &vary("br"), b"BR", SystemTime::now()).unwrap();
    for (req, want) in [(&gzip, b"GZ"), (&br, b"BR")] {
        let Lookup::Hit(hit) = lookup(&cache, &key, req) else { panic!("each variant is a hit") };
        assert_eq!(body_of(&hit.into_response(&get("/v", &[]), &CacheStatus::hit())), want);
    }
    assert!(matches!(lookup(&cache, &key, &HeaderMap::new()), Lookup::Miss(_)), "no Accept-Encoding: another variant");
    assert_eq!(cache.figures().entries, 2);
    // Purge removes every variant, from the index and the disk.
    assert_eq!(cache.purge(&key), 2);
    assert!(matches!(lookup(&cache, &key, &gzip), Lookup::Miss(_)));
    assert_eq!(cache.purge(&key), 0);
    assert_eq!(cache.figures().entries, 0);
}

#[test]
fn ranges_and_conditionals_are_answered_from_the_stored_response() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let key = Key::new("", "/c");
    let lm = "Tue, 14 Nov 2023 22:13:20 GMT";
    let resp = response(200, &[("cache-control", "max-age=60"), ("etag", "\"v1\""), ("last-modified", lm)]);
    store(&cache, &key, &HeaderMap::new(), &resp, b"0123456789", SystemTime::now()).unwrap();
    let answer = |req: Request| {
        let Lookup::Hit(hit) = lookup(&cache, &key, &HeaderMap::new()) else { panic!("expected a hit") };
        hit.into_response(&req, &CacheStatus::hit())
    };
    for (headers, status, body, range) in [
        (vec![("range", "bytes=2-4")], 206, &b"234"[..], Some("bytes 2-4/10")),
        (vec![("range", "bytes=-3")], 206, b"789", Some("bytes 7-9/10")),
        (vec![("range", "bytes=20-")], 416, b"", Some("bytes */10")),
        (vec![("range", "bytes=2-4"), ("if-range", "\"v0\"")], 200, b"0123456789", None),
        (vec![("if-none-match", "\"v1\"")], 304, b"", None),
        (vec![("if-none-match", "\"v0\"")], 200, b"0123456789", None),
        (vec![("if-modified-since", lm)], 304, b"", None),
        (vec![("if-match", "\"v0\"")], 412, b"", None),
    ] {
        let r = answer(get("/c", &headers));
        assert_eq!(r.status.0, status, "{headers:?}");
        if status != 416 && status != 412 {
            assert_eq!(body_of(&r), body, "{headers:?}");
        }
        assert_eq!(field(&r, "content-range").as_deref(), range, "{headers:?}");
        assert_eq!(field(&r, "cache-status").as_deref(), Some("ktlsd; hit"), "{headers:?}");
    }
    let head = Request::new(crate::handler::Method::Head, "/c");
    let r = answer(head);
    assert!(matches!(r.body, Body::Empty));
    assert_eq!(field(&r, "content-length").as_deref(), Some("10"));
}

#[test]
fn concurrent_misses_make_one_fill_and_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let key = Key::new("", "/coalesced");
    rt().block_on(async {
        let Lookup::Miss(fill) = cache.lookup(&key, &HeaderMap::new()).await else { panic!("first is a miss") };
        assert!(fill.leads());
        let waiters: Vec<_> = (0..10)
            .map(|_| {
                let (cache, key) = (cache.clone(), key.clone());
                tokio::spawn(async move { cache.lookup(&key, &HeaderMap::new()).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut w = fill.admit(&response(200, &[("cache-control", "max-age=60")]), SystemTime::now()).unwrap();
        w.write(b"once").unwrap();
        w.commit().unwrap();
        for waiter in waiters {
            let Lookup::Hit(hit) = waiter.await.unwrap() else { panic!("waiters are served from the fill") };
            assert_eq!(body_of(&hit.into_response(&get("/coalesced", &[]), &CacheStatus::hit())), b"once");
        }
    });
    let f = cache.figures();
    assert_eq!((f.misses, f.hits, f.coalesced), (1, 10, 10));

    // An abandoned fill wakes its waiters at once; they go upstream (the first to wake leads the next fill).
    let key = Key::new("", "/abandoned");
    rt().block_on(async {
        let Lookup::Miss(fill) = cache.lookup(&key, &HeaderMap::new()).await else { panic!("a miss") };
        let (c, k) = (cache.clone(), key.clone());
        let waiter = tokio::spawn(async move { c.lookup(&k, &HeaderMap::new()).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        drop(fill);
        let Lookup::Miss(_) = waiter.await.unwrap() else { panic!("a miss of its own") };
        assert!(started.elapsed() < COALESCE_WAIT);
    });
}

#[test]
fn bodies_that_are_too_large_or_not_whole_are_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&Settings { max_object_size: 8, ..config(dir.path()) }).unwrap();
    let ok = response(200, &[("cache-control", "max-age=60")]);
    let Lookup::Miss(fill) = lookup(&cache, &Key::new("", "/big"), &HeaderMap::new()) else { panic!() };
    let mut w = fill.admit(&ok, SystemTime::now()).unwrap();
    w.write(b"12345").unwrap();
    assert!(matches!(w.write(b"6789"), Err(fill::WriteError::TooLarge)));
    assert!(matches!(w.commit(), Err(fill::WriteError::Abandoned)));
    let short = response(200, &[("cache-control", "max-age=60"), ("content-length", "5")]);
    let Lookup::Miss(fill) = lookup(&cache, &Key::new("", "/short"), &HeaderMap::new()) else { panic!() };
    let mut w = fill.admit(&short, SystemTime::now()).unwrap();
    w.write(b"123").unwrap();
    assert!(matches!(w.commit(), Err(fill::WriteError::Length { got: 3, want: 5 })));
    let Lookup::Miss(fill) = lookup(&cache, &Key::new("", "/dropped"), &HeaderMap::new()) else { panic!() };
    let mut w = fill.admit(&ok, SystemTime::now()).unwrap();
    w.write(b"12").unwrap();
    drop(w);
    assert_eq!(cache.figures().entries, 0);
    assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0, "no partial entry is left");
    for k in ["/big", "/short", "/dropped"] {
        assert!(matches!(lookup(&cache, &Key::new("", k), &HeaderMap::new()), Lookup::Miss(_)));
    }
}

/// Waits until `done` holds (the background threads), at most 10 s.
fn until(done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_index_is_rebuilt_from_disk_and_corrupt_entries_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<_> = {
        let cache = Cache::open(&config(dir.path())).unwrap();
        for i in 0..4 {
            let resp = response(200, &[("cache-control", "max-age=600")]);
            store(&cache, &Key::new("", &format!("/{i}")), &HeaderMap::new(), &resp, b"abcdef", SystemTime::now())
                .unwrap();
        }
        (0..4).map(|i| cache.layout.entry(&Key::new("", &format!("/{i}")).primary, "0")).collect()
    };
    // Entry 1 truncated, entry 2's head altered, entry 3 with a body longer than its head says.
    let f = std::fs::OpenOptions::new().write(true).open(&paths[1]).unwrap();
    f.set_len(f.metadata().unwrap().len() - 2).unwrap();
    std::fs::OpenOptions::new().write(true).open(&paths[2]).unwrap().write_all_at(b"X", entry::PREFIX + 3).unwrap();
    let f = std::fs::OpenOptions::new().append(true).open(&paths[3]).unwrap();
    f.write_all_at(b"more", f.metadata().unwrap().len()).unwrap();
    std::fs::write(dir.path().join("tmp").join("left-over"), b"partial").unwrap();

    let cache = Cache::open(&config(dir.path())).unwrap();
    assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0, "tmp/ is emptied at start");
    until(|| cache.rebuilt.load(Relaxed));
    assert_eq!(cache.figures().entries, 1);
    assert!(matches!(lookup(&cache, &Key::new("", "/0"), &HeaderMap::new()), Lookup::Hit(_)));
    for (i, p) in paths.iter().enumerate().skip(1) {
        assert!(!p.exists(), "corrupt entry {i} is deleted");
        assert!(matches!(lookup(&cache, &Key::new("", &format!("/{i}")), &HeaderMap::new()), Lookup::Miss(_)));
    }
}

#[test]
fn a_lookup_before_the_rebuild_reads_the_keys_files() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::new("", "/early");
    {
        let cache = Cache::open(&config(dir.path())).unwrap();
        store(
            &cache,
            &key,
            &HeaderMap::new(),
            &response(200, &[("cache-control", "max-age=60")]),
            b"e",
            SystemTime::now(),
        )
        .unwrap();
    }
    let cache = Cache::open(&config(dir.path())).unwrap();
    cache.rebuilt.store(false, Relaxed);
    cache.lock_index().remove_primary(&key.primary);
    assert!(matches!(lookup(&cache, &key, &HeaderMap::new()), Lookup::Hit(_)));
}

#[test]
fn the_least_recently_used_entries_are_evicted_past_max_size() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&Settings { max_size: 1 << 20, max_object_size: 1 << 20, ..config(dir.path()) }).unwrap();
    until(|| cache.rebuilt.load(Relaxed));
    let body = vec![7u8; 400 << 10];
    let resp = response(200, &[("cache-control", "max-age=600")]);
    let key = |i: usize| Key::new("", &format!("/e{i}"));
    store(&cache, &key(0), &HeaderMap::new(), &resp, &body, SystemTime::now()).unwrap();
    store(&cache, &key(1), &HeaderMap::new(), &resp, &body, SystemTime::now()).unwrap();
    assert!(matches!(lookup(&cache, &key(0), &HeaderMap::new()), Lookup::Hit(_)), "0 used after 1");
    store(&cache, &key(2), &HeaderMap::new(), &resp, &body, SystemTime::now()).unwrap();
    until(|| cache.figures().evictions == 1);
    assert!(cache.figures().bytes <= (1 << 20) / 10 * 9);
    assert!(!cache.layout.entry(&key(1).primary, "0").exists(), "the least recently used entry is gone");
    assert!(matches!(lookup(&cache, &key(0), &HeaderMap::new()), Lookup::Hit(_)));
    assert!(matches!(lookup(&cache, &key(2), &HeaderMap::new()), Lookup::Hit(_)));
}

#[test]
fn cache_status_values() {
    let s = |hit, fwd, fwd_status, stored, collapsed, detail| CacheStatus {
        hit,
        fwd,
        fwd_status,
        stored,
        collapsed,
        detail,
    };
    for (status, want) in [
        (CacheStatus::hit(), "ktlsd; hit"),
        (CacheStatus { stored: true, ..CacheStatus::fwd(Fwd::Miss) }, "ktlsd; fwd=miss; stored"),
        (s(false, Some(Fwd::Stale), Some(304), false, false, None), "ktlsd; fwd=stale; fwd-status=304"),
        (
            s(true, None, None, false, false, Some("stale-while-revalidate")),
            "ktlsd; hit; detail=stale-while-revalidate",
        ),
        (s(true, None, None, false, true, None), "ktlsd; hit; collapsed"),
        (
            s(false, Some(Fwd::Stale), Some(502), false, false, Some("stale-if-error")),
            "ktlsd; fwd=stale; fwd-status=502; detail=stale-if-error",
        ),
        (CacheStatus::fwd(Fwd::Bypass), "ktlsd; fwd=bypass"),
        (CacheStatus::fwd(Fwd::Method), "ktlsd; fwd=method"),
        (CacheStatus::fwd(Fwd::VaryMiss), "ktlsd; fwd=vary-miss"),
        (CacheStatus::fwd(Fwd::Request), "ktlsd; fwd=request"),
    ] {
        assert_eq!(cache_status(&status), want);
    }
}

#[test]
fn other_stored_statuses_are_sent_whole() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    for (status, body, length) in [(404, &b"not here"[..], Some("8")), (301, b"", Some("0")), (204, b"", None)] {
        let key = Key::new("", &format!("/{status}"));
        let resp = response(status, &[("cache-control", "max-age=60"), ("location", "/x")]);
        store(&cache, &key, &HeaderMap::new(), &resp, body, SystemTime::now()).unwrap();
        let Lookup::Hit(hit) = lookup(&cache, &key, &HeaderMap::new()) else { panic!("{status} is stored") };
        let r = hit.into_response(&get("/", &[("range", "bytes=0-1"), ("if-none-match", "*")]), &CacheStatus::hit());
        assert_eq!(r.status.0, status, "conditionals and ranges apply to a stored 200 only");
        assert_eq!(body_of(&r), body);
        assert_eq!(field(&r, "content-length").as_deref(), length, "{status}");
        assert_eq!(field(&r, "location").as_deref(), Some("/x"));
    }
}

#[test]
fn the_slices_of_an_object_are_found_by_their_keys_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let (object, other) = (Key::new("", "/v"), Key::new("", "/v?x"));
    let part =
        |i: u64| response(200, &[("cache-control", "max-age=60"), ("content-range", &format!("bytes {i}-{i}/9"))]);
    let none = HeaderMap::new();
    for (key, i) in [(object.slice(1 << 20, 2), 2), (object.slice(1 << 20, 5), 5), (other.slice(1 << 20, 2), 2)] {
        store(&cache, &key, &none, &part(i), b"s", SystemTime::now()).unwrap();
    }
    store(&cache, &object.slice(1 << 16, 2), &none, &part(2), b"s", SystemTime::now()).unwrap();
    assert_eq!(cache.stored_field(&object.slice(1 << 20, 5), "content-range").as_deref(), Some("bytes 5-5/9"));
    assert_eq!(cache.stored_field(&object.slice(1 << 20, 0), "content-range"), None);
    let fresh = rt().block_on(cache.fresh_age(&object.slice(1 << 20, 2), &none, false));
    assert!(fresh.is_some_and(|a| a < 5), "{fresh:?}");
    assert_eq!(rt().block_on(cache.fresh_age(&object.slice(1 << 20, 3), &none, false)), None);
    // The object's slices of that size only: not another object's, nor slices of another size.
    assert_eq!(cache.purge_prefix(&object.slices(1 << 20)), 2);
    assert_eq!(cache.purge_prefix(&object.slices(1 << 20)), 0);
    assert_eq!(cache.figures().entries, 2);
    assert!(matches!(lookup(&cache, &object.slice(1 << 20, 5), &none), Lookup::Miss(_)));
}

#[test]
fn a_fill_under_way_when_its_key_is_purged_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let ok = response(200, &[("cache-control", "max-age=60")]);
    let (key, other) = (Key::new("", "/purged"), Key::new("", "/other"));
    let Lookup::Miss(fill) = lookup(&cache, &key, &HeaderMap::new()) else { panic!() };
    let Lookup::Miss(other_fill) = lookup(&cache, &other, &HeaderMap::new()) else { panic!() };
    let mut w = fill.admit(&ok, SystemTime::now()).unwrap();
    w.write(b"old").unwrap();
    assert_eq!(cache.purge(&key), 0);
    assert!(matches!(w.commit(), Err(fill::WriteError::Purged)));
    let mut w = other_fill.admit(&ok, SystemTime::now()).unwrap();
    w.write(b"kept").unwrap();
    w.commit().expect("a purge of another key does not stop this fill");
    assert!(matches!(lookup(&cache, &key, &HeaderMap::new()), Lookup::Miss(_)));
    assert!(matches!(lookup(&cache, &other, &HeaderMap::new()), Lookup::Hit(_)));
    assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
}

#[test]
fn purges_are_remembered_for_fills_that_began_before_them() {
    let mut purges = Purges::default();
    let (a, b) = ([1u8; 32], [2u8; 32]);
    purges.record(a);
    assert!(purges.purged_since(&a, 0));
    assert!(!purges.purged_since(&b, 0));
    assert!(!purges.purged_since(&a, 1), "a fill that began after the purge");
    for _ in 0..Purges::KEPT {
        purges.record(b);
    }
    assert!(purges.purged_since(&a, 0), "older than every purge remembered: refused whatever its key");
    assert!(!purges.purged_since(&a, purges.generation - 1));
}

#[test]
fn lookups_say_why_they_go_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let status = |l: &Lookup| match l {
        Lookup::Hit(h) => cache_status(&h.cache_status()),
        Lookup::Stale(s) => {
            format!("{:?} {}", s.fwd, s.fill.as_ref().map(|f| cache_status(&f.cache_status(true))).unwrap_or_default())
        }
        Lookup::Miss(f) => cache_status(&f.cache_status(false)),
    };
    let key = Key::new("", "/why");
    assert_eq!(status(&lookup(&cache, &key, &HeaderMap::new())), "ktlsd; fwd=miss");
    let vary = response(200, &[("cache-control", "max-age=60"), ("vary", "accept-language")]);
    store(&cache, &key, &fields(&[("accept-language", "fr")]), &vary, b"fr", SystemTime::now()).unwrap();
    assert_eq!(status(&lookup(&cache, &key, &fields(&[("accept-language", "de")]))), "ktlsd; fwd=vary-miss");
    let fr = fields(&[("accept-language", "fr")]);
    assert_eq!(status(&lookup(&cache, &key, &fr)), "ktlsd; hit");
    let no_cache = fields(&[("accept-language", "fr"), ("cache-control", "no-cache")]);
    assert_eq!(status(&lookup(&cache, &key, &no_cache)), "Request ktlsd; fwd=request; stored");
    let old = SystemTime::now() - Duration::from_secs(100);
    store(
        &cache,
        &Key::new("", "/old"),
        &HeaderMap::new(),
        &response(200, &[("cache-control", "max-age=1")]),
        b"",
        old,
    )
    .unwrap();
    assert_eq!(status(&lookup(&cache, &Key::new("", "/old"), &HeaderMap::new())), "Stale ktlsd; fwd=stale; stored");
    // A waiter served from another's fill is a collapsed hit.
    let key = Key::new("", "/together");
    rt().block_on(async {
        let Lookup::Miss(fill) = cache.lookup(&key, &HeaderMap::new()).await else { panic!() };
        let (c, k) = (cache.clone(), key.clone());
        let waiter = tokio::spawn(async move { c.lookup(&k, &HeaderMap::new()).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut w = fill.admit(&response(200, &[("cache-control", "max-age=60")]), SystemTime::now()).unwrap();
        w.write(b"x").unwrap();
        w.commit().unwrap();
        assert_eq!(status(&waiter.await.unwrap()), "ktlsd; hit; collapsed");
    });
}

#[test]
fn a_304_does_not_refresh_an_entry_replaced_or_purged_since_the_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let key = Key::new("", "/replaced");
    let old = SystemTime::now() - Duration::from_secs(100);
    let resp = |tag: &str| response(200, &[("cache-control", "max-age=10"), ("etag", tag)]);
    store(&cache, &key, &HeaderMap::new(), &resp("\"a\""), b"first", old).unwrap();
    let Lookup::Stale(first) = lookup(&cache, &key, &HeaderMap::new()) else { panic!("stale") };
    let entry = first.hit.entry();
    // Another response replaces the file (same key, same variant).
    let Some(fill) = first.fill else { panic!("the lookup leads the refill") };
    let mut w = fill.admit(&resp("\"a\""), old).unwrap();
    w.write(b"second body").unwrap();
    w.commit().unwrap();
    assert!(
        cache.refresh(&entry, &fields(&[("etag", "\"a\"")])).is_none(),
        "the old file's offsets are not the new one's"
    );
    let Lookup::Stale(second) = lookup(&cache, &key, &HeaderMap::new()) else { panic!("stale") };
    let entry = second.hit.entry();
    drop(second);
    assert_eq!(cache.purge(&key), 1);
    assert!(cache.refresh(&entry, &fields(&[("etag", "\"a\"")])).is_none(), "purged since the lookup");
    assert!(matches!(lookup(&cache, &key, &HeaderMap::new()), Lookup::Miss(_)));
}

/// The file of `key`'s entry (no Vary) and where its body starts.
fn body_at(cache: &Cache, key: &Key) -> (std::path::PathBuf, u64) {
    let path = cache.layout.entry(&key.primary, "0");
    let (_, _, parsed) = entry::open(&path).unwrap();
    (path, parsed.body_offset)
}

fn flip(path: &std::path::Path, at: u64) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x20], at).unwrap();
}

#[test]
fn a_truncated_entry_held_open_is_dropped_on_its_next_hit() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let key = Key::new("", "/t");
    let body = vec![b'a'; 200_000];
    store(
        &cache,
        &key,
        &HeaderMap::new(),
        &response(200, &[("cache-control", "max-age=600")]),
        &body,
        SystemTime::now(),
    )
    .unwrap();
    let Lookup::Hit(hit) = lookup(&cache, &key, &HeaderMap::new()) else { panic!("stored") };
    assert_eq!(body_of(&hit.into_response(&get("/t", &[]), &CacheStatus::hit())), body, "held open now");
    let (path, offset) = body_at(&cache, &key);
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(offset + 1000).unwrap();
    assert!(matches!(lookup(&cache, &key, &HeaderMap::new()), Lookup::Miss(_)), "a truncated entry is a miss");
    assert!(!path.exists(), "and is deleted");
    assert_eq!(cache.figures().entries, 0);
}

#[test]
fn a_changed_body_is_found_on_the_first_hit_after_start_and_on_sampled_hits() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::new("", "/f");
    let fresh = response(200, &[("cache-control", "max-age=600")]);
    let (path, offset) = {
        let cache = Cache::open(&Settings { verify_sample: 0, ..config(dir.path()) }).unwrap();
        store(&cache, &key, &HeaderMap::new(), &fresh, b"hello, world", SystemTime::now()).unwrap();
        let at = body_at(&cache, &key);
        flip(&at.0, at.1 + 4);
        // Written by this process and not sampled: served as it is.
        assert!(matches!(lookup(&cache, &key, &HeaderMap::new()), Lookup::Hit(_)));
        at
    };
    // After a restart the first hit reads the body back: the flipped byte is found.
    let cache = Cache::open(&Settings { verify_sample: 0, ..config(dir.path()) }).unwrap();
    assert!(matches!(lookup(&cache, &key, &HeaderMap::new()), Lookup::Miss(_)));
    assert!(!path.exists(), "the changed entry is deleted");
    // With every hit sampled, a change after the first hit is found without a restart.
    let cache = Cache::open(&Settings { verify_sample: 1_000_000, ..config(dir.path()) }).unwrap();
    let key = Key::new("", "/g");
    store(&cache, &key, &HeaderMap::new(), &fresh, b"hello, world", SystemTime::now()).unwrap();
    for _ in 0..3 {
        let Lookup::Hit(hit) = lookup(&cache, &key, &HeaderMap::new()) else { panic!("whole entries are hits") };
        assert_eq!(body_of(&hit.into_response(&get("/g", &[]), &CacheStatus::hit())), b"hello, world");
    }
    let (path, offset2) = body_at(&cache, &key);
    assert_eq!(offset, offset2);
    flip(&path, offset + 11);
    assert!(matches!(lookup(&cache, &key, &HeaderMap::new()), Lookup::Miss(_)));
    assert!(!path.exists());
}

#[test]
fn a_fill_that_fails_leaves_no_temporary_file_and_is_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&Settings { max_object_size: 100, ..config(dir.path()) }).unwrap();
    let tmp_files = || std::fs::read_dir(dir.path().join("tmp")).unwrap().count();
    let resp = response(200, &[("cache-control", "max-age=600"), ("content-length", "10")]);
    // Too large, too short for its Content-Length, purged, dropped midway.
    let outcomes: Vec<Box<dyn Fn(EntryWriter) -> bool>> = vec![
        Box::new(|mut w| w.write(&[0u8; 101]).is_err() && w.commit().is_err()),
        Box::new(|mut w| w.write(b"short").is_ok() && w.commit().is_err()),
        Box::new(|mut w| {
            w.write(b"0123456789").unwrap();
            cache.purge(&Key::new("", "/p"));
            w.commit().is_err()
        }),
        Box::new(|mut w| w.write(b"01234").is_ok()),
    ];
    for (i, outcome) in outcomes.iter().enumerate() {
        let key = Key::new("", "/p");
        let Lookup::Miss(fill) = lookup(&cache, &key, &HeaderMap::new()) else { panic!("nothing is stored") };
        let w = fill.admit(&resp, SystemTime::now()).unwrap();
        assert_eq!(tmp_files(), 0, "admitting writes nothing yet");
        assert!(outcome(w), "case {i}");
        assert_eq!(tmp_files(), 0, "case {i} leaves no temporary file");
    }
    assert_eq!(cache.figures().entries, 0);
}

#[test]
fn cache_valid_gives_a_lifetime_only_where_the_origin_states_none() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&config(dir.path())).unwrap();
    let now = SystemTime::now();
    let valid = (policy::VALID_FIELD, "600");
    // (target, status, fields, fresh right after storing, fresh after 700 s)
    type ValidCase<'a> = (&'a str, u16, Vec<(&'a str, &'a str)>, bool, bool);
    let cases: &[ValidCase<'_>] = &[
        ("/none", 200, vec![valid], true, false),
        ("/none-404", 404, vec![valid], true, false),
        // A 302 is not heuristically cacheable: the lifetime makes it storable.
        ("/redirect", 302, vec![valid, ("location", "/x")], true, false),
        // Explicit freshness wins, both ways.
        ("/explicit-short", 200, vec![valid, ("cache-control", "max-age=0")], false, false),
        ("/explicit-long", 200, vec![valid, ("cache-control", "max-age=3600")], true, true),
        ("/expires", 200, vec![valid, ("expires", "Thu, 01 Jan 1970 00:00:00 GMT")], false, false),
        // No lifetime, no validator: RFC 9111 gives it none, as before.
        ("/plain", 200, vec![], false, false),
    ];
    for (target, status, list, fresh_now, fresh_later) in cases {
        let key = Key::new("", target);
        let stored =
            store(&cache, &key, &HeaderMap::new(), &response(*status, list), b"x", now - Duration::from_secs(1));
        if stored.is_err() {
            assert!(!fresh_now, "{target}: {stored:?}");
            continue;
        }
        let hit = matches!(lookup(&cache, &key, &HeaderMap::new()), Lookup::Hit(_));
        assert_eq!(hit, *fresh_now, "{target} at once");
        let index = cache.lock_index().variants(&key.primary).unwrap_or_default();
        let meta = index.first().unwrap_or_else(|| panic!("{target} is stored"));
        assert_eq!(!meta.is_stale(now + Duration::from_secs(700)), *fresh_later, "{target} after 700 s");
        if let Lookup::Hit(hit) = lookup(&cache, &key, &HeaderMap::new()) {
            let r = hit.into_response(&get(target, &[]), &CacheStatus::hit());
            assert_eq!(field(&r, policy::VALID_FIELD), None, "{target}: the lifetime is the cache's own");
        }
    }
    // A request that bypasses the lookup is filled (and stored) all the same.
    let key = Key::new("", "/bypassed");
    let fill = cache.bypass(&key, &HeaderMap::new());
    let mut w = fill.admit(&response(200, &[("cache-control", "max-age=60")]), now).unwrap();
    w.write(b"b").unwrap();
    w.commit().unwrap();
    assert!(matches!(lookup(&cache, &key, &HeaderMap::new()), Lookup::Hit(_)));
}
