//! The response cache under faults, end to end: the real binary in front of the
//! Python origin (`tests/proxy/origin.py`), curl as the client over HTTP/1.1 and
//! HTTP/2, the cache's files changed under the running server. An entry file
//! truncated under the descriptor a worker holds is never served short: the
//! request is refetched whole, and the log says why. A flipped body byte is found
//! on the first hit after a restart, and on a hit without one with
//! `verify_sample = 1`. A cache directory on a 2 MiB tmpfs that misses do not fit
//! in leaves no temporary file, warns at most once a second, keeps storing what
//! fits (the full disk evicts), and its access log, on the same full disk, holds
//! only whole lines.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const PROTOCOLS: [&str; 2] = ["--http1.1", "--http2"];

/// ktlsd (one worker) caching `/api/**` from `origin` in `cache`, with `extra`
/// lines in `[cache]` and `args` on the command line.
fn server(origin: &Origin, cache: &Path, extra: &str, args: &[&str]) -> Server {
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\ncache = true\n\n[cache]\ndir = {:?}\nmax_size = \"256M\"\n{extra}",
        origin.url(),
        cache.display().to_string()
    );
    Server::builder(BIN).workers(Some(1)).config(&config).args(args).start()
}

/// The origin target `/api/set/NAME` stored for a minute, its body padded to `n` bytes.
fn target(name: &str, n: usize) -> String {
    format!("/api/set/{name}?h=Cache-Control%3Amax-age%3D600&n={n}")
}

/// What the origin answers to a target of `n` bytes on its `count`th request for it.
fn origin_body(count: usize, n: usize) -> Vec<u8> {
    let mut b = format!("a {count} -").into_bytes();
    b.resize(n, b'.');
    b
}

fn status(r: &Response) -> &str {
    r.header("cache-status").unwrap_or("(none)")
}

/// The entry files under `cache` (not those of `tmp/`).
fn entries(cache: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![cache.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            match e.file_type().unwrap().is_dir() {
                true if e.file_name() != "tmp" => dirs.push(e.path()),
                true => {}
                false => out.push(e.path()),
            }
        }
    }
    out
}

/// Flips one bit of the byte `back` bytes before the end of `path` (in the body).
fn flip_from_end(path: &Path, back: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let at = f.metadata().unwrap().len() - back;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x01], at).unwrap();
}

#[test]
fn a_truncated_entry_is_refetched_whole_and_logged() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let srv = server(&origin, &cache, "", &[]);
    let n = 2 << 20;
    let t = target("cut", n);
    let first = fetch(&srv.url(&t), &["--http1.1"]);
    assert_eq!((first.status, first.body.len()), (200, n));
    let hit = fetch(&srv.url(&t), &["--http1.1"]);
    assert_eq!((status(&hit), hit.body == first.body), ("ktlsd; hit", true), "stored, and now held open");
    let [entry] = &entries(&cache)[..] else { panic!("one entry file: {:?}", entries(&cache)) };
    std::fs::OpenOptions::new().write(true).open(entry).unwrap().set_len(1_572_643).unwrap();

    // Six clients: each gets the whole body, the first refetched, the others from the new entry.
    for i in 0..6 {
        let proto = PROTOCOLS[i % 2];
        let r = fetch(&srv.url(&t), &[proto]);
        assert_eq!((r.status, r.body.len()), (200, n), "client {i} ({proto}): {}", status(&r));
        assert!(r.body == origin_body(2, n), "client {i} ({proto}) got the refetched body");
        let want = if i == 0 { "ktlsd; fwd=miss" } else { "ktlsd; hit" };
        assert!(status(&r).starts_with(want), "client {i} ({proto}): {}", status(&r));
    }
    assert_eq!(origin.count(&t), 2, "one refetch");
    let log = srv.stderr();
    assert!(log.contains("is corrupt (truncated): deleted"), "the cut is logged:\n{log}");
}

