//! On-the-fly compression through the real binary and real clients: each coding
//! chosen by Accept-Encoding over HTTP/1.1 and HTTP/2 and decoded by its own
//! tool (zstd, Python's brotli, gzip) to the file's exact bytes, curl
//! `--compressed`, q=0 refusals, types and sizes left alone, Vary, per-variant
//! ETags and conditionals, ranges of the compressed variant, the store that makes
//! each body once (its counters and files), precompressed files winning, and the
//! start-up validation of the options.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// `bytes` decoded from `coding` by the real tools: `zstd -d`, `gzip -d`, Debian
/// Python's `brotli`.
fn decode(coding: &str, bytes: &[u8]) -> Vec<u8> {
    let mut cmd = match coding {
        "br" => {
            let mut c = Command::new("/usr/bin/python3");
            c.args(["-c", "import brotli,sys; sys.stdout.buffer.write(brotli.decompress(sys.stdin.buffer.read()))"]);
            c
        }
        "zstd" => {
            let mut c = Command::new("zstd");
            c.args(["-d", "-c"]);
            c
        }
        "gzip" => {
            let mut c = Command::new("gzip");
            c.args(["-d", "-c"]);
            c
        }
        other => panic!("no decoder for {other}"),
    };
    let o = run_with_timeout(&mut cmd, Some(bytes), CLIENT_TIMEOUT);
    assert!(o.status.success(), "{coding} decoding failed: {}", String::from_utf8_lossy(&o.stderr));
    o.stdout
}

/// Text that compresses well, `lines` lines of it.
fn text(lines: usize) -> Vec<u8> {
    (0..lines).flat_map(|i| format!("console.log('line {i}', {});\n", i * 7 % 13).into_bytes()).collect()
}

/// Files written into the store directory.
fn stored_files(state: &Path) -> usize {
    std::fs::read_dir(state.join("compressed")).map_or(0, |d| d.count())
}

