//! Entry points for the fuzz targets of `fuzz/`: thin wrappers over the parsers of
//! untrusted bytes, each giving back plain data (strings, numbers, the parser's own
//! verdict) for the target to check. The server never calls them; nothing else in the
//! crate is public.
//!
//! Not here: the properties the targets check (see `fuzz/fuzz_targets/`), or parsing of
//! its own: every function calls the code the server runs.

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::handler::cache::{entry, policy};
use crate::handler::preconditions::{self, Validators};
use crate::handler::request::{EntityTag, HeaderFields};
use crate::http::h1::parse as h1;
use crate::http::h2::{HpackDecoded, HpackDecoder as H2Decoder, HpackEncoder as H2Encoder};
use crate::tls::userspace::record::{self, RecordKey};

pub use crate::handler::preconditions::Outcome;
pub use crate::handler::proxy::parse::Framing;
pub use crate::handler::range::{RangeOutcome, RangeSet, MAX_RANGES};
pub use crate::http::h2::{BodySize, Connection, Event, Limits, StreamId, Write};

// ---- HTTP/1 request heads ----

/// A request head as the HTTP/1 codec parsed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H1Head {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub authority: Option<String>,
    pub target: String,
    pub http10: bool,
    pub keep_alive: bool,
    pub content_length: u64,
    pub expect_continue: bool,
    pub chunked: bool,
    /// Bytes of the buffer the head took.
    pub used: usize,
}

/// `http::h1::parse::parse`: `Ok(None)` incomplete, `Err((status, reason))` refused.
pub fn h1_request(buf: &[u8], max_head: usize) -> Result<Option<H1Head>, (u16, &'static str)> {
    let parsed = h1::parse(buf, max_head).map_err(|bad| (bad.status.0, bad.reason))?;
    Ok(parsed.map(|(head, used)| H1Head {
        method: head.request.method.as_str().to_string(),
        path: head.request.path,
        query: head.request.query,
        authority: head.request.authority,
        target: head.target,
        http10: head.version == h1::Version::Http10,
        keep_alive: head.keep_alive,
        content_length: head.content_length,
        expect_continue: head.expect_continue,
        chunked: head.chunked,
        used,
    }))
}

/// `http::h1::parse::is_head`.
pub fn h1_is_head(buf: &[u8]) -> bool {
    h1::is_head(buf)
}

// ---- the chunked coding and upstream response heads ----

/// The chunked decoder of request bodies and upstream responses.
#[derive(Debug, Default)]
pub struct Chunked(crate::handler::proxy::parse::Chunked);

impl Chunked {
    /// Bytes of `input` used; data appended to `out`; `Err(why)` for a malformed body.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, &'static str> {
        self.0.decode(input, out).map_err(|e| e.0)
    }

    pub fn is_done(&self) -> bool {
        self.0.is_done()
    }
}

/// An upstream's response head as the proxy parsed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamHead {
    pub status: u16,
    pub version: &'static str,
    pub fields: Vec<(String, String)>,
    pub framing: Framing,
    pub reusable: bool,
    pub used: usize,
}

/// `handler::proxy::parse::head` for a request of `method`.
pub fn upstream_head(buf: &[u8], method: &str) -> Result<Option<UpstreamHead>, &'static str> {
    let parsed = crate::handler::proxy::parse::head(buf, method).map_err(|e| e.0)?;
    Ok(parsed.map(|(h, used)| UpstreamHead {
        status: h.status,
        version: h.version,
        fields: h.fields.into_iter().map(|(n, v)| (n.to_string(), v)).collect(),
        framing: h.framing,
        reusable: h.reusable,
        used,
    }))
}

// ---- HPACK ----

/// A field list: names and values.
pub type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// The HTTP/2 codec's HPACK decoder, with its table and list limits.
pub struct HpackDecoder(H2Decoder);

impl HpackDecoder {
    pub fn new(table_size: u32, max_list_size: u32) -> HpackDecoder {
        HpackDecoder(H2Decoder::new(table_size, max_list_size))
    }

