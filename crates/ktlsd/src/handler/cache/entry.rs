//! One entry file: its layout, how its head is encoded and checked, how its body
//! is checked against the checksum written with it, and how a new entry is
//! written (temporary file, then rename) or an old one rewritten with a refreshed
//! head.
//!
//! ```text
//! 0..8      magic and version: "KTLSDC2\n"
//! 8..16     body length, u64 little-endian
//! 16..24    XXH3-64 of the body, u64 little-endian
//! 24..28    head length H, u32 little-endian
//! 28..60    SHA-256 of bytes 8..28 followed by the head
//! 60..60+H  the head: one JSON object (key, the request fields named by Vary,
//!           status, response fields in order, stored and response times)
//! 60+H..    the body, exactly "body length" bytes, to the end of the file
//! ```
//!
//! A file whose magic, checksum, head or length does not agree is corrupt; so is
//! one whose body does not hash to its recorded XXH3 ([`verify_body`], which reads
//! the whole body: the caller decides when it is worth it). The head is read and
//! checked whenever the file is opened; the body only when verified. This module
//! reads and writes files; it keeps no index and decides nothing of HTTP caching
//! (see `store` and the module above).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

/// The first bytes of every entry; the digit is the format's version.
pub const MAGIC: &[u8; 8] = b"KTLSDC2\n";
/// Bytes before the head: magic, body length, body checksum, head length, head checksum.
pub const PREFIX: u64 = 60;
/// Bytes read at a time when a body is verified: large enough that the reads cost
/// little next to the hashing, small enough to sit in the L2 cache.
const VERIFY_CHUNK: usize = 256 * 1024;
/// The largest head read back: a larger one is corrupt (heads are response fields,
/// which the proxy bounds far below this).
pub const MAX_HEAD: u32 = 1 << 20;

/// The head of an entry, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    /// The primary key as text (`GET host target`), to tell hash collisions apart.
    pub key: String,
    /// The request fields the response's Vary names: lower-case name, value (absent fields left out).
    pub request: Vec<(String, String)>,
    pub status: u16,
    /// The response fields in the order received, hop-by-hop fields left out.
    pub fields: Vec<(String, String)>,
    /// When the entry was written, milliseconds since the epoch.
    pub stored_ms: u64,
    /// When the response (or the 304 that refreshed it) was received, milliseconds since the epoch.
    pub response_ms: u64,
}

