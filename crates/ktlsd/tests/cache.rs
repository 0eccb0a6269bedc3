//! The response cache with the real binary: `[cache]` starts (its directory
//! created owner-only, relative to the config file), an entry written in the
//! documented on-disk layout is indexed at start, counted in `/metrics` and
//! removed by `POST /cache/purge` on the admin listener (200, then 404; 400 and
//! 405 for malformed purges), corrupt entries and left-over temporary files are
//! deleted at start, a reload keeps the cache, and a bad `[cache]` stops start-up
//! with one line (as `ktlsd check` does for a directory start-up could not open).

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// `method target` on the admin Unix socket: the status and the body.
fn admin(sock: &Path, method: &str, target: &str) -> (u16, String) {
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{method} {target} HTTP/1.1\r\nHost: admin\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no response head in {reply:?}"));
    (parse_head(head).1, body.to_string())
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// Writes an entry for `GET {host} {target}` as docs/cache.md lays it out; returns its path.
fn plant(dir: &Path, host: &str, target: &str, body: &[u8]) -> PathBuf {
    let key = format!("GET {host} {target}");
    let name = sha256(key.as_bytes());
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let head = serde_json::json!({
        "key": key, "request": [], "status": 200,
        "fields": [["cache-control", "max-age=600"], ["content-type", "text/plain"]],
        "stored_ms": now, "response_ms": now,
    })
    .to_string()
    .into_bytes();
    let mut lengths = (body.len() as u64).to_le_bytes().to_vec();
    lengths.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(body).to_le_bytes());
    lengths.extend_from_slice(&(head.len() as u32).to_le_bytes());
    let sum = unhex(&sha256(&[lengths.as_slice(), head.as_slice()].concat()));
    let file = [b"KTLSDC2\n".as_slice(), &lengths, &sum, &head, body].concat();
    let shard = dir.join(&name[..2]).join(&name[2..4]);
    std::fs::create_dir_all(&shard).unwrap();
    let path = shard.join(format!("{name}.0"));
    std::fs::write(&path, file).unwrap();
    path
}

