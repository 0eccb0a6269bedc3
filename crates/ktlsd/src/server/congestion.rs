//! The TCP congestion-control algorithms this kernel offers, for checking
//! `tcp_congestion` at start-up and for `ktlsd doctor`.
//!
//! Only the listing lives here; setting the algorithm on a socket is the
//! listener's business.

use std::io;

/// Where the kernel lists the algorithms that are loaded (and so can be set
/// with `TCP_CONGESTION` without privileges or auto-loading).
const AVAILABLE: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";

/// The algorithms the kernel has loaded, e.g. `["reno", "cubic", "bbr"]`.
///
/// # Errors
/// The file cannot be read (no `/proc`, or a kernel without it); the error
/// names the file.
pub fn available() -> io::Result<Vec<String>> {
    let text = std::fs::read_to_string(AVAILABLE)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot read {AVAILABLE}: {e}")))?;
    Ok(parse(&text))
}

/// Splits the file's one line of space-separated names.
fn parse(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_format() {
        assert_eq!(parse("reno cubic bbr\n"), ["reno", "cubic", "bbr"]);
        assert!(parse("\n").is_empty());
    }

    #[test]
    fn this_kernel_lists_at_least_one() {
        // Every Linux kernel has reno built in; /proc may be missing in odd sandboxes.
        if let Ok(list) = available() {
            assert!(list.iter().any(|c| c == "reno"), "{list:?}");
        }
    }
}
