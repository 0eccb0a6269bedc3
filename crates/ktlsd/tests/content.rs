//! Content delivery through the real binary and real clients: precompressed
//! variants chosen by Accept-Encoding (curl `--compressed` and explicit headers,
//! HTTP/1.1 and HTTP/2), error pages, the single-page-app fallback, and the
//! start-up validation of these options.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::*;

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ktlsd");

/// `gzip -c`/`zstd -c`/Debian Python's `brotli` of `original` into `out`.
fn compress(tool: &str, original: &Path, out: &Path) {
    let mut cmd = match tool {
        "brotli" => {
            let mut c = Command::new("/usr/bin/python3");
            c.args([
                "-c",
                "import brotli,sys; sys.stdout.buffer.write(brotli.compress(open(sys.argv[1],'rb').read()))",
            ]);
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
    let srv = Server::builder(BIN).file("app.js", &text).args(extra).start();
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
    check_refuses(
        d,
        &["--precompressed", "br,deflate"],
        None,
        "precompressed \"deflate\": expected br, zstd, gzip or none",
    );
    check_refuses(d, &[], Some("precompressed = [\"lz4\"]\n"), "precompressed \"lz4\"");
    check_refuses(d, &["--error-page", "404"], None, "--error-page \"404\": expected CODE=PATH");
    check_refuses(
        d,
        &["--error-page", "200=/x.html"],
        None,
        "error_page \"200\": expected a status code from 400 to 599",
    );
    check_refuses(
        d,
        &[],
        Some("error_page = { 404 = \"../x.html\" }\n"),
        "error_page 404: \"../x.html\" is not a path beneath the root",
    );
    check_refuses(d, &["--fallback", "index.html"], None, "fallback: \"index.html\" is not a path");
    check_refuses(d, &["--mime-type", "md"], None, "--mime-type \"md\": expected EXT=TYPE");
    check_refuses(
        d,
        &[],
        Some("[mime_types]\n\".md\" = \"text/markdown\"\n"),
        "mime_types \".md\": expected an extension",
    );
    check_refuses(
        d,
        &[],
        Some("[mime_types]\nmd = \"text markdown\"\n"),
        "mime_types md: \"text markdown\" is not a media type",
    );
    check_refuses(d, &["--mime-type", "md=text/x\r\nX-A: b"], None, "is not a media type");
    std::fs::create_dir(d.join("s")).unwrap();
    let site = format!(
        "[[site]]\nnames = [\"a.test\"]\nroot = {:?}\nprecompressed = [\"xz\"]\n",
        d.join("s").display().to_string()
    );
    check_refuses(d, &[], Some(&site), "site 1 (a.test): precompressed \"xz\"");
}

#[test]
fn error_page_and_fallback_end_to_end() {
    let srv = Server::builder(BIN)
        .file("index.html", b"<p>spa</p>")
        .file("404.html", b"<p>not here</p>")
        .file(".env", b"SECRET=1")
        .config("error_page = { 404 = \"/404.html\", 403 = \"/gone.html\" }\nfallback = \"/index.html\"\n")
        .start();
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/some/client/route"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (200, "<p>spa</p>"), "{proto}");
        // A refused dot-file gets the 404 page with 404, never the app.
        let r = fetch(&srv.url("/.env"), &[proto]);
        assert_eq!((r.status, r.body_str().as_str()), (404, "<p>not here</p>"), "{proto}");
    }
    // The command line wins over the file.
    let srv2 = Server::builder(BIN)
        .file("a.txt", b"a")
        .file("e.html", b"<p>e</p>")
        .args(["--error-page", "404=/e.html"])
        .start();
    let r = fetch(&srv2.url("/nope"), &[]);
    assert_eq!((r.status, r.body_str().as_str()), (404, "<p>e</p>"));
}

#[test]
fn mime_type_overrides() {
    let srv = Server::builder(BIN)
        .file("r.md", b"# r")
        .file("a.js", b"1")
        .file("noext", b"x")
        .config("[mime_types]\nmd = \"text/markdown; charset=utf-8\"\nJS = \"application/x-test\"\n")
        .start();
    for (path, want) in [
        ("/r.md", "text/markdown; charset=utf-8"),
        ("/a.js", "application/x-test"),
        ("/noext", "application/octet-stream"),
    ] {
        assert_eq!(fetch(&srv.url(path), &[]).header("content-type"), Some(want), "{path}");
    }
}

/// `[[headers]]` rules, `expires` and the CORS shorthand through curl over HTTP/1.1
/// and HTTP/2: the fields on file answers (and 304s), the preflight answer, a plain
/// OPTIONS, and a site's own rules replacing the top level's.
#[test]
fn header_rules_and_cors_end_to_end() {
    const CONFIG: &str = r#"cors = ["https://a.example"]

[[headers]]
path = "/assets/**"
set = { "Cache-Control" = "public, max-age=31536000, immutable" }

[[headers]]
extensions = ["html"]
expires = "30d"
add = { "X-Frame-Options" = "DENY" }
"#;
    let srv = Server::builder(BIN)
        .file("assets/app.1234.js", b"1")
        .file("index.html", b"<p>i</p>")
        .file("plain.txt", b"t")
        .config(CONFIG)
        .start();
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/assets/app.1234.js"), &[proto, "-H", "Origin: https://a.example"]);
        assert_eq!(r.status, 200, "{proto}");
        assert_eq!(r.header("cache-control"), Some("public, max-age=31536000, immutable"), "{proto}");
        assert_eq!(r.header("access-control-allow-origin"), Some("https://a.example"), "{proto}");
        assert_eq!(r.header("vary"), Some("Origin"), "{proto}");
        let tag = r.header("etag").unwrap().to_string();
        let r = fetch(&srv.url("/assets/app.1234.js"), &[proto, "-H", &format!("If-None-Match: {tag}")]);
        assert_eq!(
            (r.status, r.header("cache-control")),
            (304, Some("public, max-age=31536000, immutable")),
            "{proto}: 304"
        );

        let r = fetch(&srv.url("/index.html"), &[proto, "-H", "Origin: https://evil.example"]);
        assert_eq!(r.header("cache-control"), Some("max-age=2592000"), "{proto}");
        let expires = httpdate_secs(r.header("expires").expect("Expires"));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert!(expires.abs_diff(now + 2_592_000) < 120, "{proto}: Expires {expires} vs now {now}");
        assert_eq!(r.header("x-frame-options"), Some("DENY"), "{proto}");
        assert_eq!(r.header("access-control-allow-origin"), None, "{proto}: an origin not listed");
        // The directory's index is matched by its file's name.
        assert_eq!(fetch(&srv.url("/"), &[proto]).header("x-frame-options"), Some("DENY"), "{proto}");
        let r = fetch(&srv.url("/plain.txt"), &[proto]);
        assert_eq!((r.header("cache-control"), r.header("x-frame-options")), (None, None), "{proto}");

        // A preflight from a listed origin.
        let preflight = [
            proto,
            "-X",
            "OPTIONS",
            "-H",
            "Origin: https://a.example",
            "-H",
            "Access-Control-Request-Method: GET",
            "-H",
            "Access-Control-Request-Headers: range, x-custom",
        ];
        let r = fetch(&srv.url("/assets/app.1234.js"), &preflight);
        assert_eq!(r.status, 204, "{proto}: {:?}", r.headers);
        assert_eq!(r.header("access-control-allow-origin"), Some("https://a.example"), "{proto}");
        assert_eq!(r.header("access-control-allow-methods"), Some("GET, HEAD, OPTIONS"), "{proto}");
        assert_eq!(r.header("access-control-allow-headers"), Some("range, x-custom"), "{proto}");
        assert_eq!(r.header("access-control-max-age"), Some("86400"), "{proto}");
        assert_eq!(r.header("vary"), Some("Origin"), "{proto}");
        assert!(r.body.is_empty(), "{proto}");
        // From another origin: no permission.
        let r = fetch(
            &srv.url("/plain.txt"),
            &[proto, "-X", "OPTIONS", "-H", "Origin: https://evil.example", "-H", "Access-Control-Request-Method: GET"],
        );
        assert_eq!((r.status, r.header("access-control-allow-origin")), (204, None), "{proto}");
        // Plain OPTIONS.
        let r = fetch(&srv.url("/plain.txt"), &[proto, "-X", "OPTIONS"]);
        assert_eq!((r.status, r.header("allow")), (204, Some("GET, HEAD, OPTIONS")), "{proto}");
    }

    // `cors = "*"` on the command line: any origin, no Vary.
    let srv = Server::builder(BIN).file("a.txt", b"a").args(["--cors", "*"]).start();
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/a.txt"), &[proto, "-H", "Origin: https://x.example"]);
        assert_eq!((r.header("access-control-allow-origin"), r.header("vary")), (Some("*"), None), "{proto}");
        let r = fetch(
            &srv.url("/a.txt"),
            &[proto, "-X", "OPTIONS", "-H", "Origin: https://x.example", "-H", "Access-Control-Request-Method: GET"],
        );
        assert_eq!((r.status, r.header("access-control-allow-origin")), (204, Some("*")), "{proto}");
    }
}

