//! The file tree: turns a request path into an open file under ROOT, or a refusal
//! that says why.
//!
//! Safety rules, applied in this order: percent-decoding, no NUL, `.` and `..`
//! resolved lexically without ever rising above ROOT, no dot-files unless enabled,
//! and the open itself confined to ROOT by the kernel (`openat2` with
//! `RESOLVE_BENEATH`), so no symlink can lead outside it.

mod cache;
pub mod compress;
pub mod listing;
mod open;
pub mod residency;

use std::ffi::OsStr;
use std::fs::{File, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

pub use cache::counts as cache_counts;
pub use cache::release as release_cached;
pub use cache::set_metadata_valid as set_cache_valid;
pub use open::Root;

/// A byte range of an open file, sent as a response body.
#[derive(Debug, Clone)]
pub struct FileRange<'a> {
    pub file: &'a File,
    /// Half-open: `start..end`, within the file's length.
    pub range: std::ops::Range<u64>,
    /// The whole file's bytes, checked against this request's `fstat` (see
    /// [`Found::content`]); a body writer that copies bytes may take them from here.
    pub cached: Option<&'a [u8]>,
}

impl FileRange<'_> {
    pub fn len(&self) -> u64 {
        self.range.end - self.range.start
    }

    /// The file's bytes `offset..offset + len` from memory, when they are kept.
    pub fn cached_at(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        self.cached?.get(start..start.checked_add(len)?)
    }
}

/// Why a path was not served. Each maps to one status code and one log reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Malformed: bad percent-encoding, NUL byte, not an absolute path (400).
    BadPath(&'static str),
    /// `..` would leave ROOT (400; nginx answers the same).
    Escape,
    /// A dot-file or dot-directory while they are disabled (404, to not reveal it).
    Hidden,
    /// Nothing there (404).
    NotFound,
    /// A symlink leads outside ROOT (403).
    OutsideRoot,
    /// Directory without index.html and listing off, special file, or permission (403).
    Forbidden(&'static str),
    /// A directory asked for without its trailing slash (301 to `location`).
    AddSlash(String),
    /// The process is out of file descriptors even after closing every held one
    /// (503: a shortage that passes, not a fault of the server's files).
    NoDescriptors,
}

impl Refusal {
    pub fn status(&self) -> u16 {
        match self {
            Refusal::BadPath(_) | Refusal::Escape => 400,
            Refusal::Hidden | Refusal::NotFound => 404,
            Refusal::OutsideRoot | Refusal::Forbidden(_) => 403,
            Refusal::AddSlash(_) => 301,
            Refusal::NoDescriptors => 503,
        }
    }

    pub fn reason(&self) -> String {
        match self {
            Refusal::BadPath(why) => format!("bad path: {why}"),
            Refusal::Escape => "path escapes the root with ..".into(),
            Refusal::Hidden => "dot-file (enable with --dotfiles)".into(),
            Refusal::NotFound => "no such file".into(),
            Refusal::OutsideRoot => "symlink leads outside the root".into(),
            Refusal::Forbidden(why) => (*why).into(),
            Refusal::AddSlash(_) => "directory without trailing slash".into(),
            Refusal::NoDescriptors => {
                "out of file descriptors (raise the hard RLIMIT_NOFILE, e.g. LimitNOFILE= or ulimit -Hn)".into()
            }
        }
    }
}

/// A file ready to be served.
pub struct Found {
    pub file: Rc<File>,
    pub meta: Metadata,
    /// Path relative to ROOT, for the Content-Type.
    pub rel: Rc<Path>,
    /// The built-in Content-Type of `rel` ([`content_type`]), looked up once per
    /// open-file cache entry rather than per request.
    pub mime: &'static str,
    /// The whole file, for a small file the worker keeps in memory: the same bytes
    /// a read would give now, as far as `meta` can tell (read when the file had
    /// this very size, inode and times).
    pub content: Option<Rc<[u8]>>,
}

impl Found {
    /// A file just opened, its bytes not (yet) kept.
    fn new(file: File, meta: Metadata, rel: PathBuf) -> Found {
        let mime = content_type(&rel);
        Found { file: Rc::new(file), meta, rel: rel.into(), mime, content: None }
    }

    /// `range` of this file as a response body.
    pub fn body(&self, range: std::ops::Range<u64>) -> FileRange<'_> {
        FileRange { file: &self.file, range, cached: self.content.as_deref() }
    }
}

