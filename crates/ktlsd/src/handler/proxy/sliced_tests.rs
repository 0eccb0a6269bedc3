use super::*;

const M: u64 = 1 << 20;

#[test]
fn the_slices_a_range_spans() {
    let cases: [(Range<u64>, u64, Range<u64>); 9] = [
        (0..1, M, 0..1),
        (0..M, M, 0..1),
        (0..M + 1, M, 0..2),
        (M - 1..M + 1, M, 0..2),
        (2 * M + 5..3 * M - 5, M, 2..3),
        (M + M / 2..3 * M + M / 2, M, 1..4),
        (0..5 * M, M, 0..5),
        // The last, partial slice of a 4.5 MiB object.
        (4 * M..4 * M + M / 2, M, 4..5),
        (7..7, M, 0..0),
    ];
    for (range, n, want) in cases {
        assert_eq!(spans(&range, n), want, "{range:?} in slices of {n}");
    }
}

#[test]
fn slice_bounds_and_their_range_field() {
    let size = 4 * M + 100;
    let cases = [
        (0, 0..M, "bytes=0-1048575"),
        (1, M..2 * M, "bytes=1048576-2097151"),
        (4, 4 * M..size, "bytes=4194304-5242879"),
        (5, size..size, "bytes=5242880-6291455"),
    ];
    for (i, want, field) in cases {
        assert_eq!(bounds(i, M, size), want, "slice {i}");
        assert_eq!(range_field(i, M), field, "slice {i}");
    }
    assert_eq!(bounds(0, M, 0), 0..0, "a zero-length object has no bytes in its slice 0");
    assert_eq!(bounds(u64::MAX, M, 10), 10..10, "no overflow");
}

#[test]
fn the_first_slice_asked_for() {
    let cases = [
        (None, 0),
        (Some("bytes=0-"), 0),
        (Some("bytes=2621440-2631439"), 2),
        (Some("bytes=1048576-"), 1),
        (Some("bytes=1048575-1048576"), 0),
        (Some("bytes=-500"), 0),
        (Some("bytes=3145728-3145729,0-1"), 0),
    ];
    for (range, want) in cases {
        let set = range.and_then(RangeSet::parse);
        assert_eq!(first_slice(set.as_ref(), M), want, "{range:?}");
    }
}

#[test]
fn content_ranges_read() {
    let cases = [
        ("bytes 0-9/100", Some((0..10, 100))),
        ("bytes 1048576-2097151/5242880", Some((M..2 * M, 5 * M))),
        ("Bytes 5-5/6", Some((5..6, 6))),
        ("bytes 9-0/100", None),
        ("bytes 0-100/100", None),
        ("bytes 0-9/*", None),
        ("bytes */100", None),
        ("bytes +0-9/100", None),
        ("items 0-9/100", None),
        ("", None),
    ];
    for (v, want) in cases {
        assert_eq!(content_range(v), want, "{v:?}");
    }
    assert_eq!(unsatisfied_size("bytes */0"), Some(0));
    assert_eq!(unsatisfied_size("bytes */5242880"), Some(5 * M));
    assert_eq!(unsatisfied_size("bytes 0-1/2"), None);
    assert_eq!(unsatisfied_size("bytes */x"), None);
}

/// An upstream's answer to a slice's request (status, Content-Range, framing), the
/// slice asked for, the size known, and the verdict (the size, or a word of the refusal).
type Case<'a> = (u16, Option<&'a str>, Framing, u64, Option<u64>, Result<u64, &'a str>);

