//! The timeouts and limits sections: how long each phase of a connection may take,
//! and how large a request or how many connections are allowed.
//!
//! A duration is seconds (`65`, `1.5`) or a number with a unit (`65s`, `500ms`, `2m`,
//! `1h`), from 1 ms to 24 h; in the file also an integer or float of seconds. The
//! HTTP/2 limits are [`super::h2`]'s.

use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Duration;

use super::options::{Options, RawDuration};
use super::{err, ConfigError};

#[derive(Debug, Clone)]
pub struct Timeouts {
    pub handshake: Duration,
    pub header: Duration,
    pub idle: Duration,
    pub send: Duration,
    pub shutdown: Duration,
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_body_bytes: u64,
}

// The timeouts' defaults; `--help` repeats them (a test in this module checks it does).
const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(15);
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(65);
const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// The five timeouts; an error names the flag or, for a file value, the key and the file.
pub fn timeouts(o: &Options, file_path: Option<&Path>) -> Result<Timeouts, ConfigError> {
    let t = |key: &str, v: &Option<RawDuration>, default| timeout(key, v.as_ref(), file_path, default);
    Ok(Timeouts {
        handshake: t("handshake_timeout", &o.handshake_timeout, DEFAULT_HANDSHAKE_TIMEOUT)?,
        header: t("header_timeout", &o.header_timeout, DEFAULT_HEADER_TIMEOUT)?,
        idle: t("idle_timeout", &o.idle_timeout, DEFAULT_IDLE_TIMEOUT)?,
        send: t("send_timeout", &o.send_timeout, DEFAULT_SEND_TIMEOUT)?,
        shutdown: t("shutdown_timeout", &o.shutdown_timeout, DEFAULT_SHUTDOWN_TIMEOUT)?,
    })
}

/// The request size limits.
pub fn limits(o: &Options) -> Result<Limits, ConfigError> {
    let max_header_bytes = o.max_header_bytes.unwrap_or(16 * 1024);
    if !(1024..=1024 * 1024).contains(&max_header_bytes) {
        return err(format!("max_header_bytes {max_header_bytes}: expected 1024 to 1048576"));
    }
    Ok(Limits { max_header_bytes, max_body_bytes: o.max_body_bytes.unwrap_or(1024 * 1024) })
}

/// `max_connections`: at least 1 when given.
pub fn max_connections(o: &Options) -> Result<Option<NonZeroUsize>, ConfigError> {
    match o.max_connections {
        Some(n) => NonZeroUsize::new(n).map(Some).ok_or_else(|| {
            ConfigError::new("max_connections must be at least 1 (leave it out for the file descriptor budget)")
        }),
        None => Ok(None),
    }
}

/// How a duration may be written, for error messages.
const DURATION_FORMS: &str = "expected seconds (65) or a number with a unit (65s, 500ms, 2m, 1h), from 1ms to 24h";

/// One timeout: the value given (the command line's text, or the file's integer, float or
/// text) or `default`. An error names the flag or, for a file value, the key and the file.
pub(super) fn timeout(
    key: &str,
    given: Option<&RawDuration>,
    file_path: Option<&Path>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let (parsed, shown) = match given {
        None => return Ok(default),
        Some(RawDuration::Flag(s)) => {
            return parse_duration(s)
                .ok_or_else(|| ConfigError::new(format!("--{} {s:?}: {DURATION_FORMS}", key.replace('_', "-"))));
        }
        Some(RawDuration::File(toml::Value::Integer(i))) => (secs_duration(*i as f64), i.to_string()),
        Some(RawDuration::File(toml::Value::Float(f))) => (secs_duration(*f), f.to_string()),
        Some(RawDuration::File(toml::Value::String(s))) => (parse_duration(s), format!("{s:?}")),
        Some(RawDuration::File(other)) => (None, format!("of type {}", other.type_str())),
    };
    parsed.ok_or_else(|| {
        let file = file_path.map(|p| format!("config file {}: ", p.display())).unwrap_or_default();
        ConfigError::new(format!("{file}{key} {shown}: {DURATION_FORMS}"))
    })
}