/// Seconds since the epoch of an HTTP date, by Python (the tests have no date parser).
fn httpdate_secs(s: &str) -> u64 {
    let o = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import email.utils,sys; print(int(email.utils.parsedate_to_datetime(sys.argv[1]).timestamp()))",
            s,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap_or_else(|_| panic!("not an HTTP date: {s:?}"))
}

#[test]
fn check_refuses_bad_header_rules() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let rule = |body: &str| format!("[[headers]]\n{body}\n");
    check_refuses(
        d,
        &[],
        Some(&rule("path = \"*\"\nset = { \"Bad Name\" = \"x\" }")),
        "header name \"Bad Name\" is not an HTTP token",
    );
    check_refuses(
        d,
        &[],
        Some(&rule("path = \"*\"\nset = { \"X-A\" = \"a\\r\\nSet-Cookie: b\" }")),
        "may hold only visible ASCII",
    );
    check_refuses(
        d,
        &[],
        Some(&rule("path = \"*\"\nset = { \"Content-Length\" = \"1\" }")),
        "header Content-Length is set by the server itself",
    );
    check_refuses(
        d,
        &[],
        Some(&rule("path = \"*\"\nadd = { \"Transfer-Encoding\" = \"chunked\" }")),
        "header Transfer-Encoding is set by the server",
    );
    check_refuses(
        d,
        &[],
        Some(&rule("set = { \"X-A\" = \"1\" }")),
        "headers 1: give path (a glob such as \"/assets/**\") or extensions",
    );
    check_refuses(
        d,
        &[],
        Some(&rule("path = \"*\"\nexpires = \"1y\"")),
        "headers 1: expires: \"1y\" is not a duration",
    );
    check_refuses(d, &[], Some(&rule("path = \"*\"")), "headers 1: the rule sets nothing");
    check_refuses(d, &[], Some("cors = [\"a.example\"]\n"), "cors: \"a.example\" is not an origin");
    check_refuses(d, &["--cors", "ftp://x"], None, "cors: \"ftp://x\" is not an origin");
    check_refuses(d, &["--header", "*.js=X-A"], None, "--header \"*.js=X-A\": expected GLOB=NAME: VALUE");
}

