//! Content delivery through the real binary and real clients: precompressed
//! variants chosen by Accept-Encoding (curl `--compressed` and explicit headers,
//! HTTP/1.1 and HTTP/2), error pages, the single-page-app fallback, and the
//! start-up validation of these options.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// `gzip -c`/`zstd -c`/Debian Python's `brotli` of `original` into `out`.
fn compress(tool: &str, original: &Path, out: &Path) {
    let mut cmd = match tool {
        "brotli" => {
            let mut c = Command::new("/usr/bin/python3");
            c.args(["-c", "import brotli,sys; sys.stdout.buffer.write(brotli.compress(open(sys.argv[1],'rb').read()))"]);
            c
        }
        _ => {
            let mut c = Command::new(tool);
            c.arg("-c");
            c
        }
    };
    let o = run_with_timeout(cmd.arg(original), None, CLIENT_TIMEOUT);
    assert!(o.status.success(), "{tool} failed: {}", String::from_utf8_lossy(&o.stderr));
    std::fs::write(out, &o.stdout).unwrap();
}

/// A server with `app.js` (compressible text) and its .gz and .zst made by the
/// real tools, and its .br by Python's brotli.
fn precompressed_server(extra: &[&str]) -> (Server, Vec<u8>) {
    let text: Vec<u8> = (0..4000).flat_map(|i| format!("console.log('line {i}');\n").into_bytes()).collect();
    let srv = Server::builder().file("app.js", &text).args(extra).start();
    let js = srv.root().join("app.js");
    compress("gzip", &js, &srv.root().join("app.js.gz"));
    compress("zstd", &js, &srv.root().join("app.js.zst"));
    compress("brotli", &js, &srv.root().join("app.js.br"));
    (srv, text)
}

#[test]
fn precompressed_variants_over_http1_and_http2() {
    let (srv, text) = precompressed_server(&["--precompressed", "br,zstd,gzip"]);
    let root = srv.root().to_path_buf();
    let url = srv.url("/app.js");
    for proto in ["--http1.1", "--http2"] {
        for (accept, coding, file) in [
            ("gzip", Some("gzip"), "app.js.gz"),
            ("gzip, zstd", Some("zstd"), "app.js.zst"),
            ("gzip;q=1, zstd;q=0.5", Some("gzip"), "app.js.gz"),
            ("br, gzip", Some("br"), "app.js.br"),
            ("identity", None, "app.js"),
            ("br;q=0, zstd;q=0, gzip;q=0", None, "app.js"),
        ] {
            let r = fetch(&url, &[proto, "-H", &format!("Accept-Encoding: {accept}")]);
            let what = format!("{proto} Accept-Encoding: {accept}");
            assert_eq!(r.status, 200, "{what}");
            assert_eq!(r.header("content-encoding"), coding, "{what}");
            assert_eq!(r.header("vary"), Some("Accept-Encoding"), "{what}");
            assert_eq!(r.header("content-type"), Some("text/javascript; charset=utf-8"), "{what}");
            assert_eq!(sha256(&r.body), sha256_file(&root.join(file)), "{what}: the variant's bytes");
        }
        // curl --compressed offers what it can decode and gets the original's bytes back.
        let r = fetch(&url, &[proto, "--compressed"]);
        // curl offers `deflate, gzip, br, zstd` with equal weight: the server's order decides.
        assert_eq!(r.header("content-encoding"), Some("br"), "{proto}: {:?}", r.headers);
        assert_eq!(sha256(&r.body), sha256(&text), "{proto} --compressed: decoded body");
        // A range of the variant, and its own validator.
        let r = fetch(&url, &[proto, "-H", "Accept-Encoding: gzip", "-r", "10-19"]);
        assert_eq!(r.status, 206, "{proto}");
        let gz = std::fs::read(root.join("app.js.gz")).unwrap();
        assert_eq!(r.body, &gz[10..20], "{proto}: range of the variant");
        let tag = fetch(&url, &[proto, "-H", "Accept-Encoding: gzip"]).header("etag").unwrap().to_string();
        assert_ne!(Some(tag.as_str()), fetch(&url, &[proto]).header("etag"), "{proto}: distinct ETags");
        let r = fetch(&url, &[proto, "-H", "Accept-Encoding: gzip", "-H", &format!("If-None-Match: {tag}")]);
        assert_eq!(r.status, 304, "{proto}");
    }
}

