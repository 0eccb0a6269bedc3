//! The compression section: a site's `compress`, `compress_min_size` and
//! `compress_max_size` into a [`Policy`], and the store's `compress_cache_size`;
//! also the reading of a list of codings, which `precompressed` shares.
//!
//! It validates values only; what is compressed, and how, is
//! [`crate::handler::compress`]'s and [`crate::files::compress`]'s.

use super::options::{List, Options, SiteOptions};
use super::ConfigError;
use crate::handler::compress::Policy;
use crate::handler::request::Coding;

/// `compress_min_size` when not given: below about 1 KiB the saving rarely pays
/// for the coding's framing and the extra header fields.
pub const DEFAULT_MIN_SIZE: u64 = 1024;
/// `compress_max_size` when not given: `time gzip -6`, the slowest of the three
/// codings, took 0.04 s for 1.7 MB of this repository's text, so a file of this
/// size holds one of the [`crate::files::compress::COMPRESSORS`] for about a
/// quarter of a second.
pub const DEFAULT_MAX_SIZE: u64 = 10 << 20;
/// `compress_cache_size` when not given.
pub const DEFAULT_CACHE_SIZE: u64 = 256 << 20;

/// A site's compression; `None` when `compress` is absent, empty or `none`. Errors
/// start with `which` (empty for the top level).
pub fn compress(o: &SiteOptions, which: &str) -> Result<Option<Policy>, ConfigError> {
    let e = |msg: String| ConfigError::new(format!("{which}{msg}"));
    let codings = codings(o.compress.as_ref(), "compress").map_err(e)?;
    let min_size = o.compress_min_size.unwrap_or(DEFAULT_MIN_SIZE);
    let max_size = o.compress_max_size.unwrap_or(DEFAULT_MAX_SIZE);
    if min_size == 0 {
        return Err(e("compress_min_size 0: expected at least 1 byte (an empty file has nothing to compress)".into()));
    }
    if max_size == 0 || max_size < min_size {
        return Err(e(format!("compress_max_size {max_size}: expected at least compress_min_size ({min_size})")));
    }
    Ok((!codings.is_empty()).then_some(Policy { codings, min_size, max_size }))
}

/// A list of codings (`precompressed`, `compress`), each once, in the order given,
/// `none` skipped; an unknown one is refused naming `key`.
pub(super) fn codings(list: Option<&List>, key: &str) -> Result<Vec<Coding>, String> {
    let mut out = Vec::new();
    for name in list.iter().flat_map(|l| &l.0) {
        if name.trim() == "none" {
            continue;
        }
        let Some(c) = Coding::from_token(name.trim()) else {
            return Err(format!("{key} {name:?}: expected br, zstd, gzip or none"));
        };
        if !out.contains(&c) {
            out.push(c);
        }
    }
    Ok(out)
}

/// The store's bound in bytes: at least 1 MiB.
pub fn cache_size(o: &Options) -> Result<u64, ConfigError> {
    match o.compress_cache_size.unwrap_or(DEFAULT_CACHE_SIZE) {
        n if n < 1 << 20 => {
            Err(ConfigError::new(format!("compress_cache_size {n}: expected at least 1048576 (1 MiB)")))
        }
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::request::Coding::*;

    fn list(s: &str) -> Option<List> {
        Some(List(crate::config::options::split_list(s)))
    }

    #[test]
    fn compress_values() {
        let base = SiteOptions::default;
        for (o, want) in [
            (base(), Ok(None)),
            (SiteOptions { compress: list("none"), ..base() }, Ok(None)),
            (SiteOptions { compress: list(""), ..base() }, Ok(None)),
            (SiteOptions { compress: list("zstd,br,gzip"), ..base() }, Ok(Some(vec![Zstd, Br, Gzip]))),
            (SiteOptions { compress: list("gzip, ZSTD, gzip"), ..base() }, Ok(Some(vec![Gzip, Zstd]))),
            (
                SiteOptions { compress: list("br,deflate"), ..base() },
                Err("compress \"deflate\": expected br, zstd, gzip or none"),
            ),
            (SiteOptions { compress: list("identity"), ..base() }, Err("compress \"identity\"")),
            (
                SiteOptions { compress: list("gzip"), compress_min_size: Some(0), ..base() },
                Err("compress_min_size 0: expected at least 1 byte"),
            ),
            (
                SiteOptions { compress: list("gzip"), compress_max_size: Some(0), ..base() },
                Err("compress_max_size 0: expected at least compress_min_size (1024)"),
            ),
            (
                SiteOptions {
                    compress: list("gzip"),
                    compress_min_size: Some(5000),
                    compress_max_size: Some(4000),
                    ..base()
                },
                Err("compress_max_size 4000"),
            ),
        ] {
            match (compress(&o, "site 2 (b.test): "), want) {
                (Ok(p), Ok(w)) => assert_eq!(p.map(|p| p.codings), w),
                (Err(e), Err(w)) => {
                    assert!(e.to_string().contains(w), "{e}");
                    assert!(e.to_string().starts_with("site 2 (b.test): "), "{e}");
                }
                (got, want) => panic!("{o:?}: got {got:?}, want {want:?}"),
            }
        }
        let p = compress(&SiteOptions { compress: list("br"), ..base() }, "").unwrap().unwrap();
        assert_eq!((p.min_size, p.max_size), (DEFAULT_MIN_SIZE, DEFAULT_MAX_SIZE));
    }

    #[test]
    fn cache_sizes() {
        let base = Options::default;
        assert_eq!(cache_size(&base()).unwrap(), DEFAULT_CACHE_SIZE);
        assert_eq!(cache_size(&Options { compress_cache_size: Some(1 << 20), ..base() }).unwrap(), 1 << 20);
        let e = cache_size(&Options { compress_cache_size: Some(0), ..base() }).unwrap_err();
        assert!(e.to_string().contains("compress_cache_size 0: expected at least"), "{e}");
    }
}