#[test]
fn each_coding_over_http1_and_http2() {
    let js = text(5000);
    let png: Vec<u8> = text(500); // compressible bytes, but image/png is left alone
    let big = text(20_000);
    let srv = Server::builder(BIN)
        .file("app.js", &js)
        .file("logo.png", &png)
        .file("small.txt", b"hello, small world\n")
        .file("big.txt", &big)
        .args(["--compress", "zstd,br,gzip", "--compress-max-size", "200000"])
        .start();
    assert!(big.len() > 200_000, "big.txt is over compress_max_size");
    let state = srv.dir().join("state");
    let url = srv.url("/app.js");
    for proto in ["--http1.1", "--http2"] {
        for (accept, coding) in [
            ("zstd", Some("zstd")),
            ("br", Some("br")),
            ("gzip", Some("gzip")),
            ("gzip, deflate, br, zstd", Some("zstd")),
            ("gzip;q=1, zstd;q=0.5", Some("gzip")),
            ("zstd;q=0, br;q=0, *", Some("gzip")),
            ("zstd;q=0, br;q=0, gzip;q=0", None),
            ("*;q=0, identity", None),
            ("identity", None),
            ("deflate", None),
        ] {
            let what = format!("{proto} Accept-Encoding: {accept}");
            let r = fetch(&url, &[proto, "-H", &format!("Accept-Encoding: {accept}")]);
            assert_eq!(r.status, 200, "{what}");
            assert_eq!(r.header("content-encoding"), coding, "{what}");
            assert_eq!(r.header("vary"), Some("Accept-Encoding"), "{what}");
            assert_eq!(r.header("content-type"), Some("text/javascript; charset=utf-8"), "{what}");
            assert_eq!(r.header("content-length"), Some(r.body.len().to_string().as_str()), "{what}");
            match coding {
                Some(c) => {
                    assert!(r.body.len() < js.len() / 3, "{what}: {} bytes", r.body.len());
                    assert_eq!(sha256(&decode(c, &r.body)), sha256(&js), "{what}: decoded");
                }
                None => assert_eq!(sha256(&r.body), sha256(&js), "{what}: the file as it is"),
            }
        }
        // curl --compressed offers `deflate, gzip, br, zstd` with equal weight: the server's order decides.
        let r = fetch(&url, &[proto, "--compressed"]);
        assert_eq!(r.header("content-encoding"), Some("zstd"), "{proto}: {:?}", r.headers);
        assert_eq!(sha256(&r.body), sha256(&js), "{proto} --compressed: decoded body");

        // Types and sizes left alone: no coding, and no Vary since the answer never varies.
        for (path, want) in [("/logo.png", &png), ("/small.txt", &b"hello, small world\n".to_vec()), ("/big.txt", &big)]
        {
            let r = fetch(&srv.url(path), &[proto, "-H", "Accept-Encoding: gzip, br, zstd"]);
            assert_eq!((r.status, r.header("content-encoding")), (200, None), "{proto} {path}");
            assert_eq!(r.header("vary"), None, "{proto} {path}");
            assert_eq!(sha256(&r.body), sha256(want), "{proto} {path}");
        }

        // Each variant its own validator, and conditionals per variant.
        let etag = |accept: &str| {
            let r = fetch(&url, &[proto, "-H", &format!("Accept-Encoding: {accept}")]);
            r.header("etag").unwrap_or_else(|| panic!("{proto} {accept}: no ETag")).to_string()
        };
        let tags = [etag("identity"), etag("zstd"), etag("br"), etag("gzip")];
        assert!(tags[1].ends_with("-zstd\"") && tags[3].ends_with("-gz\""), "{tags:?}");
        assert_eq!(tags[1].trim_end_matches("-zstd\""), tags[0].trim_end_matches('"'), "the file's tag inside");
        for (i, a) in tags.iter().enumerate() {
            for b in &tags[i + 1..] {
                assert_ne!(a, b, "{proto}: distinct ETags");
            }
        }
        let r = fetch(&url, &[proto, "-H", "Accept-Encoding: gzip", "-H", &format!("If-None-Match: {}", tags[3])]);
        assert_eq!(r.status, 304, "{proto}: the gzip variant's tag matches the gzip variant");
        assert_eq!(r.header("etag"), Some(tags[3].as_str()));
        assert_eq!(r.header("vary"), Some("Accept-Encoding"), "{proto}: a 304 varies too");
        let r = fetch(&url, &[proto, "-H", "Accept-Encoding: br", "-H", &format!("If-None-Match: {}", tags[3])]);
        assert_eq!((r.status, r.header("content-encoding")), (200, Some("br")), "{proto}: not the br variant's");

        // A range applies to the compressed representation (RFC 9110 section 14.1).
        let whole = fetch(&url, &[proto, "-H", "Accept-Encoding: gzip"]).body;
        let r = fetch(&url, &[proto, "-H", "Accept-Encoding: gzip", "-r", "10-109"]);
        assert_eq!(r.status, 206, "{proto}");
        assert_eq!(r.header("content-encoding"), Some("gzip"), "{proto}");
        assert_eq!(r.header("content-range"), Some(format!("bytes 10-109/{}", whole.len()).as_str()), "{proto}");
        assert_eq!(r.body, &whole[10..110], "{proto}: range of the variant");
        let r =
            fetch(&url, &[proto, "-H", "Accept-Encoding: gzip", "-r", "0-9", "-H", &format!("If-Range: {}", tags[3])]);
        assert_eq!((r.status, r.body.as_slice()), (206, &whole[..10]), "{proto}: If-Range with the variant's tag");
    }
    // One body per coding made, however many requests asked: the rest came from the store.
    assert_eq!(stored_files(&state), 3, "one stored file per coding");
    let stopped = srv.stop();
    stopped.assert_clean_exit();
    assert_eq!(stopped.stat("compressed_made"), 3, "{}", stopped.stderr);
    assert!(stopped.stat("compressed_hits") >= 20, "{}", stopped.stderr);
}

#[test]
fn the_first_answer_is_compressed_and_the_second_comes_from_the_store() {
    let css: Vec<u8> = (0..3000).flat_map(|i| format!(".c{i} {{ margin: {i}px; }}\n").into_bytes()).collect();
    let b = Server::builder(BIN).file("site.css", &css).args(["--compress", "br", "--admin"]);
    let sock = b.dir().join("admin.sock");
    let srv = b.arg(&sock).start();
    let before = scrape(&sock);
    assert_eq!(before["ktlsd_compressed_made_total"], 0.0);
    for (i, proto) in ["--http2", "--http1.1"].into_iter().enumerate() {
        let r = fetch(&srv.url("/site.css"), &[proto, "--compressed"]);
        assert_eq!(r.header("content-encoding"), Some("br"), "{proto}: request {}", i + 1);
        assert_eq!(sha256(&r.body), sha256(&css), "{proto}");
    }
    // Workers publish their counters on a tick.
    let counts = || {
        let m = scrape(&sock);
        (m["ktlsd_compressed_made_total"], m["ktlsd_compressed_hits_total"])
    };
    let mut got = counts();
    for _ in 0..50 {
        if got.1 >= 2.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        got = counts();
    }
    assert_eq!(got, (1.0, 2.0), "(made, hits): made once, both answers sent from the stored body");

    // A changed file is compressed anew, and the answer is the new file's.
    let css2: Vec<u8> = [css.as_slice(), b".new { color: red; }\n"].concat();
    srv.write("site.css", &css2);
    std::thread::sleep(Duration::from_millis(1100)); // the open-file cache's binding lasts up to 1 s
    let r = fetch(&srv.url("/site.css"), &["--compressed"]);
    assert_eq!(sha256(&r.body), sha256(&css2));
    srv.stop().assert_clean_exit();
}