#[test]
fn precompressed_is_off_by_default() {
    let (srv, text) = precompressed_server(&[]);
    let r = fetch(&srv.url("/app.js"), &["-H", "Accept-Encoding: gzip, br, zstd"]);
    assert_eq!((r.header("content-encoding"), r.header("vary")), (None, None));
    assert_eq!(sha256(&r.body), sha256(&text));
}

/// `ktlsd check` with `args` fails with one line containing `want`.
fn check_refuses(dir: &Path, args: &[&str], config: Option<&str>, want: &str) {
    let mut cmd = Command::new(BIN);
    cmd.args(["check", "--ephemeral-cert", "--listen", "127.0.0.1:0"]).args(allow_root_args()).args(args);
    if let Some(text) = config {
        let cfg = dir.join("ktlsd.toml");
        std::fs::write(&cfg, text).unwrap();
        cmd.arg("--config").arg(cfg);
    }
    cmd.arg(dir);
    let out = run_with_timeout(&mut cmd, None, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} {config:?}: accepted");
    assert!(err.contains(want), "{args:?} {config:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn check_refuses_bad_content_options() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    check_refuses(d, &["--precompressed", "br,deflate"], None, "precompressed \"deflate\": expected br, zstd, gzip or none");
    check_refuses(d, &[], Some("precompressed = [\"lz4\"]\n"), "precompressed \"lz4\"");
    check_refuses(d, &["--error-page", "404"], None, "--error-page \"404\": expected CODE=PATH");
    check_refuses(d, &["--error-page", "200=/x.html"], None, "error_page \"200\": expected a status code from 400 to 599");
    check_refuses(d, &[], Some("error_page = { 404 = \"../x.html\" }\n"), "error_page 404: \"../x.html\" is not a path beneath the root");
    check_refuses(d, &["--fallback", "index.html"], None, "fallback: \"index.html\" is not a path");
    check_refuses(d, &["--mime-type", "md"], None, "--mime-type \"md\": expected EXT=TYPE");
    check_refuses(d, &[], Some("[mime_types]\n\".md\" = \"text/markdown\"\n"), "mime_types \".md\": expected an extension");
    check_refuses(d, &[], Some("[mime_types]\nmd = \"text markdown\"\n"), "mime_types md: \"text markdown\" is not a media type");
    check_refuses(d, &["--mime-type", "md=text/x\r\nX-A: b"], None, "is not a media type");
    std::fs::create_dir(d.join("s")).unwrap();
    let site = format!("[[site]]\nnames = [\"a.test\"]\nroot = {:?}\nprecompressed = [\"xz\"]\n", d.join("s").display().to_string());
    check_refuses(d, &[], Some(&site), "site 1 (a.test): precompressed \"xz\"");
}

#[test]
fn error_page_and_fallback_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ktlsd.toml");
    std::fs::write(&cfg, "error_page = { 404 = \"/404.html\", 403 = \"/gone.html\" }\nfallback = \"/index.html\"\n").unwrap();
    let srv = Server::builder()
        .file("index.html", b"<p>spa</p>")
        .file("404.html", b"<p>not here</p>")
        .file(".env", b"SECRET=1")
        .arg("--config")
        .arg(&cfg)
        .start();
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/some/client/route"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "<p>spa</p>"), "{proto}");
        // A refused dot-file gets the 404 page with 404, never the app.
        let r = fetch(&srv.url("/.env"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (404, "<p>not here</p>"), "{proto}");
    }
    // The command line wins over the file.
    let srv2 = Server::builder().file("a.txt", b"a").file("e.html", b"<p>e</p>").args(["--error-page", "404=/e.html"]).start();
    let r = fetch(&srv2.url("/nope"), &[]);
    assert_eq!((r.status, r.body_str().as_str()), (404, "<p>e</p>"));
}

#[test]
fn mime_type_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ktlsd.toml");
    std::fs::write(&cfg, "[mime_types]\nmd = \"text/markdown; charset=utf-8\"\nJS = \"application/x-test\"\n").unwrap();
    let srv = Server::builder().file("r.md", b"# r").file("a.js", b"1").file("noext", b"x").arg("--config").arg(&cfg).start();
    for (path, want) in [("/r.md", "text/markdown; charset=utf-8"), ("/a.js", "application/x-test"), ("/noext", "application/octet-stream")] {
        assert_eq!(fetch(&srv.url(path), &[]).header("content-type"), Some(want), "{path}");
    }
}
