//! Test data and its checks: deterministic pseudo-random bodies, large files,
//! SHA-256 digests, and body comparisons that never dump megabytes into a panic.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Compares bodies by length and SHA-256 (never dumps megabytes into a panic).
#[track_caller]
pub fn assert_body(what: &str, got: &[u8], want: &[u8]) {
    if got != want {
        let first_diff = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: body differs: got {} bytes sha256 {}, want {} bytes sha256 {} (first difference at {:?})",
            got.len(),
            sha256(got),
            want.len(),
            sha256(want),
            first_diff
        );
    }
}

/// SHA-256 of a file: `sha256sum` when it is installed (fast even for 100 MiB),
/// otherwise in-process.
pub fn sha256_file(path: &Path) -> String {
    if let Ok(out) = Command::new("sha256sum").arg(path).stderr(Stdio::null()).output() {
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            let digest = text.split_whitespace().next().unwrap_or("").to_string();
            if digest.len() == 64 {
                return digest;
            }
        }
    }
    sha256_file_in_process(path)
}

pub fn sha256_file_in_process(path: &Path) -> String {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex(&h.finalize())
}

/// Deterministic pseudo-random bytes (xorshift64*), different for each `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes a large file quickly: 1 MiB pseudo-random blocks, each stamped with its
/// index so that no two blocks are alike. Returns the file's SHA-256.
pub fn write_big_file(path: &Path, len: u64) -> String {
    let block = pattern(1 << 20, 0xB16);
    let mut f = std::fs::File::create(path).expect("create big file");
    let mut chunk = block.clone();
    let mut written = 0u64;
    let mut i = 0u64;
    while written < len {
        chunk[..8].copy_from_slice(&i.to_le_bytes());
        chunk[block.len() - 8..].copy_from_slice(&(!i).to_le_bytes());
        let n = (len - written).min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).expect("write big file");
        written += n as u64;
        i += 1;
    }
    sha256_file(path)
}