/// Milliseconds since the epoch (0 before it).
pub fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The time `ms` milliseconds after the epoch.
pub fn time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Lower-case hexadecimal.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// Why a file is not a usable entry.
#[derive(Debug)]
pub enum Bad {
    /// The file could not be read (it may be gone): leave it.
    Io(io::Error),
    /// The file is not a whole entry: delete it.
    Corrupt(&'static str),
}

impl From<io::Error> for Bad {
    fn from(e: io::Error) -> Bad {
        match e.kind() {
            io::ErrorKind::UnexpectedEof => Bad::Corrupt("truncated"),
            _ => Bad::Io(e),
        }
    }
}

/// An entry's head read back, with where its body lies.
#[derive(Debug)]
pub struct Parsed {
    pub head: Head,
    pub body_offset: u64,
    pub body_len: u64,
    /// The XXH3-64 of the body, as recorded.
    pub body_sum: u64,
}

/// Reads and checks the head of the entry `file` (of `file_len` bytes).
pub fn read_head(file: &File, file_len: u64) -> Result<Parsed, Bad> {
    read_head_with(|buf, at| file.read_exact_at(buf, at), file_len)
}

/// Reads and checks the head of an entry of `file_len` bytes through `read_exact_at`
/// (fill the buffer from the offset, or fail: `UnexpectedEof` past the end).
pub fn read_head_with(read_exact_at: impl Fn(&mut [u8], u64) -> io::Result<()>, file_len: u64) -> Result<Parsed, Bad> {
    let mut prefix = [0u8; PREFIX as usize];
    read_exact_at(&mut prefix, 0)?;
    if &prefix[..8] != MAGIC {
        return Err(Bad::Corrupt("not a ktlsd cache entry of this version"));
    }
    let body_len = u64::from_le_bytes(prefix[8..16].try_into().map_err(|_| Bad::Corrupt("prefix"))?);
    let body_sum = u64::from_le_bytes(prefix[16..24].try_into().map_err(|_| Bad::Corrupt("prefix"))?);
    let head_len = u32::from_le_bytes(prefix[24..28].try_into().map_err(|_| Bad::Corrupt("prefix"))?);
    if head_len > MAX_HEAD {
        return Err(Bad::Corrupt("head too long"));
    }
    let body_offset = PREFIX + u64::from(head_len);
    if body_offset.checked_add(body_len) != Some(file_len) {
        return Err(Bad::Corrupt("length differs from the head's"));
    }
    let mut head = vec![0u8; head_len as usize];
    read_exact_at(&mut head, PREFIX)?;
    if checksum(&prefix[8..28], &head) != prefix[28..60] {
        return Err(Bad::Corrupt("head checksum"));
    }
    let head: Head = serde_json::from_slice(&head).map_err(|_| Bad::Corrupt("head is not the expected JSON"))?;
    Ok(Parsed { head, body_offset, body_len, body_sum })
}

/// Checks that `file` is still `file_len` bytes long (it may have been truncated
/// or grown under an open descriptor): one `fstat`, whose result is returned.
pub fn check_len(file: &File, file_len: u64) -> Result<std::fs::Metadata, Bad> {
    let fstat = file.metadata()?;
    match fstat.len() {
        n if n == file_len => Ok(fstat),
        n if n < file_len => Err(Bad::Corrupt("truncated")),
        _ => Err(Bad::Corrupt("longer than its head says")),
    }
}

/// Reads the body (`body_len` bytes at `body_offset`) and checks it against its
/// recorded XXH3 `sum`. Reads the whole body: about a millisecond per 4 MiB in
/// the page cache, a disk read otherwise.
pub fn verify_body(file: &File, body_offset: u64, body_len: u64, sum: u64) -> Result<(), Bad> {
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; VERIFY_CHUNK.min(usize::try_from(body_len).unwrap_or(VERIFY_CHUNK)).max(1)];
    let mut done = 0u64;
    while done < body_len {
        let want = buf.len().min(usize::try_from(body_len - done).unwrap_or(buf.len()));
        let n = match file.read_at(&mut buf[..want], body_offset + done) {
            Ok(0) => return Err(Bad::Corrupt("truncated")),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Bad::Io(e)),
        };
        hasher.update(&buf[..n]);
        done += n as u64;
    }
    match hasher.digest() == sum {
        true => Ok(()),
        false => Err(Bad::Corrupt("body checksum")),
    }
}

/// Reads the entry at `path`: the file, its length and its checked head.
pub fn open(path: &Path) -> Result<(File, u64, Parsed), Bad> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let read = read_head(&file, len)?;
    Ok((file, len, read))
}

/// SHA-256 of the two length fields (`lengths`, bytes 8..20) followed by the head.
pub fn checksum(lengths: &[u8], head: &[u8]) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(lengths);
    ctx.update(head);
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// A new entry being written to a temporary file beside the others. The file is
/// removed when the draft is dropped before [`Draft::publish`] renamed it into
/// place: every failure leaves no temporary file behind.
pub struct Draft {
    file: File,
    tmp: PathBuf,
    head: Vec<u8>,
    written: u64,
    hasher: Xxh3,
    /// The body's checksum when it was copied rather than written ([`rewrite`]).
    copied_sum: Option<u64>,
    published: bool,
}

