//! Files out of the page cache, over real sockets to the real binary: a file
//! synced and dropped from the cache (`POSIX_FADV_DONTNEED`) takes the cold path
//! (each window read ahead off the event loop, then sent from warm pages) and
//! still arrives whole, over HTTP/1.1, HTTP/2 and a range across windows; the
//! server counts its cold windows, and a file already in the cache counts none.
//!
//! On a host without kTLS this runs the userspace record layer; where the
//! filesystem under the temporary directory cannot drop pages (tmpfs), the
//! tests say so and pass without checking anything.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const WINDOW: usize = 1 << 20;

/// Pseudo-random bytes, so a misplaced window shows.
fn data(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Syncs `path` and drops it from the page cache; false when the filesystem
/// keeps it cached (then the cold path cannot be reached from here).
fn evict(path: &Path) -> bool {
    let f = File::open(path).expect("open the served file");
    f.sync_all().expect("fsync");
    // SAFETY: advice on a live descriptor; no memory passed.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    let mut b = [0u8; 1];
    let iov = libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: `iov` describes `b`, borrowed for the call.
    let n = unsafe { libc::preadv2(f.as_raw_fd(), &iov, 1, 0, libc::RWF_NOWAIT) };
    let cold = n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN);
    if !cold {
        eprintln!("skipped: {} keeps files cached after DONTNEED", path.display());
    }
    cold
}

#[test]
fn cold_file_arrives_whole_and_its_windows_are_counted() {
    let body = data(3 * WINDOW + 777);
    let srv = Server::builder(BIN).file("big.bin", &body).start();
    let path = srv.root().join("big.bin");

    if !evict(&path) {
        return;
    }
    let r = fetch(&srv.url("/big.bin"), &["--http1.1"]);
    assert_eq!(r.status, 200);
    assert!(r.body == body, "HTTP/1.1 body differs from the file ({} bytes of {})", r.body.len(), body.len());

    assert!(evict(&path));
    let r = fetch(&srv.url("/big.bin"), &["--http2"]);
    assert_eq!(r.status, 200);
    assert!(r.body == body, "HTTP/2 body differs from the file ({} bytes of {})", r.body.len(), body.len());

    assert!(evict(&path));
    let (from, to) = (WINDOW - 1000, 2 * WINDOW + 1000);
    let r = fetch(&srv.url("/big.bin"), &["--http1.1", "-r", &format!("{from}-{to}")]);
    assert_eq!(r.status, 206);
    assert!(r.body == body[from..=to], "range body differs ({} bytes)", r.body.len());

    let st = srv.stop();
    st.assert_clean_exit();
    // At least one cold window per fetch (kernel readahead may warm some windows early).
    let cold = st.stat("cold_windows");
    assert!(cold >= 3, "cold_windows={cold}; stderr:\n{}", st.stderr);
    assert!(cold <= 4 + 4 + 2, "cold_windows={cold}: more than one per window");
}

#[test]
fn cached_file_takes_no_cold_window() {
    let body = data(WINDOW + 4096);
    let srv = Server::builder(BIN).file("hot.bin", &body).start();
    let mut warm = Vec::new();
    File::open(srv.root().join("hot.bin")).and_then(|mut f| f.read_to_end(&mut warm)).expect("read the file");
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/hot.bin"), &[proto]);
        assert!(r.body == body, "{proto} body differs");
    }
    let st = srv.stop();
    st.assert_clean_exit();
    assert_eq!(st.stat("cold_windows"), 0, "{}", st.stderr);
    assert_eq!(st.stat("readahead_waits"), 0, "{}", st.stderr);
}
