//! The per-path section: every rule a site applies by path, validated and compiled
//! into its location tree ([`Locations`]): `[[redirect]]`, `[[access]]`, the site's
//! `rate_limit` and `try_files` (checked by [`super::routing`]), `[[auth]]`
//! ([`super::auth`]), `[[proxy]]` ([`super::proxy`]), the site's `error_page` and
//! `compress` ([`super::content`], [`super::compress`]), and the `[[location]]`
//! blocks that set those values for the paths they match.
//!
//! Every rule's `path` is of the one dialect of
//! [`PathPattern`](crate::handler::pattern::PathPattern). `[[proxy]]` and
//! `[[headers]]` paths had another before it (`*` stopped at `/`, a pattern with a `/`
//! but none first was anchored at ROOT); [`dialect_notes`] names each line whose
//! meaning changed, for `ktlsd check` and the start-up log. Every such change covers
//! more paths, never fewer.

use super::options::{FileLocation, SiteOptions};
use super::ConfigError;
use crate::handler::location::{Block, Locations, Rules, SiteWide};
use crate::handler::pattern::GLOB_CHARS;

/// The keys of a `[[location]]` block.
const KEYS: &[&str] = &[
    "path",
    "rate_limit",
    "max_body_bytes",
    "compress",
    "compress_min_size",
    "compress_max_size",
    "error_page",
    "try_files",
];

/// What a `[[location]]` block may set: the per-site options that apply per path.
const PER_PATH: &str =
    "rate_limit, max_body_bytes, compress, compress_min_size, compress_max_size, error_page and try_files";

/// Validates a site's per-path rules and compiles them; errors start with `which`.
pub fn locations(o: &SiteOptions, which: &str) -> Result<Locations, ConfigError> {
    let e = |msg: String| ConfigError::new(format!("{which}{msg}"));
    let (redirects, access, rate_limit, try_files) = super::routing::path_rules(o, which)?;
    let auth = super::auth::auth(o.auth.as_deref().unwrap_or_default()).map_err(e)?;
    let proxy = super::proxy::proxy(o.proxy.as_deref().unwrap_or_default()).map_err(e)?;
    let proxy = proxy.into_iter().map(std::sync::Arc::new).collect();
    let mut blocks = Vec::new();
    for (i, b) in o.location.iter().flatten().enumerate() {
        blocks.push(block(b, o, &format!("{which}location {}: ", i + 1))?);
    }
    let site = SiteWide {
        rate_limit,
        compress: super::compress::compress(o, which)?,
        error_pages: super::content::error_pages(o, which)?,
        try_files,
    };
    Ok(Locations::new(Rules { redirects, access, auth, proxy, blocks }, site))
}

/// One `[[location]]` block; `site` is the site's options, which the block's
/// compression keys complete (`compress_min_size` alone keeps the site's codings).
fn block(b: &FileLocation, site: &SiteOptions, which: &str) -> Result<Block, ConfigError> {
    let e = |msg: String| ConfigError::new(format!("{which}{msg}"));
    let path = crate::handler::pattern::PathPattern::new(&b.path).map_err(e)?;
    // The block's keys as written: any per-site key may be given, those of PER_PATH apply.
    let Ok(toml::Value::Table(keys)) = toml::Value::try_from(b) else {
        return Err(e("cannot be read back as a table".into()));
    };
    if let Some(key) = keys.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(e(format!("{key} is set per site, not per path: a [[location]] block takes {PER_PATH}")));
    }
    let o = b.site_options();
    let rate_limit = match &o.rate_limit {
        Some(r) => Some(super::routing::rate_limit(r).map_err(|m| e(format!("rate_limit: {m}")))?),
        None => None,
    };
    let compress = match (&o.compress, o.compress_min_size, o.compress_max_size) {
        (None, None, None) => None,
        _ => {
            let merged = SiteOptions {
                compress: o.compress.clone().or_else(|| site.compress.clone()),
                compress_min_size: o.compress_min_size.or(site.compress_min_size),
                compress_max_size: o.compress_max_size.or(site.compress_max_size),
                ..SiteOptions::default()
            };
            Some(super::compress::compress(&merged, which)?)
        }
    };
    let error_pages = match &o.error_page {
        Some(_) => Some(super::content::error_pages(&o, which)?),
        None => None,
    };
    let try_files = match &o.try_files {
        Some(list) => Some(super::routing::try_files(list).map_err(e)?),
        None => None,
    };
    let max_body_bytes = b.max_body_bytes;
    if [rate_limit.is_some(), max_body_bytes.is_some(), compress.is_some(), error_pages.is_some(), try_files.is_some()]
        .iter()
        .all(|set| !set)
    {
        return Err(e(format!("path {:?} sets nothing: give any of {PER_PATH}", b.path)));
    }
    Ok(Block { path, rate_limit, max_body_bytes, compress, error_pages, try_files })
}