    /// One field block: `Ok(Some(fields))`, `Ok(None)` over the list limit, `Err` a
    /// COMPRESSION_ERROR (the reason).
    pub fn decode(&mut self, block: &[u8]) -> Result<Option<Fields>, String> {
        match self.0.decode(block) {
            Ok(HpackDecoded::Fields(f)) => Ok(Some(f)),
            Ok(HpackDecoded::TooLarge) => Ok(None),
            Err(e) => Err(format!("{e:?}")),
        }
    }
}

/// The HTTP/2 codec's HPACK encoder of response fields.
pub struct HpackEncoder(H2Encoder);

impl Default for HpackEncoder {
    fn default() -> Self {
        HpackEncoder(H2Encoder::new())
    }
}

impl HpackEncoder {
    /// The peer's SETTINGS_HEADER_TABLE_SIZE.
    pub fn set_peer_table_size(&mut self, size: u32) {
        self.0.set_peer_table_size(size);
    }

    /// One field block of `fields`.
    pub fn encode(&mut self, fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let mut block = Vec::new();
        self.0.start(&mut block);
        for (n, v) in fields {
            self.0.field(n, v, &mut block);
        }
        block
    }
}

// ---- cache entries ----

/// What the cache made of an entry file, and its answers at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    pub key: String,
    pub status: u16,
    pub fields: Vec<(String, String)>,
    pub body: Range<u64>,
    pub age: Duration,
    pub stale: bool,
    pub freshness: String,
    pub serve_while_revalidating: bool,
    pub serve_on_error: bool,
    pub revalidation: Vec<(String, String)>,
    /// The head after a 304 carrying `refresh_fields` (`None`: the 304 does not select it).
    pub refreshed: Option<Vec<(String, String)>>,
}

/// The bytes of a valid entry file (the writer's layout), for seeds and for
/// [`cache_entry_fix_checksum`].
pub fn cache_entry_file(head_json: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entry::PREFIX as usize + head_json.len() + body.len());
    out.extend_from_slice(entry::MAGIC);
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(body).to_le_bytes());
    out.extend_from_slice(&(head_json.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 32]);
    out.extend_from_slice(head_json);
    out.extend_from_slice(body);
    cache_entry_fix_checksum(&mut out);
    out
}

/// Rewrites the head checksum of an entry file to agree with its lengths and head, so
/// that mutations of the head reach the JSON and the cache's rules.
pub fn cache_entry_fix_checksum(file: &mut [u8]) {
    let Some(prefix) = file.get(..entry::PREFIX as usize) else { return };
    let head_len = u32::from_le_bytes([prefix[24], prefix[25], prefix[26], prefix[27]]) as usize;
    let Some(head) = file.get(entry::PREFIX as usize..entry::PREFIX as usize + head_len) else { return };
    let sum = entry::checksum(&file[8..28], head);
    file[28..60].copy_from_slice(&sum);
}

/// Reads `file` as the cache reads an entry file on start-up or on a hit
/// (`entry::read_head`, then `policy::Meta::new`), then asks the entry what a hit at
/// `now_ms` would: age, freshness for `request` fields, RFC 5861 windows, the
/// revalidation fields, and the refresh by a 304 of `refresh_fields`.
pub fn cache_entry(
    file: &[u8],
    now_ms: u64,
    request: &[(String, String)],
    refresh_fields: &[(String, String)],
) -> Result<CacheEntry, String> {
    let read_at = |buf: &mut [u8], at: u64| -> io::Result<()> {
        let at = usize::try_from(at).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let src = file.get(at..).and_then(|s| s.get(..buf.len())).ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    };
    let parsed = match entry::read_head_with(read_at, file.len() as u64) {
        Ok(p) => p,
        Err(entry::Bad::Corrupt(why)) => return Err(why.to_string()),
        Err(entry::Bad::Io(e)) => return Err(e.to_string()),
    };
    let meta = policy::Meta::new(parsed, file.len() as u64, PathBuf::from("/nonexistent/entry"))
        .ok_or("its fields are not valid")?;
    let now = entry::time(now_ms);
    let map = |fields: &[(String, String)]| {
        let mut m = http::HeaderMap::new();
        for (n, v) in fields {
            if let (Ok(n), Ok(v)) = (http::HeaderName::try_from(n.as_str()), http::HeaderValue::try_from(v.as_str())) {
                m.append(n, v);
            }
        }
        m
    };
    let (req, refresh) = (map(request), map(refresh_fields));
    let pairs = |m: &http::HeaderMap| {
        m.iter().map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect()
    };
    Ok(CacheEntry {
        key: meta.head.key.clone(),
        status: meta.head.status,
        fields: meta.head.fields.clone(),
        body: meta.body_offset..meta.body_offset + meta.body_len,
        age: meta.age(now),
        stale: meta.is_stale(now),
        freshness: format!("{:?}", meta.freshness(&req, now)),
        serve_while_revalidating: meta.may_serve_while_revalidating(&req, now),
        serve_on_error: meta.may_serve_on_error(&req, now),
        revalidation: pairs(&meta.revalidation()),
        refreshed: meta.refreshed(&refresh, now).map(|h| h.fields),
    })
}