/// Parses `65` or `1.5` (seconds), `65s`, `500ms`, `2m`, `1h`; `None` if malformed or out of range.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    // Plain decimals only: f64's parser also takes "inf", "NaN", "1e3", "+5" and "-1".
    if !num.bytes().any(|b| b.is_ascii_digit()) || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    secs_duration(num.parse::<f64>().ok()? * unit)
}

/// Seconds to a timeout, if between 1 ms and 24 h.
fn secs_duration(secs: f64) -> Option<Duration> {
    // The lower bound is a hair under 1 ms so that "1ms" (1 * 0.001) is not lost to rounding.
    (secs.is_finite() && (0.000_999_9..=86_400.0).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("65", Some(ms(65_000))),
            ("65s", Some(ms(65_000))),
            ("500ms", Some(ms(500))),
            ("2m", Some(ms(120_000))),
            ("1h", Some(ms(3_600_000))),
            ("24h", Some(ms(86_400_000))),
            ("1.5", Some(ms(1_500))),
            ("0.25s", Some(ms(250))),
            ("1ms", Some(ms(1))),
            (" 10s ", Some(ms(10_000))),
            ("0", None),
            ("0s", None),
            ("0.5ms", None),
            ("25h", None),
            ("86401", None),
            ("-1", None),
            ("+5", None),
            ("1e3", None),
            ("NaN", None),
            ("inf", None),
            ("", None),
            ("s", None),
            ("ms", None),
            (".", None),
            ("1.2.3", None),
            ("10 s", None),
            ("10sec", None),
            ("5d", None),
            ("1m30s", None),
        ] {
            assert_eq!(parse_duration(text), want, "{text:?}");
        }
    }

    #[test]
    fn timeouts_from_cli_file_and_default() {
        let def = Duration::from_secs(7);
        let path = Path::new("/etc/ktlsd.toml");
        let v =
            |s: &str| Some(RawDuration::File(toml::from_str::<toml::Table>(&format!("v = {s}")).unwrap()["v"].clone()));
        let cli = |s: &str| Some(RawDuration::Flag(s.to_string()));
        for (given, want) in [
            (None, Ok(def)),
            (cli("2s"), Ok(Duration::from_secs(2))),
            (v("30"), Ok(Duration::from_secs(30))),
            (v("2.5"), Ok(Duration::from_millis(2_500))),
            (v("\"500ms\""), Ok(Duration::from_millis(500))),
            (v("\"2m\""), Ok(Duration::from_secs(120))),
            (cli("abc"), Err("--idle-timeout \"abc\": expected seconds (65) or a number with a unit")),
            (v("\"soon\""), Err("config file /etc/ktlsd.toml: idle_timeout \"soon\": expected seconds")),
            (v("0"), Err("config file /etc/ktlsd.toml: idle_timeout 0: expected")),
            (v("-3"), Err("idle_timeout -3: expected")),
            (v("true"), Err("idle_timeout of type boolean: expected")),
            (v("[1]"), Err("idle_timeout of type array: expected")),
        ] {
            let got = timeout("idle_timeout", given.as_ref(), Some(path), def);
            match (got, want) {
                (Ok(d), Ok(w)) => assert_eq!(d, w, "{given:?}"),
                (Err(e), Err(w)) => {
                    let e = e.to_string();
                    assert!(e.contains(w), "{given:?}: {e}");
                    assert!(e.contains("500ms, 2m, 1h"), "accepted forms not named: {e}");
                }
                (got, want) => panic!("{given:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn limits_ranges() {
        for (header, conns, ok) in
            [(None, None, true), (Some(1023), None, false), (Some(1024 * 1024), Some(1), true), (None, Some(0), false)]
        {
            let o = Options { max_header_bytes: header, max_connections: conns, ..Default::default() };
            assert_eq!(limits(&o).is_ok() && max_connections(&o).is_ok(), ok, "{header:?} {conns:?}");
        }
    }
}
