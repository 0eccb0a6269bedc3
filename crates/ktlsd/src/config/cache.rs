//! The `[cache]` section: where the response cache keeps its entries, how much
//! it may keep (`dir`, `max_size`, `max_object_size`), how much of its file
//! system it leaves free (`min_free`) and how often a hit checks its body
//! (`verify_sample`).
//!
//! Sizes are bytes, as an integer or as text with a binary suffix (`"512M"`,
//! `"10G"`); `min_free` may also be a percentage of the file system (`"5%"`). This module checks the values; it creates no directory (start-up opens
//! the cache, see `handler::cache`).

use std::path::PathBuf;

use serde::Deserialize;

use super::{err, ConfigError};
use crate::handler::cache::{MinFree, Settings};

/// The `[cache]` table as written.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileCache {
    pub dir: Option<PathBuf>,
    pub max_size: Option<Size>,
    pub max_object_size: Option<Size>,
    pub min_free: Option<Size>,
    pub verify_sample: Option<f64>,
}

/// A size as written: a number of bytes, or text such as `"512M"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

/// `max_size` when not given: 1 GiB, a cache that fits a small disk.
pub const DEFAULT_MAX_SIZE: u64 = 1 << 30;
/// `max_object_size` when not given: 64 MiB, or `max_size` / 8 when that is less.
pub const DEFAULT_MAX_OBJECT_SIZE: u64 = 64 << 20;
/// The largest `max_object_size` is `max_size` divided by this: one object never
/// evicts more than an eighth of the cache.
const OBJECTS_PER_CACHE: u64 = 8;
/// `verify_sample` when not given: one hit in a hundred reads its body back and
/// checks it (for a 2 MiB body in the page cache, about half a millisecond each
/// time, so a few microseconds a hit on average).
pub const DEFAULT_VERIFY_SAMPLE: f64 = 0.01;
/// The smallest `max_size`: 1 MiB.
const MIN_MAX_SIZE: u64 = 1 << 20;

/// The `[cache]` table checked; `None` when there is none.
pub fn cache(file: Option<&FileCache>) -> Result<Option<Settings>, ConfigError> {
    let Some(c) = file else { return Ok(None) };
    let Some(dir) = c.dir.clone() else {
        return err("[cache] needs dir, the directory of its entries (e.g. dir = \"/var/cache/ktlsd\")");
    };
    if dir.as_os_str().is_empty() {
        return err("[cache] dir is empty: give the directory of its entries");
    }
    let max_size = match &c.max_size {
        Some(s) => size("max_size", s)?,
        None => DEFAULT_MAX_SIZE,
    };
    if max_size < MIN_MAX_SIZE {
        return err(format!("[cache] max_size {max_size}: expected at least 1M"));
    }
    let max_object_size = match &c.max_object_size {
        Some(s) => size("max_object_size", s)?,
        None => DEFAULT_MAX_OBJECT_SIZE.min(max_size / OBJECTS_PER_CACHE),
    };
    let most = max_size / OBJECTS_PER_CACHE;
    if max_object_size == 0 || max_object_size > most {
        return err(format!(
            "[cache] max_object_size {max_object_size}: expected more than 0 and at most max_size / 8 ({most}): \
             lower it or raise max_size"
        ));
    }
    let min_free = match &c.min_free {
        Some(Size::Text(t)) if t.trim().ends_with('%') => {
            let pct = t.trim().trim_end_matches('%').trim();
            match pct.parse::<u8>() {
                Ok(p) if p < 100 => MinFree::Percent(p),
                _ => {
                    return err(format!(
                        "[cache] min_free {t:?}: expected a whole percentage below 100, such as \"5%\""
                    ))
                }
            }
        }
        Some(s) => MinFree::Bytes(size("min_free", s)?),
        None => MinFree::Bytes(0),
    };
    let sample = c.verify_sample.unwrap_or(DEFAULT_VERIFY_SAMPLE);
    if !(0.0..=1.0).contains(&sample) {
        return err(format!(
            "[cache] verify_sample {sample}: expected a share of hits from 0 (only the first) to 1 (every hit)"
        ));
    }
    let verify_sample = (sample * 1e6).round() as u32;
    Ok(Some(Settings { dir, max_size, max_object_size, verify_sample, min_free }))
}

/// `s` in bytes: an integer, or digits with an optional K, M, G or T suffix (powers
/// of 1024, an optional trailing `B` or `iB`).
fn size(key: &str, s: &Size) -> Result<u64, ConfigError> {
    bytes(s).ok_or_else(|| {
        let text = match s {
            Size::Bytes(n) => n.to_string(),
            Size::Text(t) => t.trim().to_string(),
        };
        ConfigError::new(format!("[cache] {key} {text:?}: expected bytes such as 1048576, \"512M\" or \"10G\""))
    })
}