#[test]
fn a_flipped_body_byte_is_found_after_a_restart_and_on_sampled_hits() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let n = 100_000;
    let t = target("flip", n);
    {
        // No sampling: the entry this process wrote is served as it is until a restart.
        let srv = server(&origin, &cache, "verify_sample = 0\n", &[]);
        assert_eq!(fetch(&srv.url(&t), &["--http2"]).body, origin_body(1, n));
        assert_eq!(status(&fetch(&srv.url(&t), &["--http2"])), "ktlsd; hit");
    }
    let [entry] = &entries(&cache)[..] else { panic!("one entry file: {:?}", entries(&cache)) };
    flip_from_end(entry, 10);
    let srv = server(&origin, &cache, "verify_sample = 0\n", &[]);
    for proto in PROTOCOLS {
        let r = fetch(&srv.url(&t), &[proto]);
        assert!(r.body == origin_body(2, n), "the changed entry is not served ({proto}): {}", status(&r));
    }
    assert_eq!(origin.count(&t), 2, "refetched once, then a hit");
    assert!(srv.stderr().contains("is corrupt (body checksum): deleted"), "{}", srv.stderr());
    drop(srv);

    // Every hit sampled: a change under the running server is found on the next hit.
    let srv = server(&origin, &cache, "verify_sample = 1\n", &[]);
    let t = target("flip-sampled", n);
    for _ in 0..3 {
        assert_eq!(fetch(&srv.url(&t), &["--http1.1"]).body, origin_body(1, n));
    }
    let mine: Vec<PathBuf> = entries(&cache).into_iter().filter(|p| p != entry).collect();
    let [entry] = &mine[..] else { panic!("one new entry file: {mine:?}") };
    flip_from_end(entry, 1);
    for proto in PROTOCOLS {
        let r = fetch(&srv.url(&t), &[proto]);
        assert!(r.body == origin_body(2, n), "not served changed ({proto}): {}", status(&r));
    }
    assert_eq!(origin.count(&t), 2);
    assert!(srv.stderr().contains("is corrupt (body checksum): deleted"), "{}", srv.stderr());
}

/// A tmpfs of `size` mounted on a new directory; unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (with the reason on stderr) where a tmpfs cannot be mounted (not root).
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs { dir }),
            Ok(o) => {
                eprintln!("skipped: cannot mount a tmpfs: {}", String::from_utf8_lossy(&o.stderr));
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount: {e}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// What [`fill_a_small_disk`] saw: what each miss got (size, Cache-Status, whole
/// and right), the server stopped, the tmpfs (still mounted for the checks) and
/// how long the misses took.
type Filled = (Vec<(usize, String, bool)>, Stopped, Tmpfs, Duration);

/// Through a server whose cache and access log are on a 2 MiB tmpfs: four
/// entries of 300 KiB stored, the rest of the disk then filled by another file,
/// then misses of `sizes` (one target each).
fn fill_a_small_disk(sizes: &[usize]) -> Option<Filled> {
    let fs = Tmpfs::mount("2m")?;
    let origin = Origin::start("a");
    let cache = fs.path().join("cache");
    let log = fs.path().join("access.log");
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\ncache = true\n\n[cache]\ndir = {:?}\nmax_size = \"256M\"\n",
        origin.url(),
        cache.display().to_string()
    );
    let srv =
        Server::builder(BIN).workers(Some(1)).no_access_log().config(&config).arg("--access-log").arg(&log).start();
    for i in 0..4 {
        let t = target(&format!("kept{i}"), 300 << 10);
        for want in ["ktlsd; fwd=miss", "ktlsd; hit"] {
            let r = fetch(&srv.url(&t), &[PROTOCOLS[i % 2]]);
            assert!(status(&r).starts_with(want), "kept{i}: {}", status(&r));
        }
    }
    // Something else takes the rest of the disk.
    {
        use std::io::Write;
        let mut filler = std::fs::File::create(fs.path().join("filler")).unwrap();
        while filler.write_all(&[0u8; 4096]).is_ok() {}
    }
    let started = Instant::now();
    let mut got = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let name = format!("fill{i}");
        let r = fetch(&srv.url(&target(&name, n)), &[PROTOCOLS[i % 2]]);
        assert_eq!(r.status, 200, "miss {i}");
        got.push((n, status(&r).to_string(), r.body == origin_body(1, n)));
    }
    // The full disk evicts (on its own thread) at least what the failed fill needed, so
    // what fits is stored again: by the third request, a hit.
    std::thread::sleep(Duration::from_millis(500));
    let fits = target("fits", 200 << 10);
    for _ in 0..3 {
        got.push((0, status(&fetch(&srv.url(&fits), &["--http1.1"])).to_string(), true));
    }
    let took = started.elapsed();
    let stopped = srv.stop();
    Some((got, stopped, fs, took))
}