// ---- ranges and conditional requests ----

/// The handler's answer to a request's conditional and range fields for a file of
/// `size` bytes with entity tag `etag` (weak or not) and modification time `modified`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conditional {
    pub outcome: Outcome,
    /// `None`: no Range honoured (absent, malformed, or If-Range does not match).
    pub range: Option<RangeOutcome>,
}

/// Parses the field lines as a codec hands them to the handler (`HeaderFields`),
/// then evaluates the preconditions and the Range as the static answer does.
pub fn conditional(fields: &[(&str, &str)], etag: &str, weak: bool, modified: SystemTime, size: u64) -> Conditional {
    let mut collected = HeaderFields::default();
    for (n, v) in fields {
        collected.add(n, v);
    }
    let headers = collected.parse();
    let v = Validators { etag: EntityTag { weak, opaque: etag.to_string() }, modified };
    let outcome = preconditions::evaluate(&headers, &v);
    let range = match (&headers.range, preconditions::range_applies(&headers, &v)) {
        (Some(r), true) => Some(r.resolve(size)),
        _ => None,
    };
    Conditional { outcome, range }
}

/// A piece of a `multipart/byteranges` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyPart {
    Bytes(Vec<u8>),
    /// These bytes of the file.
    File(Range<u64>),
}

/// `handler::range::multipart`: the parts and length of a `multipart/byteranges` body.
pub fn multipart(ranges: &[Range<u64>], size: u64, content_type: &str, boundary: &str) -> (Vec<BodyPart>, u64) {
    let (parts, len) = crate::handler::range::multipart(ranges, size, content_type, boundary);
    let parts = parts
        .into_iter()
        .map(|p| match p {
            crate::handler::range::Part::Bytes(b) => BodyPart::Bytes(b),
            crate::handler::range::Part::File(r) => BodyPart::File(r),
        })
        .collect();
    (parts, len)
}

// ---- request paths ----

/// A normalised path: its segments under ROOT, and whether a `/` ends it.
pub type Segments = (Vec<Vec<u8>>, bool);

/// `files::normalize`, or the refusal's status and reason.
pub fn normalize_path(path: &str, dotfiles: bool) -> Result<Segments, (u16, String)> {
    let opts = crate::files::Options { dotfiles, autoindex: false, cache_entries: 0 };
    let n = crate::files::normalize(path, 7, opts).map_err(|r| (r.status(), r.reason()))?;
    Ok((n.segments().map(<[u8]>::to_vec).collect(), n.trailing_slash))
}

/// `handler::pattern::route_path`: the path `[[redirect]]` and `[[access]]` rules see.
pub fn route_path(raw: &str) -> Option<String> {
    crate::handler::pattern::route_path(raw)
}

/// A `[[redirect]]`/`[[access]]` path pattern: whether it compiles, then what it
/// matches and captures of `path`.
pub fn path_pattern(pattern: &str, path: &str) -> Result<(bool, Option<String>), String> {
    let p = crate::handler::pattern::PathPattern::new(pattern)?;
    Ok((p.matches(path), p.capture(path).map(str::to_string)))
}

// ---- the userspace TLS record layer ----

/// The ciphers a record key can be made of here (rustls gives AES-128 keys only from a
/// handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cipher {
    Aes256Gcm,
    Chacha20Poly1305,
}

/// One direction's record key of the userspace record layer.
pub struct Records(RecordKey);