impl Draft {
    /// Creates the temporary file `tmp` (owner-only) and writes `head` after a
    /// placeholder prefix; the body follows with [`Draft::write`].
    pub fn create(tmp: PathBuf, head: &Head) -> io::Result<Draft> {
        let head = serde_json::to_vec(head).map_err(io::Error::other)?;
        if head.len() > MAX_HEAD as usize {
            return Err(io::Error::other("response head too large to store"));
        }
        let file = OpenOptions::new().write(true).read(true).create_new(true).mode(0o600).open(&tmp)?;
        // From here on, dropping the draft removes the file.
        let mut draft = Draft { file, tmp, head, written: 0, hasher: Xxh3::new(), copied_sum: None, published: false };
        draft.file.write_all(&[0u8; PREFIX as usize])?;
        draft.file.write_all(&draft.head)?;
        Ok(draft)
    }

    /// Appends body bytes.
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)?;
        self.hasher.update(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Writes the real prefix (body length and checksum, head checksum) and
    /// flushes the file's data to the disk, so that the rename of
    /// [`Draft::publish`] can only publish a whole entry; the file's length.
    pub fn seal(&mut self) -> io::Result<u64> {
        let mut prefix = [0u8; PREFIX as usize];
        prefix[..8].copy_from_slice(MAGIC);
        prefix[8..16].copy_from_slice(&self.written.to_le_bytes());
        let sum = self.copied_sum.unwrap_or_else(|| self.hasher.digest());
        prefix[16..24].copy_from_slice(&sum.to_le_bytes());
        prefix[24..28].copy_from_slice(&(self.head.len() as u32).to_le_bytes());
        let head_sum = checksum(&prefix[8..28], &self.head);
        prefix[28..60].copy_from_slice(&head_sum);
        self.file.write_all_at(&prefix, 0)?;
        self.file.sync_data()?;
        Ok(PREFIX + self.head.len() as u64 + self.written)
    }

    /// Renames the sealed draft to `path`. On failure the temporary file is removed.
    pub fn publish(mut self, path: &Path) -> io::Result<()> {
        std::fs::rename(&self.tmp, path)?;
        self.published = true;
        Ok(())
    }

    /// The body's XXH3 as written so far.
    #[cfg(test)]
    pub fn sum(&self) -> u64 {
        self.copied_sum.unwrap_or_else(|| self.hasher.digest())
    }
}