/// A directory to list (only with `--autoindex`).
pub struct Listing {
    pub dir: File,
    pub url_path: String,
}

pub enum Resolved {
    File(Found),
    Directory(Listing),
}

/// Serving options that affect resolution.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub dotfiles: bool,
    pub autoindex: bool,
    /// Most open files each worker's cache keeps (its share of the fd budget; 0: none).
    pub cache_entries: usize,
}

/// Bytes escaped when a path segment is written back into a URL.
const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'\\');

/// The top-level directory of well-known URIs, served even when dot-files are hidden.
const WELL_KNOWN: &[u8] = b".well-known";

/// A request path decoded and normalised, laid out as its open-file cache key:
/// the ROOT's id (a reload opens a new one), then `/segment` for each segment (no
/// segment is empty or holds a `/` or NUL, so the layout is unambiguous), then a
/// final `/` when the request had one (always at ROOT).
pub struct Normalized {
    key: Vec<u8>,
    pub trailing_slash: bool,
}

/// Bytes of the ROOT's id at the start of a key.
const ID: usize = 8;

impl Normalized {
    /// The segments relative to ROOT.
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> {
        self.key[ID..].split(|&b| b == b'/').filter(|s| !s.is_empty())
    }

    fn at_root(&self) -> bool {
        self.segments().next().is_none()
    }
}

/// Decodes and normalises the path part of a request target (no query) for the
/// ROOT with id `root`.
pub fn normalize(path: &str, root: u64, opts: Options) -> Result<Normalized, Refusal> {
    if !path.starts_with('/') {
        return Err(Refusal::BadPath("target is not an absolute path"));
    }
    // Most paths hold no escape: read them in place.
    let decoded = match path.contains('%') {
        true => std::borrow::Cow::Owned(decode(path.as_bytes())?),
        false => std::borrow::Cow::Borrowed(path.as_bytes()),
    };
    if decoded.contains(&0) {
        return Err(Refusal::BadPath("NUL byte"));
    }
    let mut key = Vec::with_capacity(ID + decoded.len() + 1);
    key.extend_from_slice(&root.to_be_bytes());
    for seg in decoded.split(|&b| b == b'/') {
        match seg {
            b"" | b"." => {}
            b".." => {
                // Drop the last `/segment`.
                match key[ID..].iter().rposition(|&b| b == b'/') {
                    Some(at) => key.truncate(ID + at),
                    None => return Err(Refusal::Escape),
                }
            }
            s => {
                // RFC 8615 well-known URIs (ACME challenges, security.txt) are public by
                // design; dot-files inside them stay hidden.
                let well_known = key.len() == ID && s == WELL_KNOWN;
                if s[0] == b'.' && !opts.dotfiles && !well_known {
                    return Err(Refusal::Hidden);
                }
                key.push(b'/');
                key.extend_from_slice(s);
            }
        }
    }
    let trailing_slash = decoded.ends_with(b"/") || key.len() == ID;
    if trailing_slash {
        key.push(b'/');
    }
    Ok(Normalized { key, trailing_slash })
}

