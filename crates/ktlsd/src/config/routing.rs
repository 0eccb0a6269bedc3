//! The routing section: `canonical`, `[[redirect]]`, `try_files`, `[[access]]`,
//! `rate_limit` (per site) and `max_connections_per_ip` (global), as written
//! ([`FileRedirect`], [`FileAccess`], [`FileRateLimit`]) and validated for the
//! site's location tree (through [`super::location`]) with its patterns compiled
//! and its rate-limit table allocated.
//!
//! Every refusal says what to write instead: a status other than 301, 302, 307 or
//! 308; a `to` that is neither a path nor an http(s) URL, climbs with `..`, or uses
//! `{*}` without a `*` to fill it; a redirect whose target another (or the same)
//! rule would redirect again; a bad address or CIDR range; a zero rate. Which phase
//! does what with them is `handler`'s.

use std::sync::Arc;

use super::options::{Options, SiteOptions};
use super::tables::{FileAccess, FileRateLimit, FileRedirect};
use super::ConfigError;
use crate::handler::access::{AccessRule, Addresses};
use crate::handler::limit::{Limiter, SLOTS};
use crate::handler::pattern::{route_path, PathPattern, GLOB_CHARS};
use crate::handler::redirect::Redirect;
use crate::handler::Status;

/// A site's canonical host: its own (it is not inherited from the top level: each
/// site has its own names), one of `names`, the site's exact names (`None` for the
/// default site); errors start with `which`.
pub fn canonical(
    canonical: Option<&str>,
    names: Option<&[String]>,
    which: &str,
) -> Result<Option<String>, ConfigError> {
    canonical.map(|c| check_canonical(c, names)).transpose().map_err(|m| ConfigError::new(format!("{which}{m}")))
}

/// What a site's routing gives its location tree: `[[redirect]]` and `[[access]]`
/// rules in order, the site's rate limit and its `try_files` candidates.
pub type PathRules = (Vec<Redirect>, Vec<AccessRule>, Option<Arc<Limiter>>, Vec<String>);

/// Validates one site's routing options that apply by path; errors start with `which`.
pub fn path_rules(o: &SiteOptions, which: &str) -> Result<PathRules, ConfigError> {
    let e = |msg: String| ConfigError::new(format!("{which}{msg}"));
    let mut redirects = Vec::new();
    for (i, r) in o.redirect.iter().flatten().enumerate() {
        redirects.push(redirect(r).map_err(|m| e(format!("redirect {}: {m}", i + 1)))?);
    }
    check_loops(&redirects).map_err(e)?;
    let mut access = Vec::new();
    for (i, a) in o.access.iter().flatten().enumerate() {
        access.push(access_rule(a).map_err(|m| e(format!("access {}: {m}", i + 1)))?);
    }
    let limiter = o.rate_limit.as_ref().map(rate_limit).transpose().map_err(|m| e(format!("rate_limit: {m}")))?;
    let try_files = match &o.try_files {
        Some(list) => try_files(list).map_err(e)?,
        None => Vec::new(),
    };
    Ok((redirects, access, limiter, try_files))
}

/// `max_connections_per_ip`: at least 1 when given.
pub fn max_connections_per_ip(o: &Options) -> Result<Option<std::num::NonZeroU32>, ConfigError> {
    match o.max_connections_per_ip {
        None => Ok(None),
        Some(n) => std::num::NonZeroU32::new(n)
            .map(Some)
            .ok_or_else(|| ConfigError::new("max_connections_per_ip 0: give at least 1, or leave it out for the default (a quarter of the server's connections)")),
    }
}

fn check_canonical(c: &str, names: Option<&[String]>) -> Result<String, String> {
    let host = c.trim().trim_end_matches('.').to_ascii_lowercase();
    if !crate::names::is_dns_name(&host) {
        return Err(format!("canonical {c:?}: expected a host name such as example.com (no scheme, port or path)"));
    }
    match names {
        Some(names) if !names.iter().any(|n| n.eq_ignore_ascii_case(&host)) => Err(format!(
            "canonical {host}: not one of this site's names, so its redirect would leave the site; add it to names"
        )),
        _ => Ok(host),
    }
}

