//! The response cache shared by a fleet (`[cluster] cache_peers`): three real
//! members on a real 3-member etcd cluster, in front of the testkit's counting origin.
//!
//! 100 distinct cacheable objects fetched round-robin through the three members
//! reach the origin 100 times (not 300), with the right bytes, and again through
//! other members not at all; each key's owner is the one rendezvous hashing names
//! (computed here independently). A member killed: right away its keys are fetched
//! from the origin directly (the owner unreachable, a failure counted); once its
//! lease has expired, the others own them, and the origin is asked again only for
//! the dead member's keys. A request to `peer_listen` without, or with a forged,
//! authentication gets 403 and a log line; etcd stopped, members keep serving and
//! sharing with the set they last saw.

use std::net::SocketAddr;

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use testkit::etcd::Etcd;
use testkit::origin::free_port;
use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

const OBJECTS: usize = 100;

struct Member {
    name: &'static str,
    srv: Server,
    admin: SocketAddr,
    peer: SocketAddr,
}

/// A member caching `/api/**` from `origin`, sharing its cache with the fleet on `etcd`.
fn member(name: &'static str, etcd: &Etcd, secret: &std::path::Path, origin: &Origin) -> Member {
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let peer: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let srv = Server::builder(BIN)
        .config(&format!(
            "admin = \"{admin}\"\n\
             [[proxy]]\npath = \"/api/**\"\nupstream = [{:?}]\ncache = true\n\n\
             [cache]\ndir = \"cache\"\nmax_size = \"64M\"\n\n\
             [cluster]\netcd = {}\nname = \"{name}\"\nsecret_file = \"{}\"\nprefix = \"/peers\"\n\
             cache_peers = true\npeer_listen = \"{peer}\"\n",
            origin.url(),
            etcd.toml_endpoints(),
            secret.display()
        ))
        .arg("--log-level")
        .arg("debug")
        .start();
    Member { name, srv, admin, peer }
}

fn metric(admin: SocketAddr, name: &str) -> f64 {
    let (_, text) = status_and_body(&format!("http://{admin}/metrics"));
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(-1.0)
}

fn wait_metric(admin: SocketAddr, name: &str, want: f64) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if metric(admin, name) == want {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// The origin target of object `i`, cacheable for ten minutes.
fn object(i: usize) -> String {
    format!("/api/set/obj{i}?h=Cache-Control:max-age%3D600")
}

/// The owner of `target` among `members` as the documented rendezvous hashing
/// names it: the highest first 8 bytes (big-endian) of SHA-256(name NUL key),
/// the key being `GET HOST TARGET` (no host for the default site).
fn owner<'a>(members: &[&'a str], target: &str) -> &'a str {
    let key = format!("GET  {target}");
    let weight = |m: &str| {
        let d = Sha256::new().chain_update(m.as_bytes()).chain_update([0]).chain_update(key.as_bytes()).finalize();
        u64::from_be_bytes(d[..8].try_into().unwrap())
    };
    members.iter().copied().max_by_key(|m| (weight(m), *m)).unwrap()
}

/// Requests the origin has had for objects.
fn origin_fetches(origin: &Origin) -> usize {
    origin.requests().iter().filter(|l| l.contains("/api/set/obj")).count()
}

