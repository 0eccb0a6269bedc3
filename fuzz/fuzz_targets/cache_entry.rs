//! The cache's entry reader (`handler/cache/entry.rs`, then the entry's RFC 9111 rules
//! in `policy.rs`) on entry files: seeds are real entries, which the fuzzer mutates.
//! The input is a mode byte, 8 bytes of "now" (milliseconds within the years 2000 to
//! 2100: the clock, not the file, gives it), then the file. Mode bit 0 rewrites the head checksum after mutation, so that mutated heads
//! reach the JSON and the freshness rules instead of stopping at the checksum; bits 1-3
//! pick the request's fields and bits 4-6 the fields of a 304 that refreshes the entry.
//! Besides never panicking, an entry read back has its body within the file, to the end.
#![no_main]

use ktlsd::fuzzing::{cache_entry, cache_entry_fix_checksum};
use libfuzzer_sys::fuzz_target;

const REQUESTS: [&[(&str, &str)]; 8] = [
    &[],
    &[("accept-encoding", "gzip")],
    &[("cache-control", "no-cache")],
    &[("cache-control", "max-age=0, stale-if-error=60")],
    &[("cache-control", "max-stale=100, min-fresh=5")],
    &[("pragma", "no-cache"), ("accept-language", "fr")],
    &[("authorization", "Basic YTpi")],
    &[("cache-control", "only-if-cached"), ("accept-encoding", "br, gzip")],
];

const REFRESHES: [&[(&str, &str)]; 8] = [
    &[],
    &[("etag", "\"a\"")],
    &[("cache-control", "max-age=60"), ("date", "Thu, 01 Jan 2026 00:00:00 GMT")],
    &[("last-modified", "Wed, 21 Oct 2015 07:28:00 GMT"), ("content-length", "3")],
    &[("age", "18446744073709551615")],
    &[("cache-control", "no-store"), ("etag", "W/\"a\"")],
    &[("expires", "0"), ("vary", "accept-encoding")],
    &[("set-cookie", "a=b"), ("x-new", "1")],
];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let Some((now, file)) = rest.split_first_chunk::<8>() else { return };
    let mut file = file.to_vec();
    if mode & 1 != 0 {
        cache_entry_fix_checksum(&mut file);
    }
    let pairs = |fields: &[(&str, &str)]| -> Vec<(String, String)> {
        fields.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    };
    let request = pairs(REQUESTS[usize::from(mode >> 1 & 7)]);
    let refresh = pairs(REFRESHES[usize::from(mode >> 4 & 7)]);
    let now = 946_684_800_000 + u64::from_le_bytes(*now) % (100 * 365 * 86_400_000);
    if let Ok(entry) = cache_entry(&file, now, &request, &refresh) {
        assert!(entry.body.start >= 60 && entry.body.end == file.len() as u64, "{entry:?}");
    }
});