/// Alternately 3 MiB (never fits) and 100 KiB (fits once entries are evicted).
fn sizes() -> Vec<usize> {
    (0..24).map(|i| if i % 2 == 0 { 3 << 20 } else { 100 << 10 }).collect()
}

#[test]
fn a_full_disk_leaves_no_temporary_file_warns_rarely_evicts_and_tears_no_log_line() {
    let Some((got, stopped, fs, took)) = fill_a_small_disk(&sizes()) else { return };
    for (i, (n, status, whole)) in got.iter().enumerate() {
        assert!(whole, "response {i} ({n} bytes, {status}) is whole and right");
    }
    assert_eq!(got.last().map(|g| g.1.as_str()), Some("ktlsd; hit"), "what fits is stored: {got:?}");
    let tmp: Vec<_> = std::fs::read_dir(fs.path().join("cache").join("tmp")).unwrap().flatten().collect();
    assert!(tmp.is_empty(), "temporary files left behind: {tmp:?}");
    let warnings: Vec<&str> = stopped.stderr.lines().filter(|l| l.contains("WARN")).collect();
    let bound = took.as_secs() as usize + 2;
    assert!(
        warnings.len() <= bound && warnings.len() < sizes().len() / 2,
        "{} warnings in {took:?} for {} fills that did not fit:\n{}",
        warnings.len(),
        sizes().len() / 2,
        warnings.join("\n")
    );
    assert!(stopped.stderr.contains("No space left on device"), "the full disk is logged:\n{}", stopped.stderr);
    let text = std::fs::read(fs.path().join("access.log")).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    eprintln!(
        "{} warnings in {took:?}, {} access log lines:\n{}",
        warnings.len(),
        text.lines().count(),
        warnings.join("\n")
    );
    assert!(text.is_empty() || text.ends_with('\n'), "the access log ends with a whole line");
    for line in text.lines() {
        let whole =
            line.starts_with("127.0.0.1 - - [") && line.contains("\"GET /api/set/") && line.ends_with(" tls=userspace");
        assert!(whole, "a torn access log line: {line:?}\nin:\n{text}");
    }
}

#[test]
fn an_abandoned_fill_never_says_stored() {
    let Some((got, _, _, _)) = fill_a_small_disk(&sizes()) else { return };
    for (i, (n, status, _)) in got.iter().enumerate() {
        if *n == 3 << 20 {
            assert!(!status.contains("stored"), "response {i} of {n} bytes, never stored, says {status}");
        }
    }
}

