//! One entry file: its layout, how its head is encoded and checked, and how a
//! new entry is written (temporary file, then rename) or an old one rewritten
//! with a refreshed head.
//!
//! ```text
//! 0..8      magic and version: "KTLSDC1\n"
//! 8..16     body length, u64 little-endian
//! 16..20    head length H, u32 little-endian
//! 20..52    SHA-256 of bytes 8..20 followed by the head
//! 52..52+H  the head: one JSON object (key, the request fields named by Vary,
//!           status, response fields in order, stored and response times)
//! 52+H..    the body, exactly "body length" bytes, to the end of the file
//! ```
//!
//! A file whose magic, checksum, head or length does not agree is corrupt. This
//! module reads and writes files; it keeps no index and decides nothing of HTTP
//! caching (see `store` and the module above).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The first bytes of every entry; the digit is the format's version.
pub const MAGIC: &[u8; 8] = b"KTLSDC1\n";
/// Bytes before the head: magic, body length, head length, checksum.
pub const PREFIX: u64 = 52;
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
    let head_len = u32::from_le_bytes(prefix[16..20].try_into().map_err(|_| Bad::Corrupt("prefix"))?);
    if head_len > MAX_HEAD {
        return Err(Bad::Corrupt("head too long"));
    }
    let body_offset = PREFIX + u64::from(head_len);
    if body_offset.checked_add(body_len) != Some(file_len) {
        return Err(Bad::Corrupt("length differs from the head's"));
    }
    let mut head = vec![0u8; head_len as usize];
    read_exact_at(&mut head, PREFIX)?;
    if checksum(&prefix[8..20], &head) != prefix[20..52] {
        return Err(Bad::Corrupt("head checksum"));
    }
    let head: Head = serde_json::from_slice(&head).map_err(|_| Bad::Corrupt("head is not the expected JSON"))?;
    Ok(Parsed { head, body_offset, body_len })
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

/// A new entry being written to a temporary file beside the others.
pub struct Draft {
    file: File,
    head: Vec<u8>,
    written: u64,
}

impl Draft {
    /// Creates the temporary file `tmp` (owner-only) and writes `head` after a
    /// placeholder prefix; the body follows with [`Draft::write`].
    pub fn create(tmp: &Path, head: &Head) -> io::Result<Draft> {
        let head = serde_json::to_vec(head).map_err(io::Error::other)?;
        if head.len() > MAX_HEAD as usize {
            return Err(io::Error::other("response head too large to store"));
        }
        let mut file = OpenOptions::new().write(true).read(true).create_new(true).mode(0o600).open(tmp)?;
        file.write_all(&[0u8; PREFIX as usize])?;
        file.write_all(&head)?;
        Ok(Draft { file, head, written: 0 })
    }

    /// Appends body bytes.
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Writes the real prefix (body length, checksum) and flushes the file's data
    /// to the disk, so that the rename that follows can only publish a whole entry.
    pub fn finish(self) -> io::Result<u64> {
        let mut prefix = [0u8; PREFIX as usize];
        prefix[..8].copy_from_slice(MAGIC);
        prefix[8..16].copy_from_slice(&self.written.to_le_bytes());
        prefix[16..20].copy_from_slice(&(self.head.len() as u32).to_le_bytes());
        let sum = checksum(&prefix[8..20], &self.head);
        prefix[20..52].copy_from_slice(&sum);
        self.file.write_all_at(&prefix, 0)?;
        self.file.sync_data()?;
        Ok(PREFIX + self.head.len() as u64 + self.written)
    }
}

/// Writes to `tmp` a copy of the entry `old` (body at `body_offset`, `body_len`
/// bytes) under the new `head`; returns the new file's length. The body is copied
/// by the kernel (`copy_file_range` where the file system has it).
pub fn rewrite(tmp: &Path, head: &Head, old: &File, body_offset: u64, body_len: u64) -> io::Result<u64> {
    let mut draft = Draft::create(tmp, head)?;
    let mut from = old.try_clone()?;
    from.seek(SeekFrom::Start(body_offset))?;
    let copied = io::copy(&mut from.take(body_len), &mut draft.file)?;
    if copied != body_len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the stored body is shorter than its head says"));
    }
    draft.written = copied;
    draft.finish()
}
