//! Table tests of X-Accel-Redirect paths and answers.

use super::*;

#[test]
fn accel_paths_never_climb() {
    for (value, want) in [
        ("/files/a.bin", Ok("/files/a.bin")),
        ("  /a.txt  ", Ok("/a.txt")),
        ("/a%20b.txt", Ok("/a%20b.txt")),
        ("/a.txt?download=1", Ok("/a.txt")),
        ("/dir/./a", Ok("/dir/./a")),
        ("/a..b", Ok("/a..b")),
        ("/../etc/passwd", Err(AccelRefusal::Climbs)),
        ("/a/../../etc/passwd", Err(AccelRefusal::Climbs)),
        ("/a/..", Err(AccelRefusal::Climbs)),
        ("/%2e%2e/etc/passwd", Err(AccelRefusal::Climbs)),
        ("/%2E%2e/etc/passwd", Err(AccelRefusal::Climbs)),
        ("/.%2e/x", Err(AccelRefusal::Climbs)),
        ("/a%2f..%2f..%2fetc", Err(AccelRefusal::Climbs)),
        ("etc/passwd", Err(AccelRefusal::Malformed)),
        ("", Err(AccelRefusal::Malformed)),
        ("http://evil/x", Err(AccelRefusal::Malformed)),
        ("/a\\..\\b", Err(AccelRefusal::Malformed)),
        ("/a%00b", Err(AccelRefusal::Malformed)),
        ("/a%5c..", Err(AccelRefusal::Malformed)),
        ("/%ff", Err(AccelRefusal::Malformed)),
    ] {
        assert_eq!(accel_path(value).as_deref(), want.as_ref().map(|s| *s), "{value:?}");
    }
}

/// A site root and an accel root beside it, with a file, a dot-file, a directory and
/// symbolic links out of the accel root.
fn roots() -> (tempfile::TempDir, crate::files::Root, Arc<AccelRoot>) {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let (site, accel) = (dir.path().join("site"), dir.path().join("protected"));
    std::fs::create_dir_all(&site).unwrap();
    std::fs::create_dir_all(accel.join("sub")).unwrap();
    std::fs::write(site.join("secret.txt"), "site file").unwrap();
    std::fs::write(accel.join("report.pdf"), "0123456789").unwrap();
    std::fs::write(accel.join(".hidden"), "x").unwrap();
    symlink("/etc/passwd", accel.join("abs")).unwrap();
    symlink("../site/secret.txt", accel.join("rel")).unwrap();
    symlink(accel.join("report.pdf"), accel.join("inside")).unwrap();
    let site_root = crate::files::Root::new(&site).unwrap();
    let accel_root = Arc::new(AccelRoot(crate::files::Root::new(&accel).unwrap()));
    (dir, site_root, accel_root)
}

fn accel_for(req: Request, value: &str, root: &Arc<AccelRoot>, fields: Vec<Header>) -> Accel {
    let path = accel_path(value);
    let mut file = req;
    if let Ok(p) = &path {
        file.path.clone_from(p);
    }
    Accel { req: file, path, value: value.to_string(), root: root.clone(), fields }
}

#[test]
fn accel_answers_are_static_answers_beneath_accel_root() {
    let (_dir, site_root, accel) = roots();
    let opts = crate::files::Options { dotfiles: false, autoindex: true, cache_entries: 0 };
    let site = Site::new(&site_root, opts, Some("max-age=60"), crate::handler::Content::none());
    let get = || Request::new(crate::vocab::Method::Get, "/app/download");
    // (value, status)
    for (value, status) in [
        ("/report.pdf", 200),
        ("/inside", 200),
        ("/sub/../report.pdf", 404),
        ("/../site/secret.txt", 404),
        ("/%2e%2e/site/secret.txt", 404),
        ("/abs", 404),
        ("/rel", 404),
        ("/.hidden", 404),
        ("/sub/", 404),
        ("/sub", 404),
        ("/missing", 404),
        ("report.pdf", 404),
    ] {
        let r = answer(accel_for(get(), value, &accel, Vec::new()), &site);
        assert_eq!(r.status.0, status, "{value}");
        if status == 200 {
            assert_eq!(r.body.read_all(), b"0123456789", "{value}");
            assert!(matches!(r.body, Body::File { .. }), "{value}: a file body, for sendfile");
        } else {
            assert!(!String::from_utf8_lossy(&r.body.read_all()).contains("root:"), "{value}");
        }
        assert_eq!(r.header("Strict-Transport-Security").map(|h| h.to_string()).as_deref(), Some("max-age=60"));
    }

    // The upstream's download fields replace the file's own; a range and a 304 as for any file.
    let fields = vec![
        Header::Field("Content-Type".into(), "application/pdf".into()),
        Header::Field("Content-Disposition".into(), "attachment; filename=r.pdf".into()),
        Header::StrictTransportSecurity("max-age=60".into()),
    ];
    let mut fields_in = crate::handler::request::HeaderFields::default();
    fields_in.add("Range", "bytes=2-4");
    let mut ranged = get();
    ranged.headers = fields_in.parse();
    let r = answer(accel_for(ranged, "/report.pdf", &accel, fields.clone()), &site);
    assert_eq!((r.status.0, r.body.read_all()), (206, b"234".to_vec()));
    let types: Vec<String> = r.headers.iter().filter(|h| h.name() == "Content-Type").map(|h| h.to_string()).collect();
    assert_eq!(types, ["application/pdf"]);
    assert_eq!(r.headers.iter().filter(|h| h.name() == "Strict-Transport-Security").count(), 1);
    assert!(matches!(r.headers.last(), Some(Header::ContentRange(_))), "{:?}", r.headers);
    let etag = answer(accel_for(get(), "/report.pdf", &accel, Vec::new()), &site).header("ETag").unwrap().to_string();
    let mut cond = crate::handler::request::HeaderFields::default();
    cond.add("If-None-Match", &etag);
    let mut conditional = get();
    conditional.headers = cond.parse();
    let r = answer(accel_for(conditional, "/report.pdf", &accel, fields), &site);
    assert_eq!((r.status.0, r.body.read_all()), (304, Vec::new()));
}