/// `s` in bytes (see [`size`]); `None` when it is not a size or overflows.
pub fn bytes(s: &Size) -> Option<u64> {
    let text = match s {
        Size::Bytes(n) => return Some(*n),
        Size::Text(t) => t.trim(),
    };
    let upper = text.to_ascii_uppercase();
    let unit = upper.trim_end_matches("IB").trim_end_matches('B');
    let (digits, shift) = match unit.chars().last() {
        Some('K') => (&unit[..unit.len() - 1], 10),
        Some('M') => (&unit[..unit.len() - 1], 20),
        Some('G') => (&unit[..unit.len() - 1], 30),
        Some('T') => (&unit[..unit.len() - 1], 40),
        _ => (unit, 0),
    };
    let n: u64 = digits.trim().parse().ok()?;
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(dir: Option<&str>, max: Option<Size>, obj: Option<Size>) -> FileCache {
        FileCache { dir: dir.map(PathBuf::from), max_size: max, max_object_size: obj, ..FileCache::default() }
    }

    #[test]
    fn cache_section() {
        let t = |s: &str| Some(Size::Text(s.into()));
        for (file, want) in [
            (None, Ok(None)),
            (Some(table(Some("/c"), None, None)), Ok(Some((1 << 30, 64 << 20)))),
            (Some(table(Some("/c"), t("10G"), None)), Ok(Some((10 << 30, 64 << 20)))),
            (Some(table(Some("/c"), t("16M"), None)), Ok(Some((16 << 20, 2 << 20)))),
            (Some(table(Some("/c"), t("512m"), t("1MiB"))), Ok(Some((512 << 20, 1 << 20)))),
            (Some(table(Some("/c"), Some(Size::Bytes(2 << 20)), Some(Size::Bytes(4096)))), Ok(Some((2 << 20, 4096)))),
            (Some(table(Some("/c"), t("2048K"), t("100"))), Ok(Some((2 << 20, 100)))),
            (Some(table(None, None, None)), Err("[cache] needs dir")),
            (Some(table(Some(""), None, None)), Err("dir is empty")),
            (Some(table(Some("/c"), t("ten"), None)), Err("[cache] max_size \"ten\": expected bytes")),
            (Some(table(Some("/c"), t("99999999999T"), None)), Err("max_size \"99999999999T\"")),
            (Some(table(Some("/c"), t("1K"), None)), Err("max_size 1024: expected at least 1M")),
            (Some(table(Some("/c"), t("1G"), t("2G"))), Err("max_object_size 2147483648: expected more than 0")),
            // At most max_size / 8, as docs/cache.md says: 128M of 1G, not a byte more.
            (Some(table(Some("/c"), t("1G"), t("128M"))), Ok(Some((1 << 30, 128 << 20)))),
            (
                Some(table(Some("/c"), t("1G"), Some(Size::Bytes((128 << 20) + 1)))),
                Err("max_object_size 134217729: expected more than 0 and at most max_size / 8 (134217728)"),
            ),
            (Some(table(Some("/c"), t("1G"), t("1G"))), Err("lower it or raise max_size")),
            (Some(table(Some("/c"), None, Some(Size::Bytes(0)))), Err("max_object_size 0")),
            (Some(table(Some("/c"), None, t("-1"))), Err("max_object_size \"-1\"")),
        ] {
            match (cache(file.as_ref()), want) {
                (Ok(None), Ok(None)) => {}
                (Ok(Some(c)), Ok(Some((max, obj)))) => {
                    assert_eq!((c.max_size, c.max_object_size), (max, obj), "{file:?}");
                    assert_eq!(c.dir, PathBuf::from("/c"));
                }
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e} should contain {w}"),
                (got, want) => panic!("{file:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn min_free_and_verify_sample() {
        let t = |s: &str| Some(Size::Text(s.into()));
        let with = |min_free: Option<Size>, verify_sample: Option<f64>| FileCache {
            min_free,
            verify_sample,
            ..table(Some("/c"), None, None)
        };
        for (file, want) in [
            (with(None, None), Ok((MinFree::Bytes(0), 10_000))),
            (with(t("5%"), Some(1.0)), Ok((MinFree::Percent(5), 1_000_000))),
            (with(t(" 0 % "), Some(0.0)), Ok((MinFree::Percent(0), 0))),
            (with(t("100M"), Some(0.25)), Ok((MinFree::Bytes(100 << 20), 250_000))),
            (with(Some(Size::Bytes(4096)), Some(0.000001)), Ok((MinFree::Bytes(4096), 1))),
            (with(t("100%"), None), Err("min_free \"100%\": expected a whole percentage below 100")),
            (with(t("1.5%"), None), Err("min_free \"1.5%\"")),
            (with(t("lots"), None), Err("[cache] min_free \"lots\": expected bytes")),
            (with(None, Some(1.5)), Err("verify_sample 1.5: expected a share of hits")),
            (with(None, Some(-0.1)), Err("verify_sample -0.1")),
            (with(None, Some(f64::NAN)), Err("verify_sample NaN")),
        ] {
            match (cache(Some(&file)), want) {
                (Ok(Some(c)), Ok(w)) => assert_eq!((c.min_free, c.verify_sample), w, "{file:?}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e} should contain {w}"),
                (got, want) => panic!("{file:?}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(MinFree::Percent(10).of(1000), 100);
        assert_eq!(MinFree::Bytes(7).of(1000), 7);
    }

    #[test]
    fn the_table_reads_from_toml() {
        let c: FileCache = toml::from_str("dir = \"x\"\nmax_size = \"10G\"\nmax_object_size = 1000").unwrap();
        assert_eq!(c, table(Some("x"), Some(Size::Text("10G".into())), Some(Size::Bytes(1000))));
        let c: FileCache = toml::from_str("dir = \"x\"\nmin_free = \"5%\"\nverify_sample = 1").unwrap();
        assert_eq!((c.min_free, c.verify_sample), (Some(Size::Text("5%".into())), Some(1.0)));
        assert!(toml::from_str::<FileCache>("dir = \"x\"\nsize = 1").is_err(), "unknown keys are refused");
    }
}