/// Waits (at most 10 s) until `/metrics` has `name` at `value`.
fn metric_reaches(sock: &Path, name: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = scrape(sock);
        if m.get(name) == Some(&value) {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never reached {value}: {:?}", m.get(name));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn cache_starts_indexes_its_directory_and_purges_on_the_admin_listener() {
    let b = Server::builder(BIN).file("a.txt", "a").no_access_log();
    let (dir, sock) = (b.dir().join("cache"), b.dir().join("admin.sock"));
    // Planted before start: two entries in the documented layout, a corrupt one, a left-over partial write.
    let kept = plant(&dir, "", "/x?y=1", b"cached body");
    let other = plant(&dir, "", "/other", b"other");
    let corrupt = plant(&dir, "", "/corrupt", b"0123456789");
    let f = std::fs::OpenOptions::new().write(true).open(&corrupt).unwrap();
    f.set_len(f.metadata().unwrap().len() - 1).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    std::fs::write(dir.join("tmp").join("1-0"), b"partial").unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();

    let s = b.config("[cache]\ndir = \"cache\"\nmax_size = \"16M\"\n").arg("--admin").arg(&sock).start();
    assert!(s.wait_stderr("index rebuilt, 2 entries", Duration::from_secs(10)).is_some(), "{}", s.stderr());
    assert!(!corrupt.exists(), "a truncated entry is deleted at start");
    assert!(!dir.join("tmp").join("1-0").exists(), "partial writes are removed at start");
    metric_reaches(&sock, "ktlsd_cache_entries", 2.0);
    let m = scrape(&sock);
    assert_eq!(m.get("ktlsd_cache_hits_total"), Some(&0.0));
    assert!(m["ktlsd_cache_bytes"] > 16.0, "{m:?}");

    for (method, target, status, needle) in [
        ("GET", "/cache/purge?url=/x", 405, "POST"),
        ("POST", "/cache/purge", 400, "url=/path"),
        ("POST", "/cache/purge?url=x", 400, "url=/path"),
        ("POST", "/cache/purge?url=/x", 404, "nothing stored for /x"),
        ("POST", "/cache/purge?url=%2Fx%3Fy%3D1", 200, "1 stored variant(s) removed"),
        ("POST", "/cache/purge?url=%2Fx%3Fy%3D1", 404, "nothing stored"),
    ] {
        let (got, body) = admin(&sock, method, target);
        assert_eq!(got, status, "{method} {target}: {body}");
        assert!(body.contains(needle), "{method} {target}: {body}");
    }
    assert!(!kept.exists(), "purge deletes the entry's file");
    assert!(other.exists(), "other keys stay");
    metric_reaches(&sock, "ktlsd_cache_entries", 1.0);
    // The static site is served as before.
    assert_eq!(fetch(&s.url("/a.txt"), &[]).body, b"a");
    // A reload with the same [cache] keeps the open cache and its index.
    s.signal(libc::SIGHUP);
    assert!(s.wait_stderr("reloaded configuration", Duration::from_secs(20)).is_some(), "{}", s.stderr());
    assert_eq!(s.stderr().matches("response cache in").count(), 1, "{}", s.stderr());
    metric_reaches(&sock, "ktlsd_cache_entries", 1.0);
    let (got, body) = admin(&sock, "POST", "/cache/purge?url=/other");
    assert_eq!(got, 200, "{body}");
    assert!(!other.exists());
}

#[test]
fn a_new_cache_directory_is_created_owner_only() {
    let b = Server::builder(BIN).no_access_log();
    let dir = b.dir().join("var").join("cache");
    let sock = b.dir().join("admin.sock");
    let s = b.config(&format!("[cache]\ndir = {:?}\n", dir.display().to_string())).arg("--admin").arg(&sock).start();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", dir.display());
    assert!(dir.join("tmp").is_dir());
    let (status, body) = admin(&sock, "POST", "/cache/purge?url=/nothing");
    assert_eq!((status, body.contains("nothing stored")), (404, true), "{body}");
    drop(s);
}

#[test]
fn without_a_cache_purge_says_so() {
    let b = Server::builder(BIN).no_access_log();
    let sock = b.dir().join("admin.sock");
    let _s = b.arg("--admin").arg(&sock).start();
    let (status, body) = admin(&sock, "POST", "/cache/purge?url=/x");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no [cache]"), "{body}");
    assert!(!scrape(&sock).contains_key("ktlsd_cache_entries"));
}

/// `ktlsd check` with the builder's arguments and configuration.
fn check(b: &ServerBuilder) -> Exited {
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg("check").args(&b.argv()[1..]).current_dir(b.dir()).env_remove("KTLSD_LOG");
    Exited::from(run_with_timeout(&mut cmd, None, Duration::from_secs(30)))
}

/// `ktlsd check` fails with one line for a cache directory `serve` could not open:
/// a file, a path through a file, a parent the serving user cannot write in; and
/// passes (creating nothing) for one it can create.
#[test]
fn check_refuses_a_cache_directory_serve_could_not_open() {
    let table = |dir: &str| format!("[cache]\ndir = {dir:?}\n");
    for (dir, needles) in [
        ("file", &["[cache] dir", "file is not a directory (name a directory)"][..]),
        ("file/cache", &["[cache] dir", "file/cache cannot be created:", "file is not a directory"]),
    ] {
        let b = Server::builder(BIN).no_access_log();
        std::fs::write(b.dir().join("file"), b"").unwrap();
        let b = b.config(&table(dir));
        check(&b).assert_startup_error(needles);
        b.run_to_exit().assert_startup_error(&["cache"]);
    }
    let b = Server::builder(BIN).no_access_log().config(&table("var/cache"));
    let ok = check(&b);
    assert_eq!((ok.status.code(), ok.stdout.as_str()), (Some(0), "configuration OK\n"), "{}", ok.stderr);
    assert!(!b.dir().join("var").exists(), "check created the directory");
    if !running_as_root() {
        eprintln!("skipped: the --user cases need root");
        return;
    }
    // Served as nobody: a parent only root may write in, or a directory nobody cannot write.
    for (dir, needle) in
        [("cache", "cache cannot be created by user \"nobody\""), ("mine", "mine is not writable by user \"nobody\"")]
    {
        let b = Server::builder(BIN).no_access_log().args(["--user", "nobody"]);
        std::fs::create_dir(b.dir().join("mine")).unwrap();
        for d in [b.dir().to_path_buf(), b.dir().join("mine")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let b = b.config(&table(dir));
        check(&b).assert_startup_error(&["[cache] dir", needle, "mode 0755", "make it writable by the serving user"]);
    }
}

#[test]
fn a_bad_cache_section_stops_start_up() {
    for (toml, needles) in [
        ("[cache]\nmax_size = \"1G\"\n", &["[cache] needs dir"][..]),
        ("[cache]\ndir = \"c\"\nmax_size = \"lots\"\n", &["max_size \"lots\"", "512M"]),
        (
            "[cache]\ndir = \"c\"\nmax_size = \"10M\"\nmax_object_size = \"20M\"\n",
            &["max_object_size", "at most max_size / 8"],
        ),
        (
            "[cache]\ndir = \"c\"\nmax_size = \"8M\"\nmax_object_size = \"2M\"\n",
            &["max_object_size 2097152", "at most max_size / 8 (1048576)", "raise max_size"],
        ),
        ("[cache]\ndir = \"c\"\nsize = 1\n", &["unknown field", "size"]),
    ] {
        Server::builder(BIN).config(toml).run_to_exit().assert_startup_error(needles);
    }
    // A file where the directory should be.
    let b = Server::builder(BIN);
    std::fs::write(b.dir().join("blocked"), b"").unwrap();
    b.config("[cache]\ndir = \"blocked/cache\"\n")
        .run_to_exit()
        .assert_startup_error(&["cannot create the cache directory"]);
}
