//! The content section: per-site content-delivery options (`precompressed`,
//! `error_page`, `fallback`, `mime_types`, `headers`, `cors`) into a
//! [`crate::handler::Content`], with the site's location tree.
//!
//! The same function validates the top level (the default site) and each `[[site]]`;
//! which site's options these are is [`super::options::FileSite::site_options`]'s to say.

use std::collections::BTreeMap;

use super::options::{Entry, FileHeaderRule, SiteOptions};
use super::ConfigError;
use crate::handler::location::Locations;

/// Validates a site's content options; errors start with `which`. The site's
/// canonical host (`super::routing::canonical`) and location tree
/// (`super::location::locations`) are validated by their sections.
pub fn content(
    o: &SiteOptions,
    which: &str,
    canonical: Option<String>,
    locations: Locations,
) -> Result<crate::handler::Content, ConfigError> {
    let e = |msg: String| ConfigError::new(format!("{which}{msg}"));
    let precompressed = super::compress::codings(o.precompressed.as_ref(), "precompressed").map_err(e)?;
    let fallback = match &o.fallback {
        Some(p) => Some(local_path(p).map_err(|m| e(format!("fallback: {m}")))?),
        None => None,
    };
    let mut mime_types = Vec::new();
    for (ext, t) in table(&o.mime_types, "--mime-type", "EXT=TYPE, e.g. md=text/markdown")? {
        if !is_extension(&ext) {
            return Err(e(format!("mime_types {ext:?}: expected an extension without the dot, e.g. md")));
        }
        let (essence, _) = t.split_once(';').unwrap_or((&t, ""));
        let essence_ok = essence.trim().split_once('/').is_some_and(|(a, b)| is_token(a) && is_token(b));
        if !essence_ok || !t.bytes().all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic()) {
            return Err(e(format!(
                "mime_types {ext}: {t:?} is not a media type such as \"text/markdown; charset=utf-8\""
            )));
        }
        mime_types.push((ext.to_ascii_lowercase(), t.trim().to_string()));
    }
    let mut headers = Vec::new();
    for (i, r) in o.headers.iter().flatten().enumerate() {
        headers.push(r.as_file().and_then(|r| rule(r, &format!("headers {}: ", i + 1))).map_err(e)?);
    }
    let cors = match &o.cors {
        Some(c) => Some(crate::handler::rules::Cors::parse(&c.clone().into_list()).map_err(e)?),
        None => None,
    };
    let auth = (!locations.rules().auth.is_empty()).then(Default::default);
    Ok(crate::handler::Content { precompressed, fallback, mime_types, headers, cors, canonical, auth, locations })
}

/// The `error_page` entries: (status, path beneath ROOT); errors start with `which`.
pub fn error_pages(o: &SiteOptions, which: &str) -> Result<Vec<(u16, String)>, ConfigError> {
    let e = |msg: String| ConfigError::new(format!("{which}{msg}"));
    let mut error_pages = Vec::new();
    for (code, path) in table(&o.error_page, "--error-page", "CODE=PATH, e.g. 404=/404.html")? {
        let status = match code.trim().parse::<u16>() {
            Ok(s) if (400..600).contains(&s) => s,
            _ => return Err(e(format!("error_page {code:?}: expected a status code from 400 to 599"))),
        };
        error_pages.push((status, local_path(&path).map_err(|m| e(format!("error_page {code}: {m}")))?));
    }
    Ok(error_pages)
}

