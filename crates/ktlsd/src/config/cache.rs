//! The `[cache]` section: where the response cache keeps its entries and how much
//! it may keep (`dir`, `max_size`, `max_object_size`).
//!
//! Sizes are bytes, as an integer or as text with a binary suffix (`"512M"`,
//! `"10G"`). This module checks the values; it creates no directory (start-up opens
//! the cache, see `handler::cache`).

use std::path::PathBuf;

use serde::Deserialize;

use super::{err, ConfigError};
use crate::handler::cache::Settings;

/// The `[cache]` table as written.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileCache {
    pub dir: Option<PathBuf>,
    pub max_size: Option<Size>,
    pub max_object_size: Option<Size>,
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
    Ok(Some(Settings { dir, max_size, max_object_size }))
}

/// `s` in bytes: an integer, or digits with an optional K, M, G or T suffix (powers
/// of 1024, an optional trailing `B` or `iB`).
fn size(key: &str, s: &Size) -> Result<u64, ConfigError> {
    let text = match s {
        Size::Bytes(n) => return Ok(*n),
        Size::Text(t) => t.trim(),
    };
    let bad =
        || ConfigError::new(format!("[cache] {key} {text:?}: expected bytes such as 1048576, \"512M\" or \"10G\""));
    let upper = text.to_ascii_uppercase();
    let unit = upper.trim_end_matches("IB").trim_end_matches('B');
    let (digits, shift) = match unit.chars().last() {
        Some('K') => (&unit[..unit.len() - 1], 10),
        Some('M') => (&unit[..unit.len() - 1], 20),
        Some('G') => (&unit[..unit.len() - 1], 30),
        Some('T') => (&unit[..unit.len() - 1], 40),
        _ => (unit, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(dir: Option<&str>, max: Option<Size>, obj: Option<Size>) -> FileCache {
        FileCache { dir: dir.map(PathBuf::from), max_size: max, max_object_size: obj }
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
    fn the_table_reads_from_toml() {
        let c: FileCache = toml::from_str("dir = \"x\"\nmax_size = \"10G\"\nmax_object_size = 1000").unwrap();
        assert_eq!(c, table(Some("x"), Some(Size::Text("10G".into())), Some(Size::Bytes(1000))));
        assert!(toml::from_str::<FileCache>("dir = \"x\"\nsize = 1").is_err(), "unknown keys are refused");
    }
}