impl Records {
    pub fn new(tls13: bool, cipher: Cipher, key: [u8; 32], iv: [u8; 12], seq: u64) -> Option<Records> {
        let (key, iv) = (rustls::crypto::cipher::AeadKey::from(key), rustls::crypto::cipher::Iv::new(iv));
        let secrets = match cipher {
            Cipher::Aes256Gcm => rustls::ConnectionTrafficSecrets::Aes256Gcm { key, iv },
            Cipher::Chacha20Poly1305 => rustls::ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv },
        };
        RecordKey::new(version(tls13), &secrets, seq).ok().map(Records)
    }

    /// One sealed record of content type `typ` holding `plaintext` (at most 16 KiB).
    pub fn seal(&mut self, typ: u8, plaintext: &[u8]) -> Vec<u8> {
        let prefix = self.0.prefix_len();
        let mut rec = vec![0u8; prefix + plaintext.len() + self.0.suffix_len()];
        rec[prefix..prefix + plaintext.len()].copy_from_slice(plaintext);
        self.0.seal(rustls::ContentType::from(typ), &mut rec, plaintext.len());
        rec
    }

    /// Opens the whole record `rec` in place: its content type and where its plaintext
    /// lies, or the alert that refuses it.
    pub fn open(&mut self, rec: &mut [u8]) -> Result<(u8, Range<usize>), String> {
        self.0.open(rec).map(|(t, r)| (u8::from(t), r)).map_err(|e| format!("{:?}", e.alert()))
    }

    pub fn seq(&self) -> u64 {
        self.0.seq()
    }
}

fn version(tls13: bool) -> crate::vocab::TlsVersion {
    if tls13 {
        crate::vocab::TlsVersion::Tls13
    } else {
        crate::vocab::TlsVersion::Tls12
    }
}

/// `record::record_len`: the length of the record starting `input` once its header is
/// there, or the alert that refuses it before its body.
pub fn record_len(input: &[u8], tls13: bool) -> Option<Result<usize, String>> {
    record::record_len(input, version(tls13)).map(|r| r.map_err(|e| format!("{:?}", e.alert())))
}

/// Largest record on the wire a peer may send, header included.
pub const MAX_WIRE_RECORD: usize = record::MAX_WIRE_RECORD;

// ---- htpasswd and Basic credentials ----

/// `handler::htpasswd::Users::parse`: whether the text is a usable password file.
pub fn htpasswd(text: &str) -> Result<(), String> {
    crate::handler::htpasswd::Users::parse(text).map(drop)
}

/// The user and password of an `Authorization: Basic` value.
pub fn basic_credentials(value: &str) -> Option<(String, Vec<u8>)> {
    crate::handler::auth::credentials(value)
}

// ---- the configuration file ----

/// Validates `text` as the configuration file `dir/ktlsd.toml` as `ktlsd check` does,
/// except that its includes are not read and every path it names is taken as the file
/// of that name in `dir` (the fuzz target's sandbox: no file elsewhere is read).
/// `${VAR}`s have the values `vars` gives.
pub fn config_text(dir: &Path, text: &str, vars: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    use crate::config::{file_paths, include, Config};
    let path = dir.join("ktlsd.toml");
    let table = include::table(&path, text, vars).map_err(|e| e.to_string())?;
    let mut options = include::options(&path, text, table).map_err(|e| e.to_string())?;
    options.include = None;
    for p in file_paths(&mut options) {
        *p = dir.join(p.file_name().unwrap_or_default());
    }
    Config::from_options(options, Some(&path)).map(drop).map_err(|e| e.to_string())
}

// ---- PROXY protocol headers ----

/// `server::proxy_protocol::parse`: `Some((length, client address))` for a whole
/// header at the start of `bytes`, `None` for the beginning of one, `Err` for a refusal.
#[allow(clippy::type_complexity)]
pub fn proxy_header(bytes: &[u8]) -> Result<Option<(usize, Option<std::net::SocketAddr>)>, String> {
    use crate::server::proxy_protocol::{parse, Parsed};
    match parse(bytes) {
        Parsed::Header { len, source } => Ok(Some((len, source))),
        Parsed::Partial => Ok(None),
        Parsed::Bad(why) => Err(why),
    }
}