/// Listings: directories first, natural order, sizes, decoded title, and the JSON form.
#[test]
fn listing_end_to_end() {
    let srv = Server::builder(BIN)
        .file("d/file10.txt", b"0123456789")
        .file("d/file2.txt", b"22")
        .file("d/File1.txt", b"1")
        .file("d/zeta/x", b"x")
        .file("d/Alpha/x", b"x")
        .file("d/caf\u{e9} <b>.txt", b"c")
        .arg("--autoindex")
        .start();
    for proto in ["--http1.1", "--http2"] {
        let r = fetch(&srv.url("/d/"), &[proto]);
        assert_eq!((r.status, r.header("content-type")), (200, Some("text/html; charset=utf-8")), "{proto}");
        assert_eq!(r.header("vary"), Some("Accept"), "{proto}");
        let page = r.body_str();
        let at = |s: &str| page.find(s).unwrap_or_else(|| panic!("{proto}: {s:?} missing from {page}"));
        let order = [
            "Alpha/</a>",
            "zeta/</a>",
            "caf\u{e9} &lt;b&gt;.txt</a>",
            "File1.txt</a>",
            "file2.txt</a>",
            "file10.txt</a>",
        ];
        let pos: Vec<usize> = order.iter().map(|s| at(s)).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{proto}: order {pos:?} in {page}");
        assert!(page.contains("<td class=\"n\">10 B</td>"), "{proto}: {page}");
        assert!(!page.contains("<b>"), "{proto}: unescaped name");

        let r = fetch(&srv.url("/d/"), &[proto, "-H", "Accept: application/json"]);
        assert_eq!(r.header("content-type"), Some("application/json"), "{proto}");
        let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let names: Vec<&str> = j.as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["Alpha", "zeta", "caf\u{e9} <b>.txt", "File1.txt", "file2.txt", "file10.txt"], "{proto}");
        assert_eq!(
            (j[0]["type"].as_str(), j[5]["type"].as_str(), j[5]["size"].as_u64()),
            (Some("directory"), Some("file"), Some(10))
        );
        assert!(j[5]["mtime"].as_str().is_some_and(|t| t.len() == 20 && t.ends_with('Z')), "{proto}: {}", j[5]);
    }
    let r = fetch(&srv.url("/d/zeta%20%3Cq%3E/"), &[]);
    assert_eq!(r.status, 404);
    std::fs::create_dir(srv.root().join("d/sp ace")).unwrap();
    let page = fetch(&srv.url("/d/sp%20ace/"), &[]).body_str();
    assert!(page.contains("<title>Index of /d/sp ace/</title>"), "{page}");
}