fn redirect(r: &FileRedirect) -> Result<Redirect, String> {
    let path = PathPattern::new(&r.path)?;
    let status = match r.status.unwrap_or(301) {
        s @ (301 | 302 | 307 | 308) => Status(s),
        s => return Err(format!("status {s}: expected 301, 302, 307 or 308")),
    };
    let to = r.to.trim();
    let local = to.starts_with('/') && !to.starts_with("//") && !to.starts_with("/\\");
    let absolute = ["https://", "http://"]
        .iter()
        .find_map(|s| to.strip_prefix(s))
        .filter(|rest| rest.split('/').next().is_some_and(|host| !host.is_empty() && !host.contains(['{', '}'])));
    if (!local && absolute.is_none()) || !to.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "to {to:?}: expected a path beneath the site such as /new/{{*}} or an http(s):// URL with its host written out"
        ));
    }
    if to.replace("{*}", "").contains(['{', '}']) {
        return Err(format!("to {to:?}: {{*}} is the only placeholder (what the path's * matched)"));
    }
    let captures = r.path.matches('*').count() == 1 && !r.path.replace('*', "").contains(GLOB_CHARS);
    if to.contains("{*}") && !captures {
        return Err(format!(
            "to {to:?} uses {{*}}, but path {:?} has no single * to fill it: write the path as /old/* (one *, no other glob characters)",
            r.path
        ));
    }
    let to_path = to.split(['?', '#']).next().unwrap_or(to);
    if to_path.split('/').any(|s| s == ".." || s.eq_ignore_ascii_case("%2e%2e")) {
        return Err(format!("to {to:?}: climbs with ..; name the target path as it is"));
    }
    Ok(Redirect { path, to: to.to_string(), status })
}

/// Refuses a rule whose local `to` another rule (or itself) matches: the client
/// would be sent round again, forever for `/a/*` -> `/a/b/{*}`.
fn check_loops(rules: &[Redirect]) -> Result<(), String> {
    for (i, r) in rules.iter().enumerate() {
        if !r.to.starts_with('/') {
            continue;
        }
        let to_path = r.to.split(['?', '#']).next().unwrap_or(&r.to);
        for sample in ["x", "", "x/y.html"] {
            let Some(target) = route_path(&to_path.replace("{*}", sample)) else { continue };
            if let Some((j, other)) = rules.iter().enumerate().find(|(_, o)| o.path.matches(&target)) {
                return Err(format!(
                    "redirect {}: to {:?} is matched by redirect {}'s path {:?}, so requests would be redirected again (a loop or a chain); redirect straight to the final address",
                    i + 1,
                    r.to,
                    j + 1,
                    other.path.as_str()
                ));
            }
        }
    }
    Ok(())
}

fn access_rule(a: &FileAccess) -> Result<AccessRule, String> {
    let path = a.path.as_deref().map(PathPattern::new).transpose()?;
    let mut rules = Vec::new();
    for (allow, list) in &a.lists {
        let allow = *allow;
        for item in list {
            let addresses =
                Addresses::parse(item).map_err(|m| format!("{}: {m}", if allow { "allow" } else { "deny" }))?;
            rules.push((allow, addresses));
        }
    }
    if rules.is_empty() {
        return Err("give allow or deny, lists of addresses, CIDR ranges or \"all\" (e.g. allow = [\"10.0.0.0/8\"], deny = [\"all\"])".into());
    }
    Ok(AccessRule { path, rules })
}

pub(super) fn rate_limit(r: &FileRateLimit) -> Result<Arc<Limiter>, String> {
    if r.requests == 0 {
        return Err(
            "requests = 0: give at least 1 (to refuse every request, use an [[access]] block with deny = [\"all\"])"
                .into(),
        );
    }
    let per =
        crate::handler::rules::parse_duration(r.per.as_deref().unwrap_or("1s")).map_err(|m| format!("per: {m}"))?;
    if per.is_zero() {
        return Err("per = \"0s\": give a period of at least 1s, such as \"1s\" or \"1m\"".into());
    }
    let burst = r.burst.unwrap_or(r.requests);
    if burst == 0 {
        return Err("burst = 0: give at least 1 (the requests a client may send at once)".into());
    }
    Ok(Arc::new(Limiter::new(r.requests, per, burst, SLOTS)))
}

/// A `try_files` list, each candidate checked ([`try_file`]).
pub(super) fn try_files(list: &super::options::List) -> Result<Vec<String>, String> {
    list.0.iter().map(|c| try_file(c)).collect()
}

