//! What the cache's range tests (`range_fill`, `cache_slice`) share: the origin
//! (`origin.py` beside this file), its objects' bytes, its request log, and curl's
//! range requests and their checks.

use testkit::*;

/// The origin: `origin.py`, run by `/usr/bin/python3`.
pub fn origin() -> ScriptUpstream {
    ScriptUpstream::start(&format!("{}/tests/range_fill/origin.py", env!("CARGO_MANIFEST_DIR")))
}

/// The origin's object of `n` bytes at version `v` (its formula).
pub fn object(v: u64, n: usize) -> Vec<u8> {
    (0..n).map(|i| ((i as u64 % 251 + 7 * v + (i as u64 >> 12)) % 256) as u8).collect()
}

/// The Range values of the origin's requests for `target` ("-": none), in order.
pub fn asked(up: &ScriptUpstream, target: &str) -> Vec<String> {
    up.lines()
        .iter()
        .filter_map(|l| l.strip_prefix("req "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(t, _)| *t == target)
        .map(|(_, r)| r.to_string())
        .collect()
}

/// `target` from `srv` by curl with `proto`, asking for `range` (`first-last`...) when given.
pub fn get(srv: &Server, target: &str, proto: &str, range: Option<&str>) -> Response {
    let header = range.map(|r| format!("Range: bytes={r}"));
    let mut args = vec![proto];
    if let Some(h) = &header {
        args.extend(["-H", h]);
    }
    fetch(&srv.url(target), &args)
}

/// The answer's `Cache-Status`, `(none)` without one.
pub fn cache_status(r: &Response) -> &str {
    r.header("cache-status").unwrap_or("(none)")
}

/// Asserts `r` is the 206 of `range` (half-open) of `source`.
pub fn assert_part(r: &Response, source: &[u8], range: std::ops::Range<usize>, what: &str) {
    assert_eq!(r.status, 206, "{what}: {}", r.stderr);
    let want = format!("bytes {}-{}/{}", range.start, range.end - 1, source.len());
    assert_eq!(r.header("content-range"), Some(want.as_str()), "{what}");
    assert_eq!(sha256(&r.body), sha256(&source[range.clone()]), "{what}: {} bytes", r.body.len());
}