#[test]
fn an_access_log_on_a_full_disk_has_only_whole_lines() {
    // One free page for the log: a batch of lines is taken only in part, then none.
    let Some(fs) = Tmpfs::mount("64k") else { return };
    std::fs::write(fs.path().join("filler"), vec![0u8; 60 << 10]).unwrap();
    let log = fs.path().join("access.log");
    let srv = Server::builder(BIN)
        .workers(Some(1))
        .file("index.txt", "static file")
        .no_access_log()
        .arg("--access-log")
        .arg(&log)
        .start();
    let started = Instant::now();
    for i in 0..100 {
        let r = fetch(&srv.url(&format!("/index.txt?request={i}")), &[PROTOCOLS[i % 2]]);
        assert_eq!(r.status, 200);
    }
    let stopped = srv.stop();
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
    assert!(text.len() < 100 * 100, "the disk was full: {} bytes of log", text.len());
    assert!(text.ends_with('\n'), "the log ends with a whole line: {:?}", &text[text.len().saturating_sub(200)..]);
    for line in text.lines() {
        let whole = line.starts_with("127.0.0.1 - - [") && line.ends_with(" tls=userspace");
        assert!(whole, "a torn access log line: {line:?}");
    }
    let warned = stopped.stderr.lines().filter(|l| l.contains("access log write failed")).collect::<Vec<_>>();
    let bound = took.as_secs() as usize + 2;
    assert!(
        !warned.is_empty() && warned.len() <= bound,
        "dropped lines are logged, once a second:\n{}",
        stopped.stderr
    );
    assert!(warned[0].contains("dropped whole"), "{}", warned[0]);
}

/// The entry files under `cache` that process `pid` holds open: (still there, deleted).
fn held_files(pid: i32, cache: &Path) -> (usize, Vec<String>) {
    let cache = cache.to_string_lossy().into_owned();
    let (mut live, mut deleted) = (0, Vec::new());
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else { continue };
        let target = target.to_string_lossy().into_owned();
        // Entry files, not the temporary files of fills (under the cache's tmp/).
        let Some(rest) = target.strip_prefix(&cache) else { continue };
        if rest.starts_with("/tmp/") {
            continue;
        }
        match target.strip_suffix(" (deleted)") {
            Some(name) => deleted.push(name.to_string()),
            None => live += 1,
        }
    }
    (live, deleted)
}

/// Entries held open by both workers, then evicted by `max_size`, are closed by each
/// worker at its next lookup, so their deleted files give the disk space back (on a
/// small cache disk the next entries need it: otherwise ENOSPC, then the full disk's
/// evictions empty the cache).
#[test]
fn evicted_entries_held_by_every_worker_give_their_disk_space_back() {
    let origin = Origin::start("a");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let config = format!(
        "[[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\ncache = true\n\n[cache]\ndir = {:?}\nmax_size = \"2M\"\nmax_object_size = \"256K\"\n",
        origin.url(),
        cache.display().to_string()
    );
    let srv = Server::builder(BIN).workers(Some(2)).config(&config).start();
    let n = 200 << 10;
    // Each entry stored, then hit on a dozen new connections: both workers hold its file.
    for i in 0..8 {
        let t = target(&format!("held{i}"), n);
        for _ in 0..12 {
            let r = fetch(&srv.url(&t), &[PROTOCOLS[i % 2]]);
            assert_eq!((r.status, r.body.len()), (200, n), "held{i}: {}", status(&r));
        }
    }
    let (live, deleted) = held_files(srv.pid(), &cache);
    assert!(live > 8 && deleted.is_empty(), "both workers hold entries: {live} held, deleted {deleted:?}");
    // 30 more entries of 200 KiB: max_size (2 MiB) evicts the first ones.
    for i in 0..30 {
        let r = fetch(&srv.url(&target(&format!("next{i}"), n)), &[PROTOCOLS[i % 2]]);
        assert_eq!(r.status, 200, "next{i}");
    }
    std::thread::sleep(Duration::from_millis(500));
    // Every worker looks up once more.
    for i in 0..12 {
        assert_eq!(fetch(&srv.url(&target("next29", n)), &[PROTOCOLS[i % 2]]).status, 200);
    }
    let (_, deleted) = held_files(srv.pid(), &cache);
    assert!(deleted.is_empty(), "evicted entry files still held open: {deleted:?}");
}