impl Drop for Draft {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes to `tmp` a sealed copy of the entry `old` (body at `body_offset`,
/// `body_len` bytes, checksum `body_sum`) under the new `head`, for
/// [`Draft::publish`], with the new file's length. The body is copied by the
/// kernel (`copy_file_range` where the file system has it) and keeps its checksum.
pub fn rewrite(
    tmp: PathBuf,
    head: &Head,
    old: &File,
    body_offset: u64,
    body_len: u64,
    body_sum: u64,
) -> io::Result<(Draft, u64)> {
    let mut draft = Draft::create(tmp, head)?;
    let mut from = old.try_clone()?;
    from.seek(SeekFrom::Start(body_offset))?;
    let copied = io::copy(&mut from.take(body_len), &mut draft.file)?;
    if copied != body_len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the stored body is shorter than its head says"));
    }
    draft.written = copied;
    draft.copied_sum = Some(body_sum);
    let len = draft.seal()?;
    Ok((draft, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> Head {
        Head {
            key: "GET  /x".into(),
            request: Vec::new(),
            status: 200,
            fields: vec![("cache-control".into(), "max-age=60".into())],
            stored_ms: 1,
            response_ms: 1,
        }
    }

    /// An entry of `body` written, sealed and published at `dir/e`; its path.
    fn written(dir: &Path, body: &[u8]) -> PathBuf {
        let mut d = Draft::create(dir.join("tmp"), &head()).unwrap();
        for piece in body.chunks(7) {
            d.write(piece).unwrap();
        }
        assert_eq!(d.sum(), xxhash_rust::xxh3::xxh3_64(body), "hashed as written, piece by piece");
        d.seal().unwrap();
        d.publish(&dir.join("e")).unwrap();
        assert!(!dir.join("tmp").exists());
        dir.join("e")
    }

    fn verify(path: &Path) -> Result<(), Bad> {
        let (file, len, p) = open(path)?;
        check_len(&file, len)?;
        verify_body(&file, p.body_offset, p.body_len, p.body_sum)
    }

    fn corrupt(r: Result<(), Bad>) -> Option<&'static str> {
        match r {
            Err(Bad::Corrupt(why)) => Some(why),
            _ => None,
        }
    }

    #[test]
    fn the_body_checksum_is_recorded_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let body: Vec<u8> = (0..VERIFY_CHUNK * 2 + 99).map(|i| (i * 31 % 251) as u8).collect();
        for body in [&body[..], b"", b"x"] {
            let path = written(dir.path(), body);
            let (_, len, p) = open(&path).unwrap();
            assert_eq!((p.body_len, p.body_sum, len), (body.len() as u64, xxhash_rust::xxh3::xxh3_64(body), len));
            assert!(verify(&path).is_ok(), "a whole entry of {} bytes verifies", body.len());
        }
        // One flipped bit anywhere in the body (first byte, a chunk boundary, the last) is found.
        for at in [0, VERIFY_CHUNK as u64, body.len() as u64 - 1] {
            let path = written(dir.path(), &body);
            let (file, _, p) = open(&path).unwrap();
            let mut b = [0u8];
            file.read_exact_at(&mut b, p.body_offset + at).unwrap();
            OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&[b[0] ^ 1], p.body_offset + at).unwrap();
            assert_eq!(corrupt(verify(&path)), Some("body checksum"), "byte {at} flipped");
        }
        // The recorded checksum is covered by the head's: changing it is a corrupt head.
        let path = written(dir.path(), &body);
        OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&[0xff], 16).unwrap();
        assert_eq!(corrupt(verify(&path)), Some("head checksum"));
    }

    #[test]
    fn a_resized_file_is_found_by_its_open_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let path = written(dir.path(), &[7u8; 5000]);
        let (file, len, p) = open(&path).unwrap();
        assert!(check_len(&file, len).is_ok());
        let w = OpenOptions::new().write(true).open(&path).unwrap();
        w.set_len(len - 1000).unwrap();
        // The descriptor opened before the cut sees it; the body can no longer be read whole.
        assert_eq!(corrupt(check_len(&file, len).map(|_| ())), Some("truncated"));
        assert_eq!(corrupt(verify_body(&file, p.body_offset, p.body_len, p.body_sum)), Some("truncated"));
        assert_eq!(corrupt(read_head(&file, len - 1000).map(|_| ())), Some("length differs from the head's"));
        w.set_len(len + 1).unwrap();
        assert_eq!(corrupt(check_len(&file, len).map(|_| ())), Some("longer than its head says"));
    }

    #[test]
    fn a_draft_that_is_not_published_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("tmp");
        // Dropped while being written.
        let mut d = Draft::create(tmp.clone(), &head()).unwrap();
        d.write(b"part").unwrap();
        assert!(tmp.exists());
        drop(d);
        assert!(!tmp.exists(), "an abandoned draft is removed");
        // Sealed, but its rename fails (no such directory).
        let mut d = Draft::create(tmp.clone(), &head()).unwrap();
        d.seal().unwrap();
        assert!(d.publish(&dir.path().join("missing").join("e")).is_err());
        assert!(!tmp.exists(), "a draft whose rename failed is removed");
        // A copy of an entry that is shorter than its head says.
        let path = written(dir.path(), b"abcdef");
        let (file, _, p) = open(&path).unwrap();
        assert!(rewrite(tmp.clone(), &head(), &file, p.body_offset, p.body_len + 10, p.body_sum).is_err());
        assert!(!tmp.exists(), "a failed rewrite is removed");
        // A rewrite keeps the body's checksum.
        let (d, len) = rewrite(tmp.clone(), &head(), &file, p.body_offset, p.body_len, p.body_sum).unwrap();
        d.publish(&dir.path().join("f")).unwrap();
        assert!(verify(&dir.path().join("f")).is_ok());
        assert_eq!(std::fs::metadata(dir.path().join("f")).unwrap().len(), len);
    }
}
