//! Request-path normalisation: `files::normalize` (the path the files are opened by)
//! against `handler::pattern::route_path` (the path `[[redirect]]` and `[[access]]`
//! rules match), and the rules' path patterns. Both must refuse the same paths and,
//! where they accept one, name the same segments: otherwise a request could reach a
//! file by a path its access rule does not see (`/%61dmin/`, `/x/../admin/`). Every
//! segment is a plain name (no `/`, NUL, `.` or `..`), and with dot-files hidden none
//! starts with a dot but `.well-known` at the top.
//!
//! Input: the path, then optionally a NUL and a pattern to match against it.
#![no_main]

use ktlsd::fuzzing::{normalize_path, path_pattern, route_path};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (path, pattern) = text.split_once('\0').map_or((text, None), |(p, q)| (p, Some(q)));
    let files = normalize_path(path, true);
    let routed = route_path(path);
    match (&files, &routed) {
        (Ok((segments, trailing)), Some(r)) => {
            for s in segments {
                assert!(!s.is_empty() && s != b"." && s != b".." && !s.contains(&b'/') && !s.contains(&0), "{s:?}");
            }
            if let Ok(segments) = segments.iter().map(|s| std::str::from_utf8(s)).collect::<Result<Vec<_>, _>>() {
                let mut want = String::new();
                for s in &segments {
                    want.push('/');
                    want.push_str(s);
                }
                if *trailing || segments.is_empty() {
                    want.push('/');
                }
                assert_eq!(r, &want, "files and rules see different paths");
            }
        }
        (Err(_), None) => {}
        _ => panic!("files: {files:?}, rules: {routed:?}"),
    }
    match normalize_path(path, false) {
        Ok((segments, _)) => {
            assert_eq!(Ok(&segments), files.as_ref().map(|f| &f.0), "hiding dot-files changes nothing else");
            for (i, s) in segments.iter().enumerate() {
                assert!(s[0] != b'.' || (i == 0 && s == b".well-known"), "a dot-file: {s:?}");
            }
        }
        Err((status, _)) => assert!(files.is_err() || status == 404, "{status}"),
    }
    if let (Some(pattern), Some(r)) = (pattern, &routed) {
        if let Ok((matched, captured)) = path_pattern(pattern, r) {
            // A pattern without glob characters is an exact path, or a name at any depth.
            if !pattern.contains(['*', '?', '[', ']', '{', '}']) {
                match pattern.starts_with('/') {
                    true => assert_eq!(matched, pattern == r),
                    false => assert_eq!(matched, r.ends_with(&format!("/{pattern}"))),
                }
            }
            if let Some(c) = captured {
                assert!(matched && r.contains(&c));
            }
        }
    }
});