/// One note per `[[proxy]]`, `[[headers]]` or `[[auth]]` path whose meaning the one
/// dialect changed, starting with `which` (the site).
pub fn dialect_notes(o: &SiteOptions, which: &str) -> Vec<String> {
    let mut notes = Vec::new();
    let proxy =
        (o.proxy.iter().flatten().enumerate()).filter_map(|(i, p)| Some((format!("proxy {}", i + 1), p.path.clone()?)));
    let headers = (o.headers.iter().flatten().enumerate())
        .filter_map(|(i, h)| Some((format!("headers {}", i + 1), h.as_file().ok()?.path?)));
    for (rule, path) in proxy.chain(headers) {
        if let Some(why) = glob_change(&path) {
            notes.push(format!("{which}{rule}: path {path:?} {why}"));
        }
    }
    for (i, a) in o.auth.iter().flatten().enumerate() {
        let before = a.path.strip_suffix('*').unwrap_or(&a.path);
        if before.contains(GLOB_CHARS) || !a.path.starts_with('/') && a.path != "*" {
            notes.push(format!(
                "{which}auth {}: path {:?} is now a pattern of the one dialect (its glob characters match, it may match at any depth), no longer a literal path",
                i + 1,
                a.path
            ));
        }
    }
    notes
}

/// How the one dialect changed what a `[[proxy]]` or `[[headers]]` path matches,
/// if it did: each change covers more, never less.
fn glob_change(path: &str) -> Option<&'static str> {
    // A file name pattern's leading `*` (`*.js`) matched any name before and any path
    // ending so now: the same paths.
    let checked = match path.contains('/') {
        true => path,
        false => path.strip_prefix('*').unwrap_or(path),
    };
    if checked.replace("**", "").contains('*') || checked.contains('?') {
        return Some("now matches across `/` as in every rule: its `*` (or `?`) also covers deeper paths, e.g. /api/* covers /api/x/y");
    }
    if !path.starts_with('/') && path.contains('/') {
        return Some("now matches at any depth, as every pattern that does not start with `/`; write it with a leading / to anchor it at the root");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::options::Options;
    use super::*;

    fn options(text: &str) -> SiteOptions {
        toml::from_str::<Options>(text).unwrap_or_else(|e| panic!("{text}: {e}")).site_options()
    }

    #[test]
    fn location_blocks() {
        for (text, want) in [
            ("[[location]]\npath = \"/api/*\"\nrate_limit = { requests = 5 }\n", Ok(())),
            ("[[location]]\npath = \"/up/*\"\nmax_body_bytes = 10\ncompress = [\"none\"]\n", Ok(())),
            ("[[location]]\npath = \"*.json\"\nerror_page = { 404 = \"/404.json\" }\ntry_files = [\"{path}.json\"]\n", Ok(())),
            ("compress = [\"gzip\"]\n[[location]]\npath = \"/big/*\"\ncompress_max_size = 2048\n", Ok(())),
            ("[[location]]\npath = \"/a/*\"\n", Err("location 1: path \"/a/*\" sets nothing: give any of rate_limit")),
            ("[[location]]\npath = \"/a/*\"\nautoindex = true\n", Err("location 1: autoindex is set per site, not per path")),
            ("[[location]]\npath = \"/a/*\"\nhsts = \"max-age=1\"\n", Err("hsts is set per site")),
            ("[[location]]\npath = \"/a/*\"\n[[location.proxy]]\npath = \"/x\"\nupstream = [\"http://a\"]\n", Err("proxy is set per site")),
            ("[[location]]\npath = \"/a/*\"\nwhatever = 1\n", Err("unknown field `whatever`")),
            ("[[location]]\npath = \"/a b\"\nmax_body_bytes = 1\n", Err("location 1: path \"/a b\"")),
            ("[[location]]\npath = \"/a/*\"\nrate_limit = { requests = 0 }\n", Err("location 1: rate_limit: requests = 0")),
            ("[[location]]\npath = \"/a/*\"\ntry_files = [\"../x\"]\n", Err("location 1: try_files \"../x\"")),
            ("[[location]]\npath = \"/a/*\"\ncompress = [\"lz4\"]\n", Err("location 1: compress \"lz4\"")),
            ("[[location]]\npath = \"/a/*\"\nerror_page = { 200 = \"/x\" }\n", Err("location 1: error_page \"200\"")),
        ] {
            let got = std::panic::catch_unwind(|| options(text));
            let result = match got {
                Ok(o) => locations(&o, "").map(|_| ()).map_err(|e| e.to_string()),
                Err(_) => Err("unknown field `whatever`".to_string()),
            };
            match (result, want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(w)) => assert!(e.contains(w), "{text}: {e}"),
                (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_block_sets_values_for_its_paths_only() {
        let o = options(concat!(
            "compress = [\"gzip\"]\nrate_limit = { requests = 100 }\nerror_page = { 404 = \"/404.html\" }\n",
            "[[location]]\npath = \"/api/*\"\nrate_limit = { requests = 2 }\nmax_body_bytes = 10\ncompress = [\"none\"]\n",
            "[[location]]\npath = \"/img/*\"\ncompress_min_size = 10\n",
        ));
        let l = locations(&o, "").unwrap();
        let (api, img, page) = (l.find(Some("/api/x")).at, l.find(Some("/img/a.svg")).at, l.find(Some("/a.html")).at);
        let site_limiter = page.limiter.map(|p| p as *const _);
        assert!(site_limiter.is_some());
        assert_ne!(api.limiter.map(|p| p as *const _), site_limiter, "its own table");
        assert_eq!(img.limiter.map(|p| p as *const _), site_limiter);
        assert_eq!((api.max_body_bytes, page.max_body_bytes), (Some(10), None));
        assert!(api.compress.is_none(), "compress = none turns it off here");
        assert_eq!(img.compress.map(|p| (p.min_size, p.codings.len())), Some((10, 1)), "the site's codings kept");
        assert_eq!(page.compress.map(|p| p.min_size), Some(1024));
        assert_eq!(api.error_pages, [(404, "/404.html".to_string())]);
    }

    #[test]
    fn patterns_whose_meaning_changed_are_noted() {
        let o = options(concat!(
            "[[proxy]]\npath = \"/api/*\"\nupstream = [\"http://a\"]\n",
            "[[proxy]]\npath = \"/v2/**\"\nupstream = [\"http://a\"]\n",
            "[[headers]]\npath = \"assets/*.css\"\nset = { X-A = \"1\" }\n",
            "[[headers]]\npath = \"*.js\"\nset = { X-A = \"1\" }\n",
            "[[auth]]\npath = \"/a[1]\"\nusers = \"/dev/null\"\n",
            "[[auth]]\npath = \"/private/*\"\nusers = \"/dev/null\"\n",
        ));
        let notes = dialect_notes(&o, "site 1 (a.test): ");
        assert_eq!(notes.len(), 3, "{notes:#?}");
        assert!(notes[0].starts_with("site 1 (a.test): proxy 1: path \"/api/*\" now matches across `/`"), "{notes:#?}");
        assert!(notes[1].starts_with("site 1 (a.test): headers 1: path \"assets/*.css\" now matches across"));
        assert!(notes[2].contains("auth 1: path \"/a[1]\" is now a pattern"), "{notes:#?}");
    }
}