/// A table option's entries by key (a later command-line entry replaces an earlier one);
/// a command-line entry without `=` is refused naming `flag` and its `form`.
fn table(entries: &Option<Vec<Entry>>, flag: &str, form: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    for entry in entries.iter().flatten() {
        let (k, v) = match entry {
            Entry::Pair(k, v) => (k.as_str(), v.as_str()),
            Entry::Flag(item) => {
                item.split_once('=').ok_or_else(|| ConfigError::new(format!("{flag} {item:?}: expected {form}")))?
            }
        };
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// One `[[headers]]` block; errors start with `which_rule`.
fn rule(r: FileHeaderRule, which_rule: &str) -> Result<crate::handler::rules::HeaderRule, String> {
    use crate::handler::rules::{parse_duration, HeaderRule, PathMatch};
    let paths = match (r.path, r.extensions) {
        (Some(p), None) => PathMatch::Pattern(crate::handler::pattern::PathPattern::new(&p).map_err(|why| format!("{which_rule}{why}"))?),
        (None, Some(exts)) if !exts.is_empty() => {
            if let Some(bad) = exts.iter().find(|x| !is_extension(x)) {
                return Err(format!("{which_rule}extension {bad:?}: expected one without the dot, e.g. css"));
            }
            PathMatch::Extensions(exts.iter().map(|x| x.to_ascii_lowercase()).collect())
        }
        _ => {
            return Err(format!(
                "{which_rule}give path (a glob such as \"/assets/**\") or extensions (a list such as [\"css\", \"js\"]), one of them"
            ))
        }
    };
    let expires = match r.expires {
        Some(d) => Some(parse_duration(&d).map_err(|m| format!("{which_rule}expires: {m}"))?),
        None => None,
    };
    let set = r.set.unwrap_or_default().into_iter().collect();
    let add = r.add.unwrap_or_default().into_iter().collect();
    HeaderRule::new(paths, set, add, expires).map_err(|m| format!("{which_rule}{m}"))
}

/// A file extension without the dot.
fn is_extension(x: &str) -> bool {
    !x.is_empty() && x.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_+".contains(&b))
}

/// An HTTP token (RFC 9110 section 5.6.2): a header name, a media type's parts.
fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A path beneath ROOT as a request would name it: absolute, no query, no `..`.
fn local_path(p: &str) -> Result<String, String> {
    let ok = p.starts_with('/')
        && !p.contains(['?', '#'])
        && !p.split('/').any(|s| s == "..")
        && p.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(p.to_string())
    } else {
        Err(format!(
            "{p:?} is not a path beneath the root such as /404.html (absolute, printable, no `..`, `?` or `#`)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::options::{HeaderRule, List, Options};
    use super::*;

    #[test]
    fn content_options() {
        let flags = |v: &[&str]| Some(v.iter().map(|s| Entry::Flag(s.to_string())).collect::<Vec<_>>());
        let base = SiteOptions::default;
        let table: Vec<(SiteOptions, Result<(), &str>)> = vec![
            (base(), Ok(())),
            (SiteOptions { precompressed: Some(List(vec!["br".into(), "none".into()])), ..base() }, Ok(())),
            (SiteOptions { precompressed: Some(List(vec!["lz4".into()])), ..base() }, Err("precompressed \"lz4\"")),
            (SiteOptions { error_page: flags(&["404"]), ..base() }, Err("--error-page \"404\": expected CODE=PATH")),
            (SiteOptions { error_page: flags(&["200=/x"]), ..base() }, Err("error_page \"200\": expected a status")),
            (SiteOptions { error_page: flags(&["404=x"]), ..base() }, Err("error_page 404: \"x\" is not a path")),
            (SiteOptions { fallback: Some("/a?b".into()), ..base() }, Err("fallback: \"/a?b\"")),
            (SiteOptions { mime_types: flags(&["md"]), ..base() }, Err("--mime-type \"md\": expected EXT=TYPE")),
            (SiteOptions { mime_types: flags(&[".md=text/x"]), ..base() }, Err("mime_types \".md\"")),
            (SiteOptions { mime_types: flags(&["md=text"]), ..base() }, Err("is not a media type")),
            (SiteOptions { headers: Some(vec![HeaderRule::Flag("x".into())]), ..base() }, Err("--header \"x\"")),
            (
                SiteOptions { headers: Some(vec![HeaderRule::File(FileHeaderRule::default())]), ..base() },
                Err("headers 1: give path"),
            ),
        ];
        for (o, want) in table {
            let checked = error_pages(&o, "site 1: ").and_then(|_| content(&o, "site 1: ", None, Locations::default()));
            match (checked, want) {
                (Ok(_), Ok(())) => {}
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{o:?}: {e}"),
                (Ok(_), Err(w)) => panic!("{o:?}: accepted, want {w:?}"),
                (Err(e), Ok(())) => panic!("{o:?}: {e}"),
            }
        }
        // The top level's options are the default site's.
        let o = Options { fallback: Some("/index.html".into()), ..Default::default() };
        let c = content(&o.site_options(), "", None, Locations::default());
        assert_eq!(c.map(|c| c.fallback).ok(), Some(Some("/index.html".into())));
    }
}
