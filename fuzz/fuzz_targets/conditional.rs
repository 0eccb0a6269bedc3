//! Conditional and range fields (`handler/request.rs`, `preconditions.rs`, `range.rs`)
//! as the handler reads them: field lines (`name: value`, one a line) collected and
//! parsed, then the preconditions and the Range evaluated for a file whose size, entity
//! tag and modification time the first line gives (`size etag weak seconds`). Besides
//! never panicking, a Range the answer honours selects non-empty byte ranges within the
//! file, at most 16, none overlapping or touching another, and a 416 only when no range
//! starts inside the file.
#![no_main]

use std::time::{Duration, SystemTime};

use ktlsd::fuzzing::{conditional, RangeOutcome, MAX_RANGES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut lines = text.split('\n');
    let first: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
    let size: u64 = first.first().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let etag = first.get(1).copied().unwrap_or("\"e\"");
    let weak = first.get(2) == Some(&"w");
    let secs: u64 = first.get(3).and_then(|s| s.parse().ok()).unwrap_or(1_700_000_000) % (1 << 40);
    let modified = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    let fields: Vec<(&str, &str)> =
        lines.filter_map(|l| l.split_once(':')).map(|(n, v)| (n.trim(), v.trim())).collect();
    let got = conditional(&fields, etag, weak, modified, size);
    match &got.range {
        None | Some(RangeOutcome::Full) => {}
        Some(RangeOutcome::Partial(r)) => assert!(r.start < r.end && r.end <= size, "{got:?}"),
        Some(RangeOutcome::Multi(rs)) => {
            assert!(rs.len() >= 2 && rs.len() <= MAX_RANGES, "{got:?}");
            for (i, a) in rs.iter().enumerate() {
                assert!(a.start < a.end && a.end <= size, "{got:?}");
                for b in &rs[i + 1..] {
                    assert!(a.end < b.start || b.end < a.start, "overlapping or touching: {got:?}");
                }
            }
        }
        Some(RangeOutcome::Unsatisfiable) => {
            // Every range asked for starts at or past the end (or is an empty suffix).
            let value = fields.iter().rev().find(|(n, _)| n.eq_ignore_ascii_case("range")).map(|(_, v)| *v);
            let specs = value.and_then(|v| v.trim().get(6..)).unwrap_or("");
            for spec in specs.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                if let Some((a, _)) = spec.split_once('-') {
                    if let Ok(first) = a.trim().parse::<u64>() {
                        assert!(first >= size, "416 although {spec:?} starts within {size} bytes");
                    }
                }
            }
        }
    }
});
