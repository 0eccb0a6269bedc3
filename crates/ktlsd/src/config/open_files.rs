//! The open-file cache section: `open_file_cache_valid`, how long the metadata of a
//! cached open file is trusted before it is read again.
//!
//! Only the value is checked here; `files::cache` applies it.

use std::time::Duration;

use super::options::Options;
use super::{err, ConfigError};

/// The longest interval allowed: an hour of possibly stale lengths and ETags is
/// already far past any use.
const MAX_VALID_SECS: u64 = 3600;

/// `open_file_cache_valid` as a duration: 0 (the default) to an hour.
pub fn cache_valid(o: &Options) -> Result<Duration, ConfigError> {
    match o.open_file_cache_valid.unwrap_or(0) {
        n if n > MAX_VALID_SECS => err(format!("open_file_cache_valid {n}: expected 0 to {MAX_VALID_SECS} seconds")),
        n => Ok(Duration::from_secs(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_valid_range() {
        let base = Options::default;
        for (o, want) in [
            (base(), Ok(0)),
            (Options { open_file_cache_valid: Some(0), ..base() }, Ok(0)),
            (Options { open_file_cache_valid: Some(5), ..base() }, Ok(5)),
            (Options { open_file_cache_valid: Some(3600), ..base() }, Ok(3600)),
            (
                Options { open_file_cache_valid: Some(3601), ..base() },
                Err("open_file_cache_valid 3601: expected 0 to 3600"),
            ),
        ] {
            match (cache_valid(&o), want) {
                (Ok(d), Ok(w)) => assert_eq!(d, Duration::from_secs(w)),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e}"),
                (got, want) => panic!("got {got:?}, want {want:?}"),
            }
        }
    }
}