fn decode(input: &[u8]) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == b'%' {
            let hex = input.get(i + 1..i + 3).ok_or(Refusal::BadPath("truncated percent-escape"))?;
            let hi = (hex[0] as char).to_digit(16);
            let lo = (hex[1] as char).to_digit(16);
            match (hi, lo) {
                (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                _ => return Err(Refusal::BadPath("invalid percent-escape")),
            }
            i += 3;
        } else {
            out.push(input[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// Resolves a request path to a file (or directory listing) under `root`,
/// through the worker's open-file cache.
pub fn resolve(root: &Root, path: &str, opts: Options) -> Result<Resolved, Refusal> {
    let now = Instant::now();
    let normal = normalize(path, root.id(), opts)?;
    if let Some(found) = cache::get(&normal.key, now) {
        return Ok(Resolved::File(found));
    }
    let mut resolved = match resolve_uncached(root, path, &normal, opts) {
        // Out of descriptors: give back every held one and try once more.
        Err(Refusal::NoDescriptors) => {
            cache::clear();
            crate::fds::release_all();
            resolve_uncached(root, path, &normal, opts)?
        }
        other => other?,
    };
    if let Resolved::File(found) = &mut resolved {
        found.content = cache::put(&normal.key, found, now, opts.cache_entries);
    }
    Ok(resolved)
}

/// The precompressed variant of a found file: `rel` with `suffix` appended
/// (`style.css` -> `style.css.br`), opened beneath ROOT exactly as the original was
/// (same directory, a name that is no dot-file since the original's is not) and
/// served only when it is a regular file. `None` when there is none to serve.
pub fn variant(root: &Root, rel: &Path, suffix: &str, opts: Options) -> Option<Found> {
    let mut name = rel.as_os_str().to_os_string();
    name.push(suffix);
    let rel = PathBuf::from(name);
    let now = Instant::now();
    let mut key = Vec::with_capacity(ID + 1 + rel.as_os_str().len());
    key.extend_from_slice(&root.id().to_be_bytes());
    key.push(b'/');
    key.extend_from_slice(rel.as_os_str().as_bytes());
    if let Some(found) = cache::get(&key, now) {
        return Some(found);
    }
    match root.open(&rel) {
        Ok((file, meta)) if meta.is_file() => {
            let mut found = Found::new(file, meta, rel);
            found.content = cache::put(&key, &found, now, opts.cache_entries);
            Some(found)
        }
        _ => None,
    }
}

fn resolve_uncached(root: &Root, path: &str, normal: &Normalized, opts: Options) -> Result<Resolved, Refusal> {
    let trailing_slash = normal.trailing_slash;
    let mut rel = PathBuf::new();
    for s in normal.segments() {
        rel.push(OsStr::from_bytes(s));
    }
    let (file, meta) = root.open(&rel)?;
    if meta.is_file() {
        // `/file.txt/` names a directory that does not exist (nginx: 404).
        if trailing_slash && !normal.at_root() {
            return Err(Refusal::NotFound);
        }
        return Ok(Resolved::File(Found::new(file, meta, rel)));
    }
    if !meta.is_dir() {
        return Err(Refusal::Forbidden("not a regular file"));
    }
    if !trailing_slash {
        // Built from the normalised segments: the raw path could start with `//`,
        // which a browser would read as another host.
        let mut location = String::new();
        for s in normal.segments() {
            location.push('/');
            location.extend(percent_encoding::percent_encode(s, PATH_SEGMENT));
        }
        location.push('/');
        return Err(Refusal::AddSlash(location));
    }
    let index = rel.join("index.html");
    match root.open(&index) {
        Ok((file, meta)) if meta.is_file() => Ok(Resolved::File(Found::new(file, meta, index))),
        Err(Refusal::NotFound) | Ok(_) if opts.autoindex => {
            Ok(Resolved::Directory(Listing { dir: file, url_path: path.to_string() }))
        }
        Err(Refusal::NotFound) | Ok(_) => Err(Refusal::Forbidden("directory has no index.html and listing is off")),
        Err(other) => Err(other),
    }
}

/// The entity tag of a file: modification time and size, in hex (nginx's form).
pub fn etag(meta: &Metadata) -> String {
    etag_with(meta, "")
}

/// The entity tag of a precompressed variant: the variant's own time and size, and
/// its coding, so it differs from the original's and from other codings'.
pub fn etag_of_variant(meta: &Metadata, coding: &str) -> String {
    etag_with(meta, coding)
}

/// `"mtime-size"` or `"mtime-size-coding"`, written without `core::fmt` (one per
/// request). A negative mtime reads as its two's complement, as `{:x}` of an i64 does.
fn etag_with(meta: &Metadata, coding: &str) -> String {
    let mut tag = String::with_capacity(36 + coding.len());
    tag.push('"');
    push_hex(&mut tag, meta.mtime() as u64);
    tag.push('-');
    push_hex(&mut tag, meta.size());
    if !coding.is_empty() {
        tag.push('-');
        tag.push_str(coding);
    }
    tag.push('"');
    tag
}

/// Appends `n` in lower-case hex without leading zeros.
fn push_hex(out: &mut String, n: u64) {
    let digits = (64 - n.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        out.push(char::from(b"0123456789abcdef"[((n >> (i * 4)) & 0xf) as usize]));
    }
}

/// Modification time, truncated to whole seconds as HTTP dates are.
pub fn modified(meta: &Metadata) -> SystemTime {
    let secs = meta.mtime().max(0) as u64;
    SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)
}

/// Content-Type by extension, from the built-in table.
pub fn content_type(rel: &Path) -> &'static str {
    let mime = mime_guess::from_path(rel).first_raw().unwrap_or("application/octet-stream");
    if mime.starts_with("text/") || mime == "application/javascript" || mime == "application/json" {
        with_charset(mime)
    } else {
        mime
    }
}

/// `mime; charset=utf-8`, made once per type and kept for the process's life, so
/// that a Content-Type is a `&'static str` like the table's own. The types come
/// from mime_guess's fixed table, so at most one string per text type in it is kept.
fn with_charset(mime: &'static str) -> &'static str {
    static MADE: Mutex<Vec<(&str, &str)>> = Mutex::new(Vec::new());
    let mut made = MADE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, t)) = made.iter().find(|(m, _)| *m == mime) {
        return t;
    }
    let t: &'static str = Box::leak(format!("{mime}; charset=utf-8").into_boxed_str());
    made.push((mime, t));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTS: Options = Options { dotfiles: false, autoindex: false, cache_entries: 16 };

    fn segs(p: &str) -> Result<Vec<String>, Refusal> {
        normalize(p, 0, OPTS).map(|n| n.segments().map(|s| String::from_utf8(s.to_vec()).unwrap()).collect())
    }

    #[test]
    fn normalizes_inside_root() {
        assert_eq!(segs("/a/./b/../c").unwrap(), ["a", "c"]);
        assert_eq!(segs("/a%20b").unwrap(), ["a b"]);
        assert_eq!(segs("/a%2Fb").unwrap(), ["a", "b"]);
        assert_eq!(segs("//a//").unwrap(), ["a"]);
    }

    #[test]
    fn spellings_of_one_path_share_a_cache_key() {
        let key = |p: &str| {
            let k = normalize(p, 7, OPTS).unwrap().key;
            assert_eq!(k[..8], 7u64.to_be_bytes(), "the key starts with the ROOT's id");
            k[8..].to_vec()
        };
        for p in ["/x", "/./x", "/%78", "//x", "/a/../x", "/./././%2E/x"] {
            assert_eq!(key(p), b"/x", "{p}");
        }
        assert_eq!(key("/x/"), b"/x/");
        assert_eq!(key("/d/e"), b"/d/e");
        assert_eq!(key("/d%2Fe"), b"/d/e");
        assert_eq!(key("/"), b"/");
        assert_eq!(key("/a/.."), b"/");
    }

    #[test]
    fn well_known_is_public_at_the_top_only() {
        for p in
            ["/.well-known/security.txt", "/%2Ewell-known/x", "/a/../.well-known/x", "/.well-known/acme-challenge/t"]
        {
            assert_eq!(segs(p).unwrap()[0], ".well-known", "{p}");
        }
    }

    #[test]
    fn refuses_escapes_and_junk() {
        assert_eq!(segs("/../etc/passwd"), Err(Refusal::Escape));
        assert_eq!(segs("/a/%2e%2e/%2E%2E/x"), Err(Refusal::Escape));
        assert_eq!(segs("/..%2fetc"), Err(Refusal::Escape));
        assert_eq!(segs("/a%00b"), Err(Refusal::BadPath("NUL byte")));
        assert_eq!(segs("/%zz"), Err(Refusal::BadPath("invalid percent-escape")));
        assert_eq!(segs("/%4"), Err(Refusal::BadPath("truncated percent-escape")));
        assert_eq!(segs("/.env"), Err(Refusal::Hidden));
        assert_eq!(segs("/a/.git/config"), Err(Refusal::Hidden));
        assert_eq!(segs("/a/.well-known/x"), Err(Refusal::Hidden));
        assert_eq!(segs("/.well-known/.secret"), Err(Refusal::Hidden));
        assert_eq!(segs("/.well-knownx"), Err(Refusal::Hidden));
        assert_eq!(segs("relative"), Err(Refusal::BadPath("target is not an absolute path")));
    }
}

#[cfg(test)]
mod resolve_tests {
    use super::*;

    #[test]
    fn content_types() {
        for (name, want) in [
            ("a.txt", "text/plain; charset=utf-8"),
            ("a.html", "text/html; charset=utf-8"),
            ("a.css", "text/css; charset=utf-8"),
            ("a.js", "text/javascript; charset=utf-8"),
            ("a.json", "application/json; charset=utf-8"),
            ("a.png", "image/png"),
            ("a.wasm", "application/wasm"),
            ("noext", "application/octet-stream"),
            ("a.unknownext", "application/octet-stream"),
        ] {
            assert_eq!(content_type(Path::new(name)), want, "{name}");
        }
    }

    #[test]
    fn hex_as_format_writes_it() {
        for n in [0u64, 1, 9, 10, 15, 16, 255, 256, 0x1234_5678, u64::MAX, (-5i64) as u64] {
            let mut s = String::new();
            push_hex(&mut s, n);
            assert_eq!(s, format!("{n:x}"));
        }
    }

    #[test]
    fn validators_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"12345").unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(etag(&meta), format!("\"{:x}-5\"", meta.mtime()));
        assert_eq!(etag_of_variant(&meta, "br"), format!("\"{:x}-5-br\"", meta.mtime()));
        let m = modified(&meta);
        assert_eq!(m.duration_since(SystemTime::UNIX_EPOCH).unwrap().subsec_nanos(), 0, "whole seconds");
        assert_eq!(m.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(), meta.mtime() as u64);
    }

    #[test]
    fn the_cache_binds_names_per_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x"), b"one").unwrap();
        let opts = Options { dotfiles: false, autoindex: false, cache_entries: 8 };
        let root = Root::new(dir.path()).unwrap();
        let first = match resolve(&root, "/x", opts) {
            Ok(Resolved::File(f)) => f,
            _ => panic!("a file"),
        };
        // Another spelling of the same path shares the open file; its size is read afresh.
        std::fs::write(dir.path().join("x"), b"one two").unwrap();
        let again = match resolve(&root, "/./%78", opts) {
            Ok(Resolved::File(f)) => f,
            _ => panic!("a file"),
        };
        assert!(Rc::ptr_eq(&first.file, &again.file));
        assert_eq!(again.meta.len(), 7);
        // A new ROOT (a reload) does not see the old binding.
        let reloaded = Root::new(dir.path()).unwrap();
        let fresh = match resolve(&reloaded, "/x", opts) {
            Ok(Resolved::File(f)) => f,
            _ => panic!("a file"),
        };
        assert!(!Rc::ptr_eq(&first.file, &fresh.file));
    }
}