#[test]
fn precompressed_files_win() {
    let js = text(3000);
    let srv = Server::builder(BIN)
        .file("app.js", &js)
        .file("other.js", &js)
        .args(["--compress", "gzip,zstd", "--precompressed", "gzip"])
        .start();
    let gz = srv.root().join("app.js.gz");
    let o = run_with_timeout(Command::new("gzip").arg("-c").arg(srv.root().join("app.js")), None, CLIENT_TIMEOUT);
    assert!(o.status.success());
    std::fs::write(&gz, &o.stdout).unwrap();
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/app.js"), &[proto, "-H", "Accept-Encoding: gzip, zstd"]);
        assert_eq!(r.header("content-encoding"), Some("gzip"), "{proto}");
        assert_eq!(sha256(&r.body), sha256_file(&gz), "{proto}: the precompressed file's bytes");
        // Without a precompressed file the same request is compressed on the fly.
        let r = fetch(&srv.url("/other.js"), &[proto, "-H", "Accept-Encoding: gzip, zstd"]);
        assert_eq!(r.header("content-encoding"), Some("gzip"), "{proto}");
        assert_eq!(sha256(&decode("gzip", &r.body)), sha256(&js), "{proto}");
    }
    let stopped = srv.stop();
    assert_eq!(stopped.stat("compressed_made"), 1, "only other.js: {}", stopped.stderr);
}

#[test]
fn each_site_has_its_own_codings() {
    let js = text(3000);
    let b = Server::builder(BIN).file("app.js", &js);
    for name in ["b", "c"] {
        std::fs::create_dir_all(b.dir().join(name)).unwrap();
        std::fs::write(b.dir().join(name).join("app.js"), &js).unwrap();
    }
    let srv = b
        .config(concat!(
            "compress = [\"zstd\"]\n",
            "[[site]]\nnames = [\"b.test\"]\nroot = \"b\"\ncompress = [\"gzip\"]\n",
            "[[site]]\nnames = [\"c.test\"]\nroot = \"c\"\ncompress = [\"none\"]\n",
        ))
        .start();
    let port = srv.port();
    for (name, want) in [("127.0.0.1", Some("zstd")), ("b.test", Some("gzip")), ("c.test", None)] {
        let resolve = format!("{name}:{port}:127.0.0.1");
        let url = format!("https://{name}:{port}/app.js");
        for proto in ["--http1.1", "--http2"] {
            let r = fetch(&url, &[proto, "--resolve", &resolve, "-H", "Accept-Encoding: zstd, gzip"]);
            assert_eq!(r.header("content-encoding"), want, "{name} {proto}");
            let body = match want {
                Some(c) => decode(c, &r.body),
                None => r.body,
            };
            assert_eq!(sha256(&body), sha256(&js), "{name} {proto}");
        }
    }
}

/// `ktlsd serve` with `args` (and the config file `config`) stops at start-up
/// with one error line containing `want`.
fn refuses(args: &[&str], config: Option<&str>, want: &str) {
    let mut b = Server::builder(BIN).args(args);
    if let Some(text) = config {
        b = b.config(text);
    }
    b.run_to_exit().assert_startup_error(&[want]);
}

#[test]
fn bad_compress_options_stop_start_up() {
    refuses(&["--compress", "zstd,deflate"], None, "compress \"deflate\": expected br, zstd, gzip or none");
    refuses(&["--compress", "gzip", "--compress-min-size", "0"], None, "compress_min_size 0");
    refuses(&["--compress-cache-size", "1000"], None, "compress_cache_size 1000: expected at least");
    let site = "[[site]]\nnames = [\"b.test\"]\nroot = \".\"\ncompress = [\"lz4\"]\n";
    refuses(&[], Some(site), "site 1 (b.test): compress \"lz4\"");
    let sizes = "compress = [\"br\"]\ncompress_min_size = 5000\ncompress_max_size = 4000\n";
    refuses(&[], Some(sizes), "compress_max_size 4000: expected at least compress_min_size (5000)");
}
