//! Directory listings (`--autoindex`): the entries of an open directory, sorted
//! directories first in natural case-insensitive order, as HTML or JSON.
//!
//! Names are escaped for their place (HTML text, attribute, URL segment, JSON
//! string); dot-files are hidden unless enabled. Which listing is sent and with
//! which headers is the handler's choice.

use std::cmp::Ordering;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::SystemTime;

use super::{Listing, Options};

/// What a listed entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Directory,
    File,
    /// Anything else (a symbolic link, a socket, a device): listed without size;
    /// whether it is served is decided when it is asked for.
    Other,
}

/// One listed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
    /// Bytes for files; `None` for directories and others.
    pub size: Option<u64>,
    pub modified: Option<SystemTime>,
}

/// The visible entries of `listing`, directories first, in natural order.
pub fn entries(listing: &Listing, opts: Options) -> std::io::Result<Vec<Entry>> {
    let dir_path = PathBuf::from(format!("/proc/self/fd/{}", listing.dir.as_raw_fd()));
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir_path)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && !opts.dotfiles {
            continue;
        }
        // Not followed: a link's target may be outside ROOT, and its size and date
        // are not to be told before the open's own checks.
        let meta = entry.metadata().ok();
        let kind = match &meta {
            Some(m) if m.is_dir() => Kind::Directory,
            Some(m) if m.is_file() => Kind::File,
            _ => Kind::Other,
        };
        let size = meta.as_ref().filter(|_| kind == Kind::File).map(|m| m.len());
        let modified = meta.as_ref().and_then(|m| m.modified().ok());
        out.push(Entry { name, kind, size, modified });
    }
    out.sort_by(|a, b| {
        (a.kind != Kind::Directory).cmp(&(b.kind != Kind::Directory)).then_with(|| natural_cmp(&a.name, &b.name))
    });
    Ok(out)
}

/// Natural, case-insensitive order: runs of digits compare by value (`file2` before
/// `file10`); ties fall back to byte order so that the order is total.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < x.len() && j < y.len() {
        if x[i].is_ascii_digit() && y[j].is_ascii_digit() {
            let (si, sj) = (i, j);
            while i < x.len() && x[i].is_ascii_digit() {
                i += 1;
            }
            while j < y.len() && y[j].is_ascii_digit() {
                j += 1;
            }
            let (n, m) = (trim_zeros(&x[si..i]), trim_zeros(&y[sj..j]));
            // Longer without leading zeros is larger; equal length compares digit by digit.
            let o = n.len().cmp(&m.len()).then_with(|| n.cmp(m));
            if o != Ordering::Equal {
                return o;
            }
        } else {
            let o = x[i].to_ascii_lowercase().cmp(&y[j].to_ascii_lowercase());
            if o != Ordering::Equal {
                return o;
            }
            i += 1;
            j += 1;
        }
    }
    (x.len() - i).cmp(&(y.len() - j)).then_with(|| a.cmp(b))
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let n = d.iter().take_while(|&&b| b == b'0').count();
    &d[n..]
}

/// The request path as a reader sees it: percent-decoded (invalid UTF-8 replaced).
pub fn decoded_title(url_path: &str) -> String {
    percent_encoding::percent_decode_str(url_path).decode_utf8_lossy().into_owned()
}

/// The HTML page for `entries` of the directory at `url_path` (as requested, encoded).
pub fn html(url_path: &str, entries: &[Entry]) -> String {
    let title = html_escape(&decoded_title(url_path));
    let mut out = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
<title>Index of {title}</title>\n<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
td,th{{padding:.2em 1.2em .2em 0;text-align:left}}td.n{{text-align:right;font-variant-numeric:tabular-nums}}</style></head>\n\
<body><h1>Index of {title}</h1>\n<table>\n<thead><tr><th>Name</th><th>Size</th><th>Modified (UTC)</th></tr></thead>\n<tbody>\n\
<tr><td><a href=\"../\">../</a></td><td></td><td></td></tr>\n"
    );
    for e in entries {
        let slash = if e.kind == Kind::Directory { "/" } else { "" };
        let href: String = percent_encoding::utf8_percent_encode(&e.name, percent_encoding::NON_ALPHANUMERIC).collect();
        let size = e.size.map(human_size).unwrap_or_else(|| "-".into());
        let date = e.modified.map(|t| civil(t, ' ')).unwrap_or_default();
        out.push_str(&format!(
            "<tr><td><a href=\"{href}{slash}\">{}{slash}</a></td><td class=\"n\">{size}</td><td>{date}</td></tr>\n",
            html_escape(&e.name)
        ));
    }
    out.push_str("</tbody></table>\n</body></html>\n");
    out
}

/// The JSON listing: an array of `{name, type, size, mtime}` (mtime RFC 3339, UTC).
pub fn json(entries: &[Entry]) -> String {
    #[derive(serde::Serialize)]
    struct Item<'a> {
        name: &'a str,
        #[serde(rename = "type")]
        kind: Kind,
        size: Option<u64>,
        mtime: Option<String>,
    }
    let items: Vec<Item<'_>> = entries
        .iter()
        .map(|e| Item { name: &e.name, kind: e.kind, size: e.size, mtime: e.modified.map(|t| civil(t, 'T') + "Z") })
        .collect();
    let mut s = serde_json::to_string(&items).unwrap_or_else(|_| "[]".into());
    s.push('\n');
    s
}

/// `1.5 KiB`-style sizes; bytes below 1 KiB exactly.
fn human_size(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// `YYYY-MM-DD<sep>HH:MM:SS` in UTC (days to civil date after H. Hinnant's algorithm).
fn civil(t: SystemTime, sep: char) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}{sep}{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn natural_order() {
        let mut names = vec!["file10", "File2", "file1", "a", "B", "file02", "x9y", "x10y", "file2"];
        names.sort_by(|a, b| natural_cmp(a, b));
        // Equal by value and case: byte order decides, so the order is total.
        assert_eq!(names, ["a", "B", "file1", "File2", "file02", "file2", "file10", "x9y", "x10y"]);
        assert_eq!(natural_cmp("99999999999999999999999", "100000000000000000000000"), Ordering::Less, "no overflow");
    }

    #[test]
    fn dates_and_sizes() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(civil(t, 'T'), "2023-11-14T22:13:20");
        assert_eq!(civil(SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400), ' '), "2000-02-29 00:00:00");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(5 << 30), "5.0 GiB");
    }

    #[test]
    fn pages_escape_names_and_decode_the_title() {
        let e = |name: &str, kind| Entry { name: name.into(), kind, size: Some(3), modified: None };
        let entries = [e("d<i>r", Kind::Directory), e("a\"b'&.txt", Kind::File)];
        let page = html("/caf%C3%A9%20%3Cx%3E/", &entries);
        assert!(page.contains("<title>Index of /café &lt;x&gt;/</title>"), "{page}");
        assert!(page.contains("<a href=\"d%3Ci%3Er/\">d&lt;i&gt;r/</a>"), "{page}");
        assert!(page.contains("<a href=\"a%22b%27%26%2Etxt\">a&quot;b&#39;&amp;.txt</a>"), "{page}");
        assert!(!page.contains("<i>"));
        let j: serde_json::Value = serde_json::from_str(&json(&entries)).unwrap();
        assert_eq!(j[0]["name"], "d<i>r");
        assert_eq!(j[0]["type"], "directory");
        assert_eq!(j[1]["type"], "file");
        assert_eq!(j[1]["size"], 3);
    }
}