/// Headless Chromium renders a listing: every name in the DOM, and a screenshot
/// that is a real PNG with more than a blank page's colours.
#[test]
fn chromium_renders_a_listing() {
    let Some(chromium) = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
    else {
        panic!("chromium is not installed (scripts/test installs Debian's chromium)");
    };
    let names = ["alpha.txt", "beta-2.css", "beta-10.css", "gamma dir", "\u{e9}t\u{e9}.html"];
    let mut b = Server::builder(BIN).arg("--autoindex");
    for n in names {
        b = if n.ends_with("dir") {
            b.file(&format!("list/{n}/x"), b"x")
        } else {
            b.file(&format!("list/{n}"), b"some bytes")
        };
    }
    let srv = b.start();
    let profile = srv.dir().join("chromium-profile");
    let shot = srv.dir().join("listing.png");
    let common = |c: &mut Command| {
        c.args(["--headless", "--no-sandbox", "--ignore-certificate-errors", "--disable-gpu", "--no-first-run"])
            // Containers often have a small /dev/shm; Chromium then uses /tmp instead.
            .arg("--disable-dev-shm-usage")
            .arg(format!("--user-data-dir={}", profile.display()));
    };
    let mut dump = Command::new(chromium);
    common(&mut dump);
    dump.args(["--dump-dom", &srv.url("/list/")]);
    let o = run_with_timeout(&mut dump, None, Duration::from_secs(90));
    let dom = String::from_utf8_lossy(&o.stdout);
    for n in names {
        assert!(dom.contains(n), "{n:?} not in the DOM:\n{dom}\n{}", String::from_utf8_lossy(&o.stderr));
    }
    let mut cap = Command::new(chromium);
    common(&mut cap);
    cap.arg(format!("--screenshot={}", shot.display())).args(["--window-size=1024,768", &srv.url("/list/")]);
    let o = run_with_timeout(&mut cap, None, Duration::from_secs(90));
    assert!(shot.exists(), "no screenshot: {}", String::from_utf8_lossy(&o.stderr));
    // Decodes the PNG with zlib (no PIL here) and counts distinct pixels.
    let script = r#"
import sys, struct, zlib
d = open(sys.argv[1], 'rb').read()
assert d[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
i, idat, w, h = 8, b'', 0, 0
while i < len(d):
    n, t = struct.unpack('>I4s', d[i:i+8]); body = d[i+8:i+8+n]; i += 12 + n
    if t == b'IHDR': w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
    if t == b'IDAT': idat += body
raw = zlib.decompress(idat)
bpp = {2: 3, 6: 4}[ctype]
stride = w * bpp
rows, prev, i = [], bytearray(stride), 0
for y in range(h):
    f = raw[i]; line = bytearray(raw[i+1:i+1+stride]); i += 1 + stride
    for x in range(stride):
        a = line[x-bpp] if x >= bpp else 0; b = prev[x]; c = prev[x-bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p-a), abs(p-b), abs(p-c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(bytes(line)); prev = line
colours = set(); dark = 0
for r in rows:
    for x in range(0, stride, bpp):
        px = r[x:x+3]; colours.add(px)
        if sum(px) < 300: dark += 1
print(w, h, len(colours), dark)
"#;
    let o = Command::new("/usr/bin/python3").args(["-c", script]).arg(&shot).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let v: Vec<u64> = out.split_whitespace().filter_map(|s| s.parse().ok()).collect();
    assert_eq!(v.len(), 4, "decoder: {out} {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!((v[0], v[1]), (1024, 768), "screenshot size");
    // Text in several colours (links, headings) anti-aliased: many distinct pixels, some dark.
    assert!(v[2] > 20, "a blank-looking page: {} colours", v[2]);
    assert!(v[3] > 500, "too little text drawn: {} dark pixels", v[3]);
}