/// A `try_files` candidate: `{path}` and a literal absolute path around it.
fn try_file(c: &str) -> Result<String, String> {
    let literal = c.replace("{path}", "/x");
    let ok = (c.starts_with('/') || c.starts_with("{path}"))
        && !literal.contains(['{', '}', '?', '#', '%', '\\'])
        && literal.bytes().all(|b| b.is_ascii_graphic())
        && !literal.split('/').any(|s| s == ".." || s == ".");
    if ok {
        Ok(c.to_string())
    } else {
        Err(format!(
            "try_files {c:?}: expected {{path}} with a suffix or prefix, or a path beneath the root, such as \"{{path}}.html\", \"{{path}}/index.html\" or \"/index.html\" (no .., ?, # or %)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::options::List;
    use super::*;

    fn redirects(rules: &[(&str, &str, Option<u16>)]) -> SiteOptions {
        let rules = rules.iter().map(|(p, t, s)| FileRedirect { path: p.to_string(), to: t.to_string(), status: *s });
        SiteOptions { redirect: Some(rules.collect()), ..Default::default() }
    }

    fn access(path: Option<&str>, allow: Option<&[&str]>, deny: Option<&[&str]>) -> SiteOptions {
        let list = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        let lists = [(true, allow), (false, deny)].into_iter().filter_map(|(a, l)| Some((a, list(l?)))).collect();
        let block = FileAccess { path: path.map(String::from), lists };
        SiteOptions { access: Some(vec![block]), ..Default::default() }
    }

    fn limit(requests: u32, per: Option<&str>, burst: Option<u32>) -> SiteOptions {
        let r = FileRateLimit { requests, per: per.map(String::from), burst };
        SiteOptions { rate_limit: Some(r), ..Default::default() }
    }

    fn try_files(list: &[&str]) -> SiteOptions {
        SiteOptions { try_files: Some(List(list.iter().map(|s| s.to_string()).collect())), ..Default::default() }
    }

    #[test]
    fn routing_options() {
        let table: Vec<(SiteOptions, Result<(), &str>)> = vec![
            (SiteOptions::default(), Ok(())),
            (redirects(&[("/old", "/new", None), ("/blog/*", "/posts/{*}", Some(308))]), Ok(())),
            (redirects(&[("/x/*", "https://example.com/{*}", Some(302))]), Ok(())),
            (redirects(&[("/x", "/y", Some(303))]), Err("redirect 1: status 303: expected 301, 302, 307 or 308")),
            (redirects(&[("/x", "/y", Some(200))]), Err("status 200")),
            (redirects(&[("/x", "new", None)]), Err("redirect 1: to \"new\": expected a path")),
            (redirects(&[("/x", "//evil.example/", None)]), Err("to \"//evil.example/\"")),
            (redirects(&[("/x", "ftp://a/", None)]), Err("to \"ftp://a/\"")),
            (redirects(&[("/x/*", "https://{*}", None)]), Err("host written out")),
            (redirects(&[("/x", "/y {*}", None)]), Err("expected a path")),
            (redirects(&[("/x", "/y/{*}", None)]), Err("has no single * to fill it")),
            (redirects(&[("/x/*/*", "/y/{*}", None)]), Err("has no single *")),
            (redirects(&[("/x/[ab]*", "/y/{*}", None)]), Err("has no single *")),
            (redirects(&[("/x/*", "/y/{path}", None)]), Err("{*} is the only placeholder")),
            (redirects(&[("/x/*", "/y/../../{*}", None)]), Err("climbs with ..")),
            (redirects(&[("/x/*", "/y/%2e%2e/{*}", None)]), Err("climbs with ..")),
            (redirects(&[("x", "/y", None)]), Ok(())),
            (redirects(&[("/x y", "/y", None)]), Err("redirect 1: path \"/x y\"")),
            (redirects(&[("/a/../b", "/y", None)]), Err("without . or .. segments")),
            (redirects(&[("/a[", "/y", None)]), Err("is not a glob")),
            // Loops: a target that a rule would redirect again.
            (redirects(&[("/a/*", "/a/b/{*}", None)]), Err("redirect 1: to \"/a/b/{*}\" is matched by redirect 1's")),
            (redirects(&[("/*", "/new/{*}", None)]), Err("is matched by redirect 1's path")),
            (
                redirects(&[("/a", "/b", None), ("/b", "/a", None)]),
                Err("redirect 1: to \"/b\" is matched by redirect 2"),
            ),
            (redirects(&[("/a", "/a", None)]), Err("is matched by redirect 1")),
            (redirects(&[("/a", "/a?x=1", None)]), Err("is matched by redirect 1")),
            (access(Some("/admin/*"), Some(&["10.0.0.0/8", "::1"]), Some(&["all"])), Ok(())),
            (access(None, None, Some(&["192.0.2.1"])), Ok(())),
            (access(Some("/admin/*"), None, None), Err("access 1: give allow or deny")),
            (access(Some("/admin/*"), Some(&["10.0.0.0/33"]), None), Err("access 1: allow: \"10.0.0.0/33\" is not")),
            (access(Some("/admin/*"), None, Some(&["everyone"])), Err("access 1: deny: \"everyone\"")),
            (access(Some("admin"), Some(&["all"]), None), Ok(())),
            (access(Some(""), Some(&["all"]), None), Err("access 1: path \"\"")),
            (limit(20, Some("1s"), Some(40)), Ok(())),
            (limit(20, None, None), Ok(())),
            (limit(0, None, None), Err("rate_limit: requests = 0: give at least 1")),
            (limit(1, Some("0s"), None), Err("rate_limit: per = \"0s\"")),
            (limit(1, Some("fast"), None), Err("rate_limit: per: \"fast\" is not a duration")),
            (limit(1, None, Some(0)), Err("rate_limit: burst = 0")),
            (try_files(&["{path}", "{path}.html", "{path}/index.html", "/index.html"]), Ok(())),
            (try_files(&["{path}/../secret"]), Err("try_files \"{path}/../secret\"")),
            (try_files(&["../{path}"]), Err("try_files \"../{path}\"")),
            (try_files(&["{path}?x"]), Err("try_files \"{path}?x\"")),
            (try_files(&["{uri}"]), Err("try_files \"{uri}\"")),
            (try_files(&["{path}%2e%2e"]), Err("try_files")),
        ];
        for (o, want) in table {
            let shown = format!("{:?} {:?} {:?} {:?}", o.redirect, o.access, o.rate_limit, o.try_files);
            match (path_rules(&o, "site 1: "), want) {
                (Ok(_), Ok(())) => {}
                (Err(e), Err(w)) => {
                    assert!(e.to_string().contains(w), "{shown}: {e}");
                    assert!(e.to_string().starts_with("site 1: "), "{e}");
                }
                (Ok(_), Err(w)) => panic!("{shown}: accepted, want {w:?}"),
                (Err(e), Ok(())) => panic!("{shown}: {e}"),
            }
        }
    }

    #[test]
    fn canonical_hosts() {
        let names = ["example.com".to_string(), "www.example.com".to_string()];
        for (c, names, want) in [
            ("example.com", Some(&names[..]), Ok("example.com")),
            ("Example.COM.", Some(&names[..]), Ok("example.com")),
            ("other.example", Some(&names[..]), Err("not one of this site's names")),
            ("other.example", None, Ok("other.example")),
            ("https://example.com", None, Err("expected a host name")),
            ("example.com:443", None, Err("expected a host name")),
            ("", None, Err("expected a host name")),
        ] {
            match (check_canonical(c, names), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, w),
                (Err(e), Err(w)) => assert!(e.contains(w), "{c}: {e}"),
                (got, want) => panic!("{c}: {got:?}, want {want:?}"),
            }
        }
        assert!(max_connections_per_ip(&Options { max_connections_per_ip: Some(0), ..Default::default() }).is_err());
        assert_eq!(
            max_connections_per_ip(&Options { max_connections_per_ip: Some(4), ..Default::default() }).unwrap(),
            std::num::NonZeroU32::new(4)
        );
    }

    /// The order of `allow` and `deny` in the file is the order they are checked in.
    #[test]
    fn access_order_follows_the_file() {
        for (text, first_allows) in [
            ("[[access]]\npath = \"/a/*\"\nallow = [\"all\"]\ndeny = [\"10.0.0.1\"]\n", true),
            ("[[access]]\npath = \"/a/*\"\ndeny = [\"10.0.0.1\"]\nallow = [\"all\"]\n", false),
        ] {
            let o: Options = toml::from_str(text).unwrap();
            let (_, access, _, _) = path_rules(&o.site_options(), "").unwrap();
            assert_eq!(access[0].rules[0].0, first_allows, "{text}");
        }
    }
}
