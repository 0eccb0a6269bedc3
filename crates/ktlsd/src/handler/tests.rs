//! `handle` against a real file tree in a temp dir, with no sockets: path safety,
//! directories, preconditions, ranges, HEAD, refusals and HSTS.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, SystemTime};

use tempfile::TempDir;

use super::*;
use crate::files::Options;
use request::HeaderFields;

const SECRET: &[u8] = b"TOP-SECRET-3f9c1a outside the root\n";
const A_TXT: &[u8] = b"inside\n";
const DIGITS: &[u8] = b"0123456789";

/// DIR/root is ROOT, with files, dot-files, symlinks in and out, a FIFO; DIR/secret.txt
/// and DIR/outside/secret.txt lie outside it.
struct Tree {
    dir: TempDir,
    root: Root,
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn tree() -> Tree {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().canonicalize().unwrap();
    let r = d.join("root");
    write(&d.join("secret.txt"), SECRET);
    write(&d.join("outside/secret.txt"), SECRET);
    for (p, bytes) in [
        ("a.txt", A_TXT),
        ("digits.txt", DIGITS),
        ("empty.txt", &b""[..]),
        ("sub/b.txt", b"bee\n"),
        ("d/index.html", b"<p>index</p>"),
        ("list/x.txt", b"x"),
        ("list/.hidden", b"h"),
        ("list/a&b<c>.txt", b"y"),
        ("a b.txt", b"space"),
        ("caf\u{e9}.txt", b"cafe"),
        (".hidden", b"h"),
        (".git/config", b"[core]"),
        ("sub/.env", b"PASSWORD=x"),
        (".well-known/thing", b"w"),
        (".well-known/.env", b"PASSWORD=y"),
        ("style.css", b"p{}"),
    ] {
        write(&r.join(p), bytes);
    }
    for (target, link) in [
        (Path::new("/etc/passwd"), "passwd"),
        (&d.join("secret.txt"), "s.txt"),
        (Path::new("../secret.txt"), "rel.txt"),
        (&d.join("outside"), "out"),
        (Path::new("../outside"), "relout"),
        (Path::new("../../secret.txt"), "sub/deep.txt"),
        (Path::new("loop2"), "loop1"),
        (Path::new("loop1"), "loop2"),
        (Path::new("a.txt"), "link.txt"),
        (Path::new("sub"), "linkdir"),
        (Path::new("../a.txt"), "sub/up.txt"),
        (&r.join("a.txt"), "abs.txt"),
        (&r.join("sub"), "absdir"),
        (Path::new("/dev/zero"), "zero"),
    ] {
        symlink(target, r.join(link)).unwrap();
    }
    let fifo = std::ffi::CString::new(r.join("pipe").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let root = Root::new(&r).unwrap();
    Tree { dir, root }
}

const PLAIN: Options = Options { dotfiles: false, autoindex: false, cache_entries: 0 };

impl Tree {
    fn site(&self, files: Options) -> Site<'_> {
        Site::new(&self.root, files, None, Content::none())
    }
}

fn get(path: &str) -> Request {
    Request::new(Method::Get, path)
}

fn with_fields(mut req: Request, fields: &[(&str, &str)]) -> Request {
    let mut f = HeaderFields::default();
    for (n, v) in fields {
        f.add(n, v);
    }
    req.headers = f.parse();
    req
}

/// The bytes the body describes.
fn body(r: &Response) -> Vec<u8> {
    r.body.read_all()
}

fn header(r: &Response, name: &str) -> Option<String> {
    r.header(name).map(|h| h.to_string())
}

/// GETs each path and checks the status, the body when given, that nothing from
/// outside ROOT came back, and that every refusal says why.
fn check(site: &Site<'_>, cases: &[(&str, u16, Option<&[u8]>)]) {
    for &(path, status, want) in cases {
        let r = handle(&get(path), site);
        assert_eq!(r.status.0, status, "GET {path}: {r:?}");
        let b = String::from_utf8_lossy(&body(&r)).into_owned();
        assert!(!b.contains("TOP-SECRET"), "GET {path} leaked a file from outside the root");
        assert!(!b.contains("root:x:0:0"), "GET {path} leaked /etc/passwd");
        if let Some(want) = want {
            assert_eq!(body(&r), want, "GET {path}");
        }
        assert_eq!(r.refused.is_some(), status >= 400, "GET {path}: refusals say why");
    }
}

#[test]
fn dotdot_above_root_is_400_however_spelt() {
    let t = tree();
    check(
        &t.site(PLAIN),
        &[
            ("/../secret.txt", 400, None),
            ("/sub/../../secret.txt", 400, None),
            ("/sub/./../../outside/secret.txt", 400, None),
            ("/../../../../../../etc/passwd", 400, None),
            ("/%2e%2e/secret.txt", 400, None),
            ("/%2E%2E%2Fsecret.txt", 400, None),
            ("/sub%2F%2E%2E%2F%2E%2E%2Fsecret.txt", 400, None),
            ("/..%2fsecret.txt", 400, None),
            ("/sub/..%2f..%2fsecret.txt", 400, None),
            ("/.%2e/secret.txt", 400, None),
            ("/%2e./secret.txt", 400, None),
        ],
    );
}

#[test]
fn dotdot_within_root_is_resolved() {
    let t = tree();
    check(&t.site(PLAIN), &[("/sub/../a.txt", 200, Some(A_TXT)), ("/sub/./b.txt", 200, Some(b"bee\n"))]);
}

#[test]
fn escapes_are_decoded_once_and_nothing_else_is_a_dot_or_separator() {
    let t = tree();
    check(
        &t.site(PLAIN),
        &[
            ("/a%20b.txt", 200, Some(b"space")),
            ("/caf%C3%A9.txt", 200, Some(b"cafe")),
            ("/caf%c3%a9.txt", 200, Some(b"cafe")),
            ("/%252e%252e/secret.txt", 404, None),
            ("/%252e%252e%252fsecret.txt", 404, None),
            ("/..\\secret.txt", 404, None),
            ("/..%5csecret.txt", 404, None),
            ("/%c0%ae%c0%ae/secret.txt", 404, None),
        ],
    );
}

#[test]
fn malformed_paths_are_400() {
    let t = tree();
    let site = t.site(PLAIN);
    check(
        &site,
        &[
            ("/a.txt%00.html", 400, None),
            ("/%00", 400, None),
            ("/%zz", 400, None),
            ("/a.txt%4", 400, None),
            ("/a.txt%", 400, None),
            ("a.txt", 400, None),
        ],
    );
    assert!(handle(&get("/%00"), &site).refused.unwrap().contains("NUL"));
}

#[test]
fn symlinks_out_of_root_and_special_files_are_403() {
    let t = tree();
    let site = t.site(PLAIN);
    check(
        &site,
        &[
            ("/passwd", 403, None),
            ("/s.txt", 403, None),
            ("/rel.txt", 403, None),
            ("/out/secret.txt", 403, None),
            ("/relout/secret.txt", 403, None),
            ("/sub/deep.txt", 403, None),
            ("/pipe", 403, None),
            ("/zero", 403, None),
        ],
    );
    assert!(handle(&get("/passwd"), &site).refused.unwrap().contains("outside the root"));
    // A symlink loop is refused, whichever way the kernel reports it.
    let r = handle(&get("/loop1"), &site);
    assert!(r.status.0 == 403 || r.status.0 == 404, "{r:?}");
}

#[test]
fn symlinks_within_root_are_served() {
    let t = tree();
    check(
        &t.site(PLAIN),
        &[
            ("/link.txt", 200, Some(A_TXT)),
            ("/linkdir/b.txt", 200, Some(b"bee\n")),
            ("/sub/up.txt", 200, Some(A_TXT)),
            ("/abs.txt", 200, Some(A_TXT)),
            ("/absdir/b.txt", 200, Some(b"bee\n")),
        ],
    );
}

#[test]
fn dotfiles_are_hidden_except_well_known() {
    let t = tree();
    let site = t.site(PLAIN);
    check(
        &site,
        &[
            ("/.hidden", 404, None),
            ("/.git/config", 404, None),
            ("/.git/", 404, None),
            ("/sub/.env", 404, None),
            ("/%2ehidden", 404, None),
            ("/sub/%2Eenv", 404, None),
            ("/.well-known/.env", 404, None),
            ("/.well-known/thing", 200, Some(b"w")),
        ],
    );
    assert!(handle(&get("/.hidden"), &site).refused.unwrap().contains("dot-file"));
}

#[test]
fn missing_files_are_404() {
    let t = tree();
    check(
        &t.site(PLAIN),
        &[("/nope", 404, None), ("/a.txt/", 404, None), ("/a.txt/below", 404, None), ("/sub/nope/x", 404, None)],
    );
}

#[test]
fn dotfiles_served_when_enabled() {
    let t = tree();
    let site = t.site(Options { dotfiles: true, ..PLAIN });
    for (path, status, want) in [
        ("/.hidden", 200, Some(&b"h"[..])),
        ("/.git/config", 200, Some(b"[core]")),
        ("/sub/.env", 200, Some(b"PASSWORD=x")),
        ("/../secret.txt", 400, None),
        ("/.%2e/secret.txt", 400, None),
    ] {
        let r = handle(&get(path), &site);
        assert_eq!(r.status.0, status, "GET {path}");
        if let Some(want) = want {
            assert_eq!(body(&r), want, "GET {path}");
        }
    }
}

#[test]
fn directories() {
    let t = tree();
    let plain = t.site(PLAIN);
    let listing = t.site(Options { autoindex: true, ..PLAIN });
    // An index is served; without one, 403 unless listing is on.
    let r = handle(&get("/d/"), &plain);
    assert_eq!((r.status, body(&r)), (Status::OK, b"<p>index</p>".to_vec()));
    assert_eq!(header(&r, "Content-Type").as_deref(), Some("text/html; charset=utf-8"));
    assert_eq!(handle(&get("/list/"), &plain).status, Status::FORBIDDEN);
    let r = handle(&get("/list/"), &listing);
    assert_eq!(r.status, Status::OK);
    let html = String::from_utf8(body(&r)).unwrap();
    assert!(html.contains("<a href=\"x%2Etxt\">x.txt</a>"), "{html}");
    assert!(html.contains("a&amp;b&lt;c&gt;.txt") && !html.contains("<c>"), "names are escaped: {html}");
    assert!(!html.contains(".hidden"), "{html}");
    assert_eq!(header(&r, "Content-Length"), Some(html.len().to_string()));
    // A listing of a directory outside ROOT is refused.
    let r = handle(&get("/out/"), &listing);
    assert_eq!(r.status, Status::FORBIDDEN);
    assert!(!String::from_utf8_lossy(&body(&r)).contains("secret"));
    // Without the slash: a redirect that keeps the query and stays on this host.
    for (path, query, location) in [
        ("/d", None, "/d/"),
        ("/d", Some("x=1&y"), "/d/?x=1&y"),
        ("/sub/../d", None, "/d/"),
        ("//sub", None, "/sub/"),
        ("///sub", None, "/sub/"),
        ("//evil.example/../sub", None, "/sub/"),
        ("//evil.example/%2e%2e/sub", None, "/sub/"),
        ("/a%20b%2Fc/..", None, "/a%20b/"),
    ] {
        let mut req = get(path);
        req.query = query.map(String::from);
        let r = handle(&req, &plain);
        if path == "/a%20b%2Fc/.." {
            // `a b` does not exist: the check is that the name would be re-encoded.
            assert_eq!(r.status.0, 404);
            continue;
        }
        assert_eq!(r.status, Status::MOVED_PERMANENTLY, "{path}");
        assert_eq!(header(&r, "Location").as_deref(), Some(location), "{path}");
        assert!(r.refused.is_none());
    }
}

#[test]
fn preconditions() {
    let t = tree();
    let site = t.site(PLAIN);
    let r = handle(&get("/a.txt"), &site);
    let etag = header(&r, "ETag").unwrap();
    let modified = header(&r, "Last-Modified").unwrap();
    let m = httpdate::parse_http_date(&modified).unwrap();
    let before = httpdate::fmt_http_date(m - Duration::from_secs(1));
    let weak = format!("W/{etag}");
    for (fields, status) in [
        (vec![("If-None-Match", etag.as_str())], 304),
        (vec![("If-None-Match", weak.as_str())], 304),
        (vec![("If-None-Match", "\"other\"")], 200),
        (vec![("If-None-Match", "*")], 304),
        (vec![("If-Modified-Since", modified.as_str())], 304),
        (vec![("If-Modified-Since", before.as_str())], 200),
        (vec![("If-Match", etag.as_str())], 200),
        (vec![("If-Match", weak.as_str())], 412),
        (vec![("If-Match", "\"other\"")], 412),
        (vec![("If-Unmodified-Since", before.as_str())], 412),
        (vec![("If-Unmodified-Since", modified.as_str())], 200),
        (vec![("If-None-Match", "\"other\""), ("If-Modified-Since", modified.as_str())], 200),
        (vec![("If-Match", "\"other\""), ("If-None-Match", etag.as_str())], 412),
    ] {
        for method in [Method::Get, Method::Head] {
            let r = handle(&with_fields(Request::new(method.clone(), "/a.txt"), &fields), &site);
            assert_eq!(r.status.0, status, "{method} {fields:?}");
            match status {
                304 => {
                    let names: Vec<&str> = r.headers.iter().map(Header::name).collect();
                    assert_eq!(names, ["Last-Modified", "ETag"]);
                    assert!(matches!(r.body, Body::Empty));
                }
                412 => assert!(r.refused.is_none(), "a failed precondition is no refusal"),
                _ => {}
            }
        }
    }
}

#[test]
fn ranges() {
    let t = tree();
    let site = t.site(PLAIN);
    let etag = header(&handle(&get("/digits.txt"), &site), "ETag").unwrap();
    let modified = header(&handle(&get("/digits.txt"), &site), "Last-Modified").unwrap();
    for (fields, status, want, content_range) in [
        (vec![("Range", "bytes=2-4")], 206, &b"234"[..], Some("bytes 2-4/10")),
        (vec![("Range", "bytes=7-")], 206, b"789", Some("bytes 7-9/10")),
        (vec![("Range", "bytes=-2")], 206, b"89", Some("bytes 8-9/10")),
        (vec![("Range", "bytes=0-99")], 206, DIGITS, Some("bytes 0-9/10")),
        (vec![("Range", "bytes=10-")], 416, b"", Some("bytes */10")),
        (vec![("Range", "bytes=0-1,2-3")], 206, b"0123", Some("bytes 0-3/10")),
        (vec![("Range", "lines=1-2")], 200, DIGITS, None),
        (vec![("Range", "bytes=1-2"), ("If-Range", etag.as_str())], 206, b"12", Some("bytes 1-2/10")),
        (vec![("Range", "bytes=1-2"), ("If-Range", modified.as_str())], 206, b"12", Some("bytes 1-2/10")),
        (vec![("Range", "bytes=1-2"), ("If-Range", "\"old\"")], 200, DIGITS, None),
        (vec![("Range", "bytes=10-"), ("If-Range", "\"old\"")], 200, DIGITS, None),
        (vec![("If-Range", etag.as_str())], 200, DIGITS, None),
    ] {
        let r = handle(&with_fields(get("/digits.txt"), &fields), &site);
        assert_eq!(r.status.0, status, "{fields:?}");
        assert_eq!(header(&r, "Content-Range").as_deref(), content_range, "{fields:?}");
        if status != 416 {
            assert_eq!(body(&r), want, "{fields:?}");
            assert_eq!(header(&r, "Content-Length"), Some(want.len().to_string()), "{fields:?}");
            assert_eq!(header(&r, "Accept-Ranges").as_deref(), Some("bytes"));
        }
    }
    // Several ranges: a multipart body of the file's parts.
    let r = handle(&with_fields(get("/digits.txt"), &[("Range", "bytes=0-1,-2")]), &site);
    let ct = header(&r, "Content-Type").unwrap();
    let b = ct.strip_prefix("multipart/byteranges; boundary=").unwrap();
    let part = |range: &str, bytes: &str| {
        format!("--{b}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Range: bytes {range}/10\r\n\r\n{bytes}")
    };
    let want = format!("{}\r\n{}\r\n--{b}--\r\n", part("0-1", "01"), part("8-9", "89"));
    assert_eq!((r.status.0, String::from_utf8(body(&r)).unwrap()), (206, want.clone()));
    assert_eq!(header(&r, "Content-Length"), Some(want.len().to_string()));
    // An empty file has no satisfiable range.
    let r = handle(&with_fields(get("/empty.txt"), &[("Range", "bytes=0-")]), &site);
    assert_eq!(r.status, Status::RANGE_NOT_SATISFIABLE);
    assert_eq!(header(&r, "Content-Range").as_deref(), Some("bytes */0"));
}

#[test]
fn head_is_get_without_a_body() {
    let t = tree();
    let site = t.site(PLAIN);
    for path in ["/a.txt", "/d/", "/d", "/nope", "/%00", "/passwd"] {
        let get = handle(&get(path), &site);
        let head = handle(&Request::new(Method::Head, path), &site);
        assert_eq!(head.status, get.status, "{path}");
        assert_eq!(head.headers, get.headers, "{path}: the same head, Content-Length included");
        assert!(matches!(head.body, Body::Empty), "{path}");
        assert!(!matches!(get.body, Body::Empty), "{path}");
    }
}

#[test]
fn methods_other_than_get_head_and_options_are_refused() {
    let t = tree();
    let site = t.site(PLAIN);
    for token in ["POST", "PUT", "DELETE", "TRACE", "PATCH", "CONNECT", "get", "BREW"] {
        let r = handle(&Request::new(Method::from_token(token), "/a.txt"), &site);
        assert_eq!(r.status, Status::METHOD_NOT_ALLOWED, "{token}");
        assert_eq!(r.header("Allow"), Some(&Header::Allow), "{token}");
        assert!(r.refused.is_some());
    }
}

#[test]
fn headers_of_a_file() {
    let t = tree();
    let site = t.site(PLAIN);
    let r = handle(&get("/style.css"), &site);
    let names: Vec<&str> = r.headers.iter().map(Header::name).collect();
    assert_eq!(names, ["Content-Type", "Content-Length", "Last-Modified", "ETag", "Accept-Ranges"]);
    assert_eq!(header(&r, "Content-Type").as_deref(), Some("text/css; charset=utf-8"));
    let meta = std::fs::metadata(t.dir.path().join("root/style.css")).unwrap();
    assert_eq!(header(&r, "ETag"), Some(files::etag(&meta)));
    let modified = httpdate::parse_http_date(&header(&r, "Last-Modified").unwrap()).unwrap();
    assert!(modified <= SystemTime::now());
}

#[test]
fn hsts_on_every_response() {
    let t = tree();
    let site = Site { hsts: Some("max-age=60"), ..t.site(PLAIN) };
    let sts = Header::StrictTransportSecurity("max-age=60".into());
    for (req, status) in [
        (get("/a.txt"), 200),
        (get("/d"), 301),
        (get("/nope"), 404),
        (get("/%00"), 400),
        (get("/passwd"), 403),
        (Request::new(Method::Post, "/"), 405),
        (with_fields(get("/a.txt"), &[("If-Match", "\"x\"")]), 412),
        (with_fields(get("/digits.txt"), &[("Range", "bytes=99-")]), 416),
        (with_fields(get("/a.txt"), &[("If-None-Match", "*")]), 304),
    ] {
        let r = handle(&req, &site);
        assert_eq!(r.status.0, status, "{req:?}");
        assert_eq!(r.headers.last(), Some(&sts), "{req:?}");
    }
    // A 206 ends with its Content-Range.
    let r = handle(&with_fields(get("/digits.txt"), &[("Range", "bytes=1-2")]), &site);
    let n = r.headers.len();
    assert_eq!((&r.headers[n - 2], r.headers[n - 1].name()), (&sts, "Content-Range"));
    // None when not configured.
    assert!(handle(&get("/a.txt"), &t.site(PLAIN)).header("Strict-Transport-Security").is_none());
}

#[test]
fn listings_follow_the_dotfile_rule_and_head() {
    let t = tree();
    let with_dots = t.site(Options { autoindex: true, dotfiles: true, ..PLAIN });
    let html = String::from_utf8(body(&handle(&get("/list/"), &with_dots))).unwrap();
    assert!(html.contains(">.hidden</a>"), "{html}");
    let head = handle(&Request::new(Method::Head, "/list/"), &with_dots);
    assert_eq!(head.status, Status::OK);
    assert!(matches!(head.body, Body::Empty));
    assert!(header(&head, "Content-Length").is_some_and(|n| n != "0"));
    // The root has no index.html: listed, and a subdirectory is marked as one.
    let html = String::from_utf8(body(&handle(&get("/"), &with_dots))).unwrap();
    assert!(html.contains("Index of /") && html.contains("href=\"sub/\""), "{html}");
    assert_eq!(handle(&get("/"), &t.site(PLAIN)).status, Status::FORBIDDEN);
}

#[test]
fn redirects_and_refusals_are_no_file() {
    let t = tree();
    let site = t.site(PLAIN);
    for path in ["/d", "/nope", "/%00", "/passwd"] {
        let r = handle(&get(path), &site);
        assert!(matches!(r.body, Body::Bytes(_)), "{path}: a small page, no file");
        assert_eq!(header(&r, "Content-Type").as_deref(), Some("text/html; charset=utf-8"), "{path}");
    }
    let r = handle(&get("/a.txt"), &site);
    let Body::File { range, .. } = &r.body else { panic!("a file body") };
    assert_eq!(*range, 0..A_TXT.len() as u64);
}

/// A tree with precompressed variants: good ones, and ones that must never be sent
/// (a symlink out of ROOT, a directory, a FIFO, a dot-file's).
fn precompressed_tree() -> Tree {
    let t = tree();
    let r = t.dir.path().canonicalize().unwrap().join("root");
    for (p, bytes) in [
        ("app.js", &b"console.log('identity')"[..]),
        ("app.js.br", b"BR-BYTES"),
        ("app.js.zst", b"ZSTD-BYTES"),
        ("app.js.gz", b"GZIP-BYTES-0123456789"),
        ("only.css", b"p{}"),
        ("only.css.gz", b"GZ-CSS"),
        ("leak.txt", b"plain"),
        ("dirv.txt", b"plain"),
        ("dirv.txt.br/x", b"x"),
        ("fifo.txt", b"plain"),
        ("d/index.html.gz", b"GZ-INDEX"),
        (".hidden.gz", b"GZ-HIDDEN"),
    ] {
        write(&r.join(p), bytes);
    }
    symlink(t.dir.path().join("secret.txt"), r.join("leak.txt.gz")).unwrap();
    symlink(t.dir.path().join("secret.txt"), r.join("leak.txt.br")).unwrap();
    let fifo = std::ffi::CString::new(r.join("fifo.txt.gz").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    t
}

fn precompressed() -> Content {
    use request::Coding::*;
    Content { precompressed: vec![Br, Zstd, Gzip], ..Content::NONE }
}

#[test]
fn precompressed_variants_follow_accept_encoding() {
    let t = precompressed_tree();
    let content = precompressed();
    let site = t.site(PLAIN).with_content(&content);
    let identity = &b"console.log('identity')"[..];
    for (path, accept, coding, want) in [
        ("/app.js", Some("gzip, deflate, br, zstd"), Some("br"), &b"BR-BYTES"[..]),
        ("/app.js", Some("gzip, zstd"), Some("zstd"), b"ZSTD-BYTES"),
        ("/app.js", Some("gzip"), Some("gzip"), b"GZIP-BYTES-0123456789"),
        ("/app.js", Some("x-gzip"), Some("gzip"), b"GZIP-BYTES-0123456789"),
        ("/app.js", Some("br;q=0.1, gzip;q=0.9"), Some("gzip"), b"GZIP-BYTES-0123456789"),
        ("/app.js", Some("br;q=0, zstd;q=0, *"), Some("gzip"), b"GZIP-BYTES-0123456789"),
        ("/app.js", Some("*"), Some("br"), b"BR-BYTES"),
        ("/app.js", Some("identity"), None, identity),
        ("/app.js", Some("deflate"), None, identity),
        ("/app.js", Some("br;q=0, gzip;q=0"), None, identity),
        ("/app.js", None, None, identity),
        // Only some variants exist: the best one that does.
        ("/only.css", Some("br, gzip"), Some("gzip"), b"GZ-CSS"),
        ("/a.txt", Some("br, gzip"), None, A_TXT),
        // The directory's index has its own variant.
        ("/d/", Some("gzip"), Some("gzip"), b"GZ-INDEX"),
        // Never what the original's checks would refuse: a symlink out of ROOT, a
        // directory, a FIFO.
        ("/leak.txt", Some("br, gzip"), None, b"plain"),
        ("/dirv.txt", Some("br"), None, b"plain"),
        ("/fifo.txt", Some("gzip"), None, b"plain"),
    ] {
        let mut req = get(path);
        if let Some(a) = accept {
            req = with_fields(req, &[("Accept-Encoding", a)]);
        }
        let r = handle(&req, &site);
        assert_eq!(r.status, Status::OK, "{path} {accept:?}");
        assert_eq!(header(&r, "Content-Encoding").as_deref(), coding, "{path} {accept:?}");
        assert_eq!(body(&r), want, "{path} {accept:?}");
        assert_eq!(
            header(&r, "Vary").as_deref(),
            Some("Accept-Encoding"),
            "{path} {accept:?}: Vary on every file answer"
        );
        assert_eq!(header(&r, "Content-Length"), Some(want.len().to_string()), "{path} {accept:?}");
    }
    // The variant keeps the original's Content-Type.
    let r = handle(&with_fields(get("/app.js"), &[("Accept-Encoding", "br")]), &site);
    assert_eq!(header(&r, "Content-Type").as_deref(), Some("text/javascript; charset=utf-8"));
    // A dot-file stays hidden whatever variant exists.
    assert_eq!(handle(&with_fields(get("/.hidden"), &[("Accept-Encoding", "gzip")]), &site).status, Status::NOT_FOUND);
    // Variants asked for by name are plain files, as before.
    assert_eq!(body(&handle(&get("/app.js.br"), &site)), b"BR-BYTES");
    // Without the option nothing changes: no variant, no Vary.
    let plain = handle(&with_fields(get("/app.js"), &[("Accept-Encoding", "br, gzip")]), &t.site(PLAIN));
    assert_eq!(body(&plain), identity);
    assert!(plain.header("Vary").is_none() && plain.header("Content-Encoding").is_none());
}

#[test]
fn precompressed_variants_have_their_own_validators_and_ranges() {
    let t = precompressed_tree();
    let content = precompressed();
    let site = t.site(PLAIN).with_content(&content);
    let gz = |fields: &[(&str, &str)]| {
        let mut all = vec![("Accept-Encoding", "gzip")];
        all.extend_from_slice(fields);
        handle(&with_fields(get("/app.js"), &all), &site)
    };
    let original = handle(&get("/app.js"), &site);
    let r = gz(&[]);
    let tag = header(&r, "ETag").unwrap();
    assert_ne!(Some(&tag), header(&original, "ETag").as_ref(), "distinct from the original's");
    assert_ne!(
        Some(&tag),
        header(&handle(&with_fields(get("/app.js"), &[("Accept-Encoding", "br")]), &site), "ETag").as_ref()
    );
    // Conditionals are the variant's.
    let r = gz(&[("If-None-Match", &tag)]);
    assert_eq!(r.status, Status::NOT_MODIFIED);
    assert_eq!(header(&r, "Vary").as_deref(), Some("Accept-Encoding"));
    assert_eq!(header(&r, "ETag").as_deref(), Some(tag.as_str()));
    let original_tag = header(&original, "ETag").unwrap();
    assert_eq!(gz(&[("If-None-Match", &original_tag)]).status, Status::OK, "the original's tag is not the variant's");
    // Ranges are of the variant's bytes.
    let r = gz(&[("Range", "bytes=5-9")]);
    assert_eq!(r.status, Status::PARTIAL_CONTENT);
    assert_eq!(body(&r), b"BYTES");
    assert_eq!(header(&r, "Content-Range").as_deref(), Some("bytes 5-9/21"));
    assert_eq!(header(&r, "Content-Encoding").as_deref(), Some("gzip"));
    let r = gz(&[("Range", "bytes=5-9"), ("If-Range", &tag)]);
    assert_eq!(r.status, Status::PARTIAL_CONTENT);
    let r = gz(&[("Range", "bytes=5-9"), ("If-Range", &original_tag)]);
    assert_eq!((r.status, body(&r)), (Status::OK, b"GZIP-BYTES-0123456789".to_vec()));
    // HEAD: the same head, no body.
    let mut head = with_fields(get("/app.js"), &[("Accept-Encoding", "gzip")]);
    head.method = Method::Head;
    let r = handle(&head, &site);
    assert!(matches!(r.body, Body::Empty));
    assert_eq!(header(&r, "Content-Length").as_deref(), Some("21"));
    assert_eq!(header(&r, "Content-Encoding").as_deref(), Some("gzip"));
}

#[test]
fn error_pages_keep_their_status() {
    let t = tree();
    write(&t.dir.path().join("root/errors/404.html"), b"<h1>custom 404</h1>");
    write(&t.dir.path().join("root/errors/403.html"), b"<h1>custom 403</h1>");
    let error_pages =
        vec![(404, "/errors/404.html".into()), (403, "/errors/403.html".into()), (405, "/missing.html".into())];
    let locations =
        location::Locations::new(Default::default(), location::SiteWide { error_pages, ..Default::default() });
    let content = Content { locations, ..Content::NONE };
    let site = t.site(PLAIN).with_content(&content);
    for (req, status, want) in [
        (get("/nope"), 404, Some(&b"<h1>custom 404</h1>"[..])),
        (get("/.hidden"), 404, Some(b"<h1>custom 404</h1>")),
        (get("/passwd"), 403, Some(b"<h1>custom 403</h1>")),
        (get("/a.txt"), 200, Some(A_TXT)),
        // The configured page is missing: the built-in one.
        (Request::new(Method::Post, "/a.txt"), 405, None),
        // No page for 400.
        (get("/%00"), 400, None),
    ] {
        let r = handle(&req, &site);
        assert_eq!(r.status.0, status, "{req:?}");
        let b = body(&r);
        match want {
            Some(w) => assert_eq!(b, w, "{req:?}"),
            None => assert!(String::from_utf8_lossy(&b).contains(&format!("<h1>{status} ")), "{req:?}"),
        }
        assert_eq!(header(&r, "Content-Length"), Some(b.len().to_string()), "{req:?}");
        assert_eq!(r.refused.is_some(), status >= 400, "{req:?}: still logged as a refusal");
    }
    let r = handle(&Request::new(Method::Post, "/a.txt"), &site);
    assert_eq!(header(&r, "Allow").as_deref(), Some("GET, HEAD, OPTIONS"));
    let mut head = get("/nope");
    head.method = Method::Head;
    let r = handle(&head, &site);
    assert!(matches!(r.body, Body::Empty));
    assert_eq!(header(&r, "Content-Length").as_deref(), Some("19"));
}

#[test]
fn fallback_only_for_paths_that_name_nothing() {
    let t = tree();
    write(&t.dir.path().join("root/app/index.html"), b"<p>app</p>");
    let content = Content { fallback: Some("/app/index.html".into()), ..Content::NONE };
    let site = t.site(PLAIN).with_content(&content);
    check(
        &site,
        &[
            ("/nope", 200, Some(b"<p>app</p>")),
            ("/deep/client/route", 200, Some(b"<p>app</p>")),
            ("/a.txt", 200, Some(A_TXT)),
            // Refused paths are refused, never the app.
            ("/.hidden", 404, None),
            ("/.git/config", 404, None),
            ("/sub/.env", 404, None),
            ("/../etc/passwd", 400, None),
            ("/passwd", 403, None),
            ("/out/secret.txt", 403, None),
            ("/pipe", 403, None),
            ("/%00", 400, None),
        ],
    );
    // A fallback that is missing itself is a plain 404, not a loop.
    let content = Content { fallback: Some("/missing.html".into()), ..Content::NONE };
    let site = t.site(PLAIN).with_content(&content);
    check(&site, &[("/nope", 404, None)]);
}

fn req_with(method: Method, path: &str, fields: &[(&str, &str)]) -> Request {
    let mut f = HeaderFields::default();
    for (n, v) in fields {
        f.add(n, v);
    }
    Request { headers: f.parse(), ..Request::new(method, path) }
}

fn field<'r>(r: &'r Response, name: &str) -> Vec<&'r str> {
    r.headers
        .iter()
        .filter_map(|h| match h {
            Header::Field(n, v) if n.eq_ignore_ascii_case(name) => Some(v.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn options_and_cors_preflights() {
    use rules::Cors;
    let t = tree();
    let plain = t.site(PLAIN);
    // Plain OPTIONS, any path (or `*`), no CORS configured.
    for path in ["/a.txt", "/nope", "*"] {
        let r = handle(&Request::new(Method::Options, path), &plain);
        assert_eq!((r.status, r.header("Allow")), (Status::NO_CONTENT, Some(&Header::Allow)), "{path}");
        assert!(matches!(r.body, Body::Empty) && r.header("Content-Length").is_none(), "{path}");
    }
    let list = Content { cors: Some(Cors::Origins(vec!["https://a.example".into()])), ..Content::NONE };
    let any = Content { cors: Some(Cors::Any), ..Content::NONE };
    let (list_site, any_site) = (plain.with_content(&list), plain.with_content(&any));
    let pre = |origin: &str, method: &str, hdrs: Option<&str>| {
        let mut f = vec![("Origin", origin), ("Access-Control-Request-Method", method)];
        if let Some(h) = hdrs {
            f.push(("Access-Control-Request-Headers", h));
        }
        req_with(Method::Options, "/a.txt", &f)
    };
    // (site, request, allow-origin, allow-headers, vary)
    for (site, req, origin, allow_headers, vary) in [
        (
            &list_site,
            pre("https://a.example", "GET", Some("range, x-a")),
            Some("https://a.example"),
            Some("range, x-a"),
            true,
        ),
        (&list_site, pre("https://a.example", "HEAD", None), Some("https://a.example"), None, true),
        (&list_site, pre("https://evil.example", "GET", None), None, None, true),
        (&list_site, pre("https://a.example", "DELETE", None), None, None, true),
        (&list_site, pre("https://a.example", "GET", Some("x-a\u{1}")), Some("https://a.example"), None, true),
        (&any_site, pre("https://x.example", "GET", None), Some("*"), None, false),
        (&plain, pre("https://x.example", "GET", None), None, None, false),
    ] {
        let r = handle(&req, site);
        let what = format!("{:?}", req.headers);
        assert_eq!(r.status, Status::NO_CONTENT, "{what}");
        assert_eq!(field(&r, "Access-Control-Allow-Origin").first().copied(), origin, "{what}");
        assert_eq!(field(&r, "Access-Control-Allow-Headers").first().copied(), allow_headers, "{what}");
        let allowed = origin.is_some();
        assert_eq!(
            field(&r, "Access-Control-Allow-Methods").first().copied(),
            allowed.then_some("GET, HEAD, OPTIONS"),
            "{what}"
        );
        assert_eq!(field(&r, "Access-Control-Max-Age").first().copied(), allowed.then_some("86400"), "{what}");
        assert_eq!(field(&r, "Vary"), if vary { vec!["Origin"] } else { vec![] }, "{what}");
    }
    // GET and HEAD answers, errors included, carry the allowed origin; others none.
    for (site, origin, path, want) in [
        (&list_site, Some("https://a.example"), "/a.txt", Some("https://a.example")),
        (&list_site, Some("https://a.example"), "/nope", Some("https://a.example")),
        (&list_site, Some("https://b.example"), "/a.txt", None),
        (&list_site, None, "/a.txt", None),
        (&any_site, None, "/a.txt", Some("*")),
        (&plain, Some("https://a.example"), "/a.txt", None),
    ] {
        let fields: Vec<(&str, &str)> = origin.map(|o| ("Origin", o)).into_iter().collect();
        for method in [Method::Get, Method::Head] {
            let r = handle(&req_with(method.clone(), path, &fields), site);
            assert_eq!(field(&r, "Access-Control-Allow-Origin").first().copied(), want, "{method} {path} {origin:?}");
        }
    }
    let r = handle(&req_with(Method::Post, "/a.txt", &[("Origin", "https://a.example")]), &list_site);
    assert!(field(&r, "Access-Control-Allow-Origin").is_empty());
}

#[test]
fn header_rules_on_files_304s_and_listings() {
    use rules::{HeaderRule, PathMatch};
    let t = tree();
    let rule = |paths, set: &[(&str, &str)], add: &[(&str, &str)], expires| {
        let own = |l: &[(&str, &str)]| l.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        HeaderRule::new(paths, own(set), own(add), expires).unwrap()
    };
    let content = Content {
        headers: vec![
            rule(
                PathMatch::Extensions(vec!["css".into()]),
                &[("Cache-Control", "public, max-age=31536000, immutable")],
                &[],
                None,
            ),
            rule(
                PathMatch::Pattern(crate::handler::pattern::PathPattern::new("/sub/**").unwrap()),
                &[],
                &[("X-Sub", "1"), ("X-Sub", "2")],
                Some(Duration::from_secs(60)),
            ),
            rule(
                PathMatch::Pattern(crate::handler::pattern::PathPattern::new("/list/").unwrap()),
                &[("X-Listing", "yes")],
                &[],
                None,
            ),
            rule(
                PathMatch::Pattern(crate::handler::pattern::PathPattern::new("*.txt").unwrap()),
                &[("Content-Type", "text/x-test")],
                &[],
                None,
            ),
        ],
        ..Content::NONE
    };
    let site = t.site(Options { autoindex: true, ..PLAIN }).with_content(&content);
    let r = handle(&get("/style.css"), &site);
    assert_eq!(field(&r, "Cache-Control"), ["public, max-age=31536000, immutable"]);
    let tag = header(&r, "ETag").unwrap();
    let r = handle(&req_with(Method::Get, "/style.css", &[("If-None-Match", &tag)]), &site);
    assert_eq!(
        (r.status, field(&r, "Cache-Control")),
        (Status::NOT_MODIFIED, vec!["public, max-age=31536000, immutable"])
    );
    let r = handle(&get("/sub/b.txt"), &site);
    assert_eq!(field(&r, "X-Sub"), ["1", "2"]);
    assert_eq!(field(&r, "Cache-Control"), ["max-age=60"]);
    let expires = httpdate::parse_http_date(field(&r, "Expires")[0]).unwrap();
    let ahead = expires.duration_since(SystemTime::now()).unwrap_or_default().as_secs();
    assert!((55..=61).contains(&ahead), "Expires {ahead}s ahead");
    // `set` replaces the answer's own field: one Content-Type.
    assert_eq!(r.headers.iter().filter(|h| h.name().eq_ignore_ascii_case("content-type")).count(), 1);
    assert_eq!(field(&r, "Content-Type"), ["text/x-test"]);
    // A range keeps Content-Range last.
    let r = handle(&req_with(Method::Get, "/sub/b.txt", &[("Range", "bytes=0-1")]), &site);
    assert_eq!((r.status, r.headers.last().map(Header::name)), (Status::PARTIAL_CONTENT, Some("Content-Range")));
    assert_eq!(field(&r, "X-Sub"), ["1", "2"]);
    // Listings by their path; errors and redirects get no rules.
    assert_eq!(field(&handle(&get("/list/"), &site), "X-Listing"), ["yes"]);
    for path in ["/sub/nope.txt", "/sub", "/sub/.env"] {
        let r = handle(&get(path), &site);
        assert!(field(&r, "X-Sub").is_empty() && field(&r, "Content-Type").is_empty(), "{path}: {:?}", r.headers);
    }
}

#[test]
fn listings_sort_and_answer_json() {
    let t = tree();
    for (p, b) in [("list/file10.txt", &b"0123456789"[..]), ("list/file2.txt", b"22"), ("list/Zdir/x", b"x")] {
        write(&t.dir.path().join("root").join(p), b);
    }
    let site = t.site(Options { autoindex: true, ..PLAIN });
    let r = handle(&get("/list/"), &site);
    let html = String::from_utf8(body(&r)).unwrap();
    let pos = |s: &str| html.find(s).unwrap_or_else(|| panic!("{s} in {html}"));
    assert!(
        pos(">Zdir/</a>") < pos(">a&amp;b")
            && pos(">file2.txt<") < pos(">file10.txt<")
            && pos(">file10.txt<") < pos(">x.txt<"),
        "{html}"
    );
    assert_eq!(field(&r, "Vary"), ["Accept"]);
    let r = handle(&req_with(Method::Get, "/list/", &[("Accept", "application/json")]), &site);
    assert_eq!(header(&r, "Content-Type").as_deref(), Some("application/json"));
    let j: serde_json::Value = serde_json::from_slice(&body(&r)).unwrap();
    let names: Vec<&str> = j.as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Zdir", "a&b<c>.txt", "file2.txt", "file10.txt", "x.txt"]);
    assert_eq!(
        (j[3]["size"].as_u64(), j[0]["type"].as_str(), j[0]["size"].is_null()),
        (Some(10), Some("directory"), true)
    );
}
