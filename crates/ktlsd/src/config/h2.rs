//! The HTTP/2 limits section: SETTINGS values and flood limits (`h2_*`).
//!
//! Each key is checked against its range here; the codec applies them.

use super::options::Options;
use super::{err, ConfigError};

/// The HTTP/2 limits from their keys, each checked against its range; a key not
/// given keeps the codec's default.
pub fn h2_limits(o: &Options) -> Result<crate::http::h2::Limits, ConfigError> {
    let values = [o.h2_max_streams, o.h2_max_header_list, o.h2_hpack_table, o.h2_max_resets, o.h2_max_control];
    let mut limits = crate::http::h2::Limits::default();
    for ((key, range, set), value) in H2_LIMITS.iter().zip(values) {
        let Some(v) = value else { continue };
        if !range.contains(&v) {
            return err(format!("{key} {v}: expected {} to {}", range.start(), range.end()));
        }
        set(&mut limits, v);
    }
    // The encoded field block may not be smaller than the decoded list it carries
    // (HPACK can only shrink it so far), or a request within the list limit could
    // end the connection.
    limits.max_header_block = limits.max_header_block.max(2 * limits.max_header_list_size as usize);
    Ok(limits)
}

/// How one HTTP/2 limit is applied.
type SetLimit = fn(&mut crate::http::h2::Limits, u32);

/// The HTTP/2 limit keys (in the order [`h2_limits`] reads them), their allowed ranges
/// and where each goes. At least one stream; header lists from 1 KiB (no browser
/// request fits less) to 1 MiB (the HTTP/1.1 head limit's ceiling); the HPACK table up
/// to 64 KiB; rates at least 1 per window.
const H2_LIMITS: [(&str, std::ops::RangeInclusive<u32>, SetLimit); 5] = [
    ("h2_max_streams", 1..=10_000, |l, v| l.max_concurrent_streams = v),
    ("h2_max_header_list", 1024..=1024 * 1024, |l, v| l.max_header_list_size = v),
    ("h2_hpack_table", 0..=64 * 1024, |l, v| l.header_table_size = v),
    ("h2_max_resets", 1..=1_000_000, |l, v| l.max_resets = v),
    ("h2_max_control", 1..=1_000_000, |l, v| l.max_control = v),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h2_limit_ranges() {
        let base = Options::default;
        for (o, want) in [
            (base(), Ok(128)),
            (Options { h2_max_streams: Some(7), ..base() }, Ok(7)),
            (Options { h2_max_streams: Some(0), ..base() }, Err("h2_max_streams 0: expected 1 to 10000")),
            (Options { h2_max_header_list: Some(100), ..base() }, Err("h2_max_header_list 100: expected 1024")),
            (Options { h2_hpack_table: Some(70_000), ..base() }, Err("h2_hpack_table 70000")),
            (Options { h2_max_resets: Some(0), ..base() }, Err("h2_max_resets 0")),
            (Options { h2_max_control: Some(0), ..base() }, Err("h2_max_control 0")),
        ] {
            match (h2_limits(&o), want) {
                (Ok(l), Ok(w)) => assert_eq!(l.max_concurrent_streams, w),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e}"),
                (got, want) => panic!("got {got:?}, want {want:?}"),
            }
        }
        let l = h2_limits(&Options { h2_max_header_list: Some(1024 * 1024), ..base() }).unwrap();
        assert!(l.max_header_block >= 2 * 1024 * 1024, "the field block holds the list");
    }
}