/// Sends `head` (a whole request head) to `addr`, returns what came back.
fn raw(addr: SocketAddr, head: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn the_fleet_fetches_each_object_from_the_origin_once_and_survives_a_member_and_etcd() {
    let mut etcd = Etcd::start(3);
    let origin = Origin::start("o");
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("cluster.key");
    std::fs::write(&secret, [5u8; 32]).unwrap();
    let mut members: Vec<Member> = ["a", "b", "c"].into_iter().map(|n| member(n, &etcd, &secret, &origin)).collect();
    for m in &members {
        assert!(
            wait_metric(m.admin, "ktlsd_cache_peers_members", 3.0),
            "{} sees three members:\n{}",
            m.name,
            m.srv.stderr()
        );
    }
    let (_, doc) = status_and_body(&format!("http://{}/status.json", members[0].admin));
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(doc["cluster"]["cache_peers"].as_array().map(Vec::len), Some(3), "{doc}");

    // Round-robin through the three: one origin request per object, the right bytes.
    for i in 0..OBJECTS {
        let (status, body) = status_and_body(&members[i % 3].srv.url(&object(i)));
        assert_eq!(status, 200, "object {i}");
        assert!(body.starts_with("o 1 "), "object {i}: the origin's first answer, got {body:?}");
    }
    assert_eq!(origin_fetches(&origin), OBJECTS, "100 objects through three members: 100 origin requests");
    // Each owner filled its own keys; the others fetched theirs from it.
    let all = ["a", "b", "c"];
    for (k, m) in members.iter().enumerate() {
        let owned_here = (0..OBJECTS).filter(|&i| i % 3 == k && owner(&all, &object(i)) == m.name).count();
        let fetched = (0..OBJECTS).filter(|&i| i % 3 == k && owner(&all, &object(i)) != m.name).count();
        let served = (0..OBJECTS).filter(|&i| i % 3 != k && owner(&all, &object(i)) == m.name).count();
        assert_eq!(metric(m.admin, "ktlsd_cache_peer_owner_local_total"), owned_here as f64, "{}", m.name);
        assert_eq!(metric(m.admin, "ktlsd_cache_peer_fetches_total"), fetched as f64, "{}", m.name);
        assert_eq!(metric(m.admin, "ktlsd_cache_peer_served_total"), served as f64, "{}", m.name);
        assert_eq!(metric(m.admin, "ktlsd_cache_peer_failures_total"), 0.0, "{}", m.name);
    }
    // Again through the next member: all from the fleet's caches.
    for i in 0..OBJECTS {
        let (status, body) = status_and_body(&members[(i + 1) % 3].srv.url(&object(i)));
        assert_eq!((status, body.starts_with("o 1 ")), (200, true), "object {i} again");
    }
    assert_eq!(origin_fetches(&origin), OBJECTS, "a second round reaches the origin not at all");

    // Authentication on peer_listen: none, forged, stale: 403, logged; nothing else served there.
    let b = &members[1];
    let target = object(0);
    let none = raw(b.peer, &format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n"));
    assert!(none.starts_with("HTTP/1.1 403"), "{none}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let forged = raw(
        b.peer,
        &format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nktlsd-peer: a {now} {}\r\n\r\n", "00".repeat(32)),
    );
    assert!(forged.starts_with("HTTP/1.1 403"), "{forged}");
    let garbage = raw(b.peer, "NOT HTTP\r\n\r\n");
    assert!(garbage.starts_with("HTTP/1.1 403"), "{garbage}");
    assert!(
        b.srv.wait_stderr("refused a request from", Duration::from_secs(5)).is_some(),
        "the refusal is logged:\n{}",
        b.srv.stderr()
    );
    assert_eq!(metric(b.admin, "ktlsd_cache_peer_refused_total"), 3.0);
    assert_eq!(origin_fetches(&origin), OBJECTS, "a refused request reaches no origin");

    // c killed: at once, its keys are fetched from the origin directly by the others.
    let c = members.pop().unwrap();
    drop(c);
    let dead: Vec<usize> = (0..OBJECTS).filter(|&i| owner(&all, &object(i)) == "c").collect();
    assert!(!dead.is_empty());
    let first_dead = dead[0];
    let (status, _) = status_and_body(&members[0].srv.url(&object(first_dead)));
    assert_eq!(status, 200, "an owner unreachable: the origin answers");
    assert!(metric(members[0].admin, "ktlsd_cache_peer_failures_total") >= 1.0);
    assert!(members[0].srv.stderr().contains("asking the origin directly"), "{}", members[0].srv.stderr());
    let before = origin_fetches(&origin);
    assert_eq!(before, OBJECTS + 1);

    // Once its lease expired, a and b own its keys: the origin is asked once for each, for no other.
    for m in &members {
        assert!(wait_metric(m.admin, "ktlsd_cache_peers_members", 2.0), "{} sees c gone", m.name);
    }
    let two = ["a", "b"];
    for i in 0..OBJECTS {
        for m in &members {
            let (status, body) = status_and_body(&m.srv.url(&object(i)));
            assert_eq!(status, 200, "object {i} through {}", m.name);
            assert!(body.starts_with("o "), "{body:?}");
        }
    }
    // The one fetched while c was unreachable was stored by a: asked again only if b owns it now.
    let again = dead.iter().filter(|&&i| i != first_dead || owner(&two, &object(i)) == "b").count();
    assert_eq!(origin_fetches(&origin) - before, again, "the origin asked again only for c's keys");

    // etcd stopped: the members serve on, and share with the set they last saw.
    etcd.kill_all();
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..10 {
        for m in &members {
            assert_eq!(status_and_body(&m.srv.url(&object(i))).0, 200, "object {i} through {} without etcd", m.name);
        }
    }
    let fresh = OBJECTS + 1;
    let (status, body) = status_and_body(&members[0].srv.url(&object(fresh)));
    assert_eq!((status, body.starts_with("o 1 ")), (200, true));
    assert_eq!(status_and_body(&members[1].srv.url(&object(fresh))).0, 200);
    assert_eq!(origin.count(&object(fresh)), 1, "still one origin request per object without etcd");
    for m in &members {
        assert_eq!(metric(m.admin, "ktlsd_cache_peers_members"), 2.0, "{}: the last set seen", m.name);
    }
}