#[test]
fn slice_answers_checked() {
    let l = Framing::Length;
    let size = 5 * M;
    let good = format!("bytes {}-{}/{size}", M, 2 * M - 1);
    let last = format!("bytes {}-{}/{}", 4 * M, 4 * M + 99, 4 * M + 100);
    let shifted = format!("bytes {}-{}/{size}", M + 1, 2 * M);
    let cases: Vec<Case> = vec![
        (206, Some(&good), l(M), 1, None, Ok(size)),
        (206, Some(&good), l(M), 1, Some(size), Ok(size)),
        // The last slice is shorter.
        (206, Some(&last), l(100), 4, None, Ok(4 * M + 100)),
        (206, Some(&last), l(100), 4, Some(4 * M + 100), Ok(4 * M + 100)),
        // Another size than the object's: another version.
        (206, Some(&good), l(M), 1, Some(size + 1), Err("not the slice asked for")),
        // Another slice, or a part of one.
        (206, Some(&good), l(M), 2, None, Err("not the slice asked for")),
        (206, Some(&shifted), l(M), 1, None, Err("not the slice asked for")),
        (206, Some("bytes 0-9/5242880"), l(10), 0, None, Err("not the slice asked for")),
        (206, Some("bytes 0-9/*"), l(10), 0, None, Err("no valid Content-Range")),
        (206, None, l(10), 0, None, Err("no valid Content-Range")),
        // The body's length disagrees, or is not given.
        (206, Some(&good), l(M - 1), 1, None, Err("length")),
        (206, Some(&good), Framing::Chunked, 1, None, Err("length")),
        (200, None, l(size), 1, None, Err("ignored Range")),
        (404, None, l(10), 0, None, Err("answered 404")),
        (416, Some("bytes */100"), l(0), 3, None, Err("answered 416")),
    ];
    for (status, range, framing, i, known, want) in cases {
        let got = check(status, range, framing, i, M, known);
        match (&got, want) {
            (Ok(s), Ok(w)) => assert_eq!(*s, w, "{status} {range:?} slice {i}"),
            (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{status} {range:?} slice {i}: {e}"),
            _ => panic!("{status} {range:?} slice {i}: {got:?}, expected {want:?}"),
        }
    }
}

#[test]
fn replies_to_the_client() {
    let v = |size| Version { size, etag: Some("\"v1\"".into()), modified: None };
    let req = |range: Option<&str>, if_range: Option<&str>| Headers {
        range: range.and_then(RangeSet::parse),
        if_range: if_range.map(crate::handler::request::IfRange::parse),
        ..Headers::default()
    };
    let size = 5 * M;
    let cases = [
        (req(None, None), size, Reply::Whole(0..size)),
        (req(Some("bytes=2621440-2631439"), None), size, Reply::Part(2621440..2631440)),
        (req(Some("bytes=-100"), None), size, Reply::Part(size - 100..size)),
        (req(Some("bytes=5000000-"), None), size, Reply::Part(5000000..size)),
        // Past the end: 416.
        (req(Some("bytes=5242880-"), None), size, Reply::Unsatisfiable),
        (req(Some("bytes=99999999-"), None), size, Reply::Unsatisfiable),
        // Several ranges: the whole object, as a hit answers.
        (req(Some("bytes=0-1,100-200"), None), size, Reply::Whole(0..size)),
        // If-Range.
        (req(Some("bytes=0-9"), Some("\"v1\"")), size, Reply::Part(0..10)),
        (req(Some("bytes=0-9"), Some("\"v0\"")), size, Reply::Whole(0..size)),
        // A zero-length object: nothing to send, and no range of it.
        (req(None, None), 0, Reply::Whole(0..0)),
        (req(Some("bytes=0-"), None), 0, Reply::Unsatisfiable),
        (req(Some("bytes=-5"), None), 0, Reply::Unsatisfiable),
    ];
    for (i, (r, size, want)) in cases.into_iter().enumerate() {
        assert_eq!(reply(&r, &v(size)), want, "case {i}");
    }
}

#[test]
fn the_assembled_answer_names_its_range_of_the_object() {
    let object = vec![
        ("ETag".to_string(), "\"v1\"".to_string()),
        ("Content-Range".into(), "bytes 1048576-2097151/5242880".into()),
        ("Content-Length".into(), "1048576".into()),
        ("Content-Type".into(), "video/mp4".into()),
        ("Date".into(), "Sat, 28 Nov 2026 05:00:00 GMT".into()),
    ];
    let text = |h: &Vec<Header>, name: &str| -> Vec<String> {
        h.iter().filter(|f| f.name().eq_ignore_ascii_case(name)).map(|f| f.to_string()).collect()
    };
    let part = client_head(&object, 206, &(2621440..3670016), 5 * M, "ktlsd; hit");
    assert_eq!(text(&part, "content-range"), ["bytes 2621440-3670015/5242880"]);
    assert_eq!(text(&part, "content-length"), ["1048576"]);
    assert_eq!(text(&part, "etag"), ["\"v1\""]);
    assert_eq!(text(&part, "content-type"), ["video/mp4"]);
    assert!(text(&part, "date").is_empty(), "the codec writes its own Date");
    assert_eq!(text(&part, "cache-status"), ["ktlsd; hit"]);
    assert!(text(&part, "via").iter().any(|v| v.ends_with("1.1 ktlsd")), "{part:?}");
    let whole = client_head(&object, 200, &(0..5 * M), 5 * M, "ktlsd; fwd=miss");
    assert!(text(&whole, "content-range").is_empty());
    assert_eq!(text(&whole, "content-length"), ["5242880"]);
}

#[test]
fn versions_differ_by_size_or_validator() {
    let fields = |etag: &str| vec![("etag".to_string(), etag.to_string())];
    assert_eq!(Version::of(&fields("\"a\""), 10), Version::of(&fields("\"a\""), 10));
    assert_ne!(Version::of(&fields("\"a\""), 10), Version::of(&fields("\"b\""), 10));
    assert_ne!(Version::of(&fields("\"a\""), 10), Version::of(&fields("\"a\""), 11));
    let modified = vec![("Last-Modified".to_string(), "Sat, 28 Nov 2026 05:00:00 GMT".to_string())];
    assert_ne!(Version::of(&modified, 10), Version::of(&Vec::<(String, String)>::new(), 10));
}

#[test]
fn a_purge_probes_the_slices_of_the_size_slice_0_tells_or_walks_the_index() {
    let cases = [
        // Slice 0 stored: the slices its size calls for, one key each.
        (Some(5 * M), M, 100, Some(5)),
        (Some(5 * M + 1), M, 100, Some(6)),
        (Some(1), M, 100, Some(1)),
        (Some(0), M, 100, Some(0)),
        (Some(5 * M), M, 5, Some(5)),
        // More keys than the cache has entries (a huge object): the walk.
        (Some(5 * M), M, 4, None),
        (Some(u64::MAX), 64 << 10, u64::MAX >> 20, None),
        // Slice 0 not stored: the walk finds the others.
        (None, M, 100, None),
        (Some(5 * M), 0, 100, None),
    ];
    for (size, n, entries, want) in cases {
        assert_eq!(purge_count(size, n, entries), want, "{size:?} in slices of {n}, {entries} entries");
    }
}

#[test]
fn the_upstream_age_of_a_fetched_slice() {
    let cases = [
        (vec![], None),
        (vec![("Age", "30")], Some(30)),
        (vec![("age", " 7 ")], Some(7)),
        (vec![("Age", "-1")], None),
        (vec![("Age", "1.5")], None),
        (vec![("Age", "")], None),
        (vec![("Age", "99999999999999999999999")], None),
    ];
    for (fields, want) in cases {
        let fields: Vec<(String, String)> = fields.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        assert_eq!(upstream_age(&fields), want, "{fields:?}");
    }
}

#[test]
fn conditionals_are_decided_on_the_first_slice_validators() {
    let modified = "Mon, 02 Nov 2026 10:00:00 GMT";
    let (before, after) = ("Mon, 02 Nov 2026 09:59:59 GMT", "Mon, 02 Nov 2026 10:00:01 GMT");
    let req = |fields: &[(&str, &str)]| {
        let mut f = crate::handler::request::HeaderFields::default();
        for (n, v) in fields {
            f.add(n, v);
        }
        f.parse()
    };
    let cases = [
        (vec![], Precondition::Proceed),
        (vec![("If-None-Match", "\"v1\"")], Precondition::NotModified),
        // Weak comparison for If-None-Match.
        (vec![("If-None-Match", "W/\"v1\"")], Precondition::NotModified),
        (vec![("If-None-Match", "\"v0\", \"v1\"")], Precondition::NotModified),
        (vec![("If-None-Match", "\"v0\"")], Precondition::Proceed),
        (vec![("If-Modified-Since", modified)], Precondition::NotModified),
        (vec![("If-Modified-Since", after)], Precondition::NotModified),
        (vec![("If-Modified-Since", before)], Precondition::Proceed),
        // If-None-Match takes precedence over If-Modified-Since.
        (vec![("If-None-Match", "\"v0\""), ("If-Modified-Since", modified)], Precondition::Proceed),
        (vec![("If-None-Match", "\"v1\""), ("If-Modified-Since", before)], Precondition::NotModified),
        (vec![("If-Match", "\"v0\"")], Precondition::Failed),
    ];
    for (fields, want) in cases {
        assert_eq!(cache::precondition(&req(&fields), Some("\"v1\""), Some(modified)), want, "{fields:?}");
    }
}

#[test]
fn a_304_carries_the_validators_age_and_cache_status_only() {
    let object = vec![
        ("ETag".to_string(), "\"v1\"".to_string()),
        ("Last-Modified".into(), "Mon, 02 Nov 2026 10:00:00 GMT".into()),
        ("Cache-Control".into(), "max-age=3600".into()),
        ("Content-Range".into(), "bytes 0-1048575/5242880".into()),
        ("Content-Type".into(), "video/mp4".into()),
    ];
    let mut headers = client_head(&object, 200, &(0..5 * M), 5 * M, "ktlsd; hit");
    headers.push(cache::age_field(12));
    let r = cache::not_modified(headers);
    assert_eq!(r.status, Status::NOT_MODIFIED);
    assert!(matches!(r.body, Body::Empty));
    let mut names: Vec<String> = r.headers.iter().map(|h| h.name().to_ascii_lowercase()).collect();
    names.sort();
    assert_eq!(names, ["age", "cache-control", "cache-status", "etag", "last-modified"], "{:?}", r.headers);
}
