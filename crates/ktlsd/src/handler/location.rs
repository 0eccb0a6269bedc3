//! A site's location tree: every rule that applies by path (`[[redirect]]`,
//! `[[access]]`, `[[auth]]`, `[[proxy]]`, and the `[[location]]` blocks that give
//! per-path values of `rate_limit`, `max_body_bytes`, `compress`, `error_page` and
//! `try_files`), compiled once at configuration load and matched once per request,
//! on the normalised path ([`super::pattern::route_path`]), into a [`Route`].
//!
//! Every pattern is of the one dialect of [`PathPattern`]. Within each kind of rule
//! the first that matches, in the file's order, decides (as before: nginx's and
//! Caddy's first-match lists). Among `[[location]]` blocks, each value comes from the
//! most specific block that sets it: an exact path, then the longest literal prefix
//! (`/api/v2/*` over `/api/*` over `*.json`), the earlier block on a tie; a value no
//! matching block sets is the site's.
//!
//! The tree is a trie of the patterns' literal leading segments: a request visits
//! only the patterns whose literal part lies on its path (a site with a hundred
//! `[[proxy]]` prefixes tests the few under the request's directories), then tests
//! each of those whole. It runs no phase and does no I/O: what the phases do with a
//! [`Route`] is theirs ([`super::guard`], the [`super::pipeline`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::access::AccessRule;
use super::auth;
use super::compress::Policy;
use super::limit::Limiter;
use super::pattern::PathPattern;
use super::proxy::Rule as ProxyRule;
use super::redirect::Redirect;

/// A `[[location]]` block, validated: its path and the values it sets (`None`:
/// the site's, or a less specific block's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub path: PathPattern,
    /// Its own per-client-address rate limit (its own table: a client's requests
    /// here do not count against the site's limit).
    pub rate_limit: Option<Arc<Limiter>>,
    pub max_body_bytes: Option<u64>,
    /// `Some(None)`: compression off here.
    pub compress: Option<Option<Policy>>,
    pub error_pages: Option<Vec<(u16, String)>>,
    pub try_files: Option<Vec<String>>,
}

/// The rules a site applies by path, as the file gives them, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    pub redirects: Vec<Redirect>,
    pub access: Vec<AccessRule>,
    pub auth: Vec<auth::Rule>,
    pub proxy: Vec<Arc<ProxyRule>>,
    pub blocks: Vec<Block>,
}

/// What the site itself sets, where no `[[location]]` block says otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SiteWide {
    pub rate_limit: Option<Arc<Limiter>>,
    pub compress: Option<Policy>,
    pub error_pages: Vec<(u16, String)>,
    pub try_files: Vec<String>,
}

/// A site's rules by path, compiled ([`Locations::new`]) into the tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Locations {
    rules: Rules,
    site: SiteWide,
    tree: Node,
    /// Each entry: what it is, in the order [`Locations::new`] numbered them (by
    /// kind, then as written), so that sorting entry numbers sorts each kind by file order.
    entries: Vec<Target>,
}

/// One node of the trie: the entries whose literal segments end here, and the next
/// segments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Node {
    here: Vec<u32>,
    next: BTreeMap<Box<str>, Node>,
}

/// An entry of the tree: which rule, by its index in its list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Redirect(usize),
    Access(usize),
    Auth(usize),
    Proxy(usize),
    Block(usize),
}

/// What applies to one request path: the first rule of each kind that matches, and
/// the per-path values.
#[derive(Debug, Clone, Copy)]
pub struct Route<'a> {
    pub redirect: Option<&'a Redirect>,
    pub access: Option<&'a AccessRule>,
    pub auth: Option<&'a auth::Rule>,
    pub proxy: Option<&'a Arc<ProxyRule>>,
    pub at: PerPath<'a>,
}

/// The values that may differ by path, resolved for one request (the site's where no
/// block sets them).
#[derive(Debug, Clone, Copy)]
pub struct PerPath<'a> {
    pub limiter: Option<&'a Limiter>,
    /// `None`: the server's `max_body_bytes`.
    pub max_body_bytes: Option<u64>,
    pub compress: Option<&'a Policy>,
    pub error_pages: &'a [(u16, String)],
    pub try_files: &'a [String],
}

impl Locations {
    /// No rules, no values: every path is served as the site serves it by default.
    #[cfg(test)]
    pub const EMPTY: Locations = Locations {
        rules: Rules {
            redirects: Vec::new(),
            access: Vec::new(),
            auth: Vec::new(),
            proxy: Vec::new(),
            blocks: Vec::new(),
        },
        site: SiteWide { rate_limit: None, compress: None, error_pages: Vec::new(), try_files: Vec::new() },
        tree: Node { here: Vec::new(), next: BTreeMap::new() },
        entries: Vec::new(),
    };

    /// Compiles `rules` into the tree, over the site's own values `site`.
    pub fn new(rules: Rules, site: SiteWide) -> Locations {
        let mut out = Locations { tree: Node::default(), entries: Vec::new(), rules: Rules::default(), site };
        let paths: Vec<(Option<&PathPattern>, Target)> = (rules.redirects.iter().enumerate())
            .map(|(i, r)| (Some(&r.path), Target::Redirect(i)))
            .chain(rules.access.iter().enumerate().map(|(i, a)| (a.path.as_ref(), Target::Access(i))))
            .chain(rules.auth.iter().enumerate().map(|(i, a)| (Some(&a.path), Target::Auth(i))))
            .chain(rules.proxy.iter().enumerate().map(|(i, p)| (Some(&p.path), Target::Proxy(i))))
            .chain(rules.blocks.iter().enumerate().map(|(i, b)| (Some(&b.path), Target::Block(i))))
            .collect();
        for (id, (pattern, target)) in paths.into_iter().enumerate() {
            let mut node = &mut out.tree;
            // An `[[access]]` block without a path covers every path: it sits at the root.
            for seg in pattern.map(PathPattern::literal_segments).into_iter().flatten() {
                node = node.next.entry(seg.into()).or_default();
            }
            node.here.push(id as u32);
            out.entries.push(target);
        }
        out.rules = rules;
        out
    }

    /// The rules as given.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The site's own values.
    #[cfg(test)]
    pub fn site(&self) -> &SiteWide {
        &self.site
    }

    /// The values of a path no block covers: the site's own.
    pub fn site_wide(&self) -> PerPath<'_> {
        PerPath {
            limiter: self.site.rate_limit.as_deref(),
            max_body_bytes: None,
            compress: self.site.compress.as_ref(),
            error_pages: &self.site.error_pages,
            try_files: &self.site.try_files,
        }
    }

    /// Whether any rule or block matches by path: without one, every path gets the
    /// site's values and the request path need not be normalised for matching.
    pub fn matches_paths(&self) -> bool {
        !self.entries.is_empty()
    }

    /// Whether any rule forwards (for the proxy's start-up).
    pub fn forwards(&self) -> bool {
        !self.rules.proxy.is_empty()
    }

    /// Whether any path is compressed on the fly (for the compressed bodies' store).
    pub fn compresses(&self) -> bool {
        self.site.compress.is_some() || self.rules.blocks.iter().any(|b| matches!(b.compress, Some(Some(_))))
    }

    /// What applies to the normalised request path `path`; `None` for a path that
    /// cannot be normalised (which the static answer refuses): no rule matches it,
    /// except that it falls under the first `[[auth]]` rule, so that no spelling walks
    /// around one.
    pub fn find(&self, path: Option<&str>) -> Route<'_> {
        let mut route = Route { redirect: None, access: None, auth: None, proxy: None, at: self.site_wide() };
        let Some(path) = path else {
            route.auth = self.rules.auth.first();
            return route;
        };
        // The rules filed along the path: a handful, kept off the heap.
        let mut candidates: smallvec::SmallVec<[u32; 16]> = smallvec::SmallVec::new();
        let mut node = &self.tree;
        candidates.extend_from_slice(&node.here);
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            let Some(next) = node.next.get(seg) else { break };
            node = next;
            candidates.extend_from_slice(&node.here);
        }
        candidates.sort_unstable();
        // The most specific block seen so far for each value: (specificity, block).
        let mut best: [Option<(usize, &Block)>; 5] = [None; 5];
        for id in candidates {
            let target = self.entries[id as usize];
            let r = &self.rules;
            match target {
                Target::Redirect(i) if route.redirect.is_none() && r.redirects[i].path.matches(path) => {
                    route.redirect = Some(&r.redirects[i]);
                }
                Target::Access(i)
                    if route.access.is_none() && r.access[i].path.as_ref().is_none_or(|p| p.matches(path)) =>
                {
                    route.access = Some(&r.access[i]);
                }
                Target::Auth(i) if route.auth.is_none() && r.auth[i].path.matches(path) => {
                    route.auth = Some(&r.auth[i]);
                }
                Target::Proxy(i) if route.proxy.is_none() && r.proxy[i].path.matches(path) => {
                    route.proxy = Some(&r.proxy[i]);
                }
                Target::Block(i) if r.blocks[i].path.matches(path) => {
                    let b = &r.blocks[i];
                    let sets = [
                        b.rate_limit.is_some(),
                        b.max_body_bytes.is_some(),
                        b.compress.is_some(),
                        b.error_pages.is_some(),
                        b.try_files.is_some(),
                    ];
                    let s = b.path.specificity();
                    for (slot, set) in best.iter_mut().zip(sets) {
                        if set && slot.is_none_or(|(t, _)| s > t) {
                            *slot = Some((s, b));
                        }
                    }
                }
                _ => {}
            }
        }
        let [limit, body, compress, pages, try_files] = best.map(|b| b.map(|(_, b)| b));
        let at = &mut route.at;
        if let Some(b) = limit {
            at.limiter = b.rate_limit.as_deref();
        }
        at.max_body_bytes = body.and_then(|b| b.max_body_bytes);
        if let Some(c) = compress.and_then(|b| b.compress.as_ref()) {
            at.compress = c.as_ref();
        }
        if let Some(p) = pages.and_then(|b| b.error_pages.as_deref()) {
            at.error_pages = p;
        }
        if let Some(t) = try_files.and_then(|b| b.try_files.as_deref()) {
            at.try_files = t;
        }
        route
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::access::Addresses;
    use crate::handler::Status;

    fn pattern(p: &str) -> PathPattern {
        PathPattern::new(p).unwrap()
    }

    fn block(path: &str) -> Block {
        Block {
            path: pattern(path),
            rate_limit: None,
            max_body_bytes: None,
            compress: None,
            error_pages: None,
            try_files: None,
        }
    }

    fn redirect(path: &str, to: &str) -> Redirect {
        Redirect { path: pattern(path), to: to.into(), status: Status(301) }
    }

    fn locations() -> Locations {
        let rules = Rules {
            redirects: vec![redirect("/old/*", "/new/{*}"), redirect("/old/x", "/never")],
            access: vec![
                AccessRule { path: Some(pattern("/admin/*")), rules: vec![(false, Addresses::All)] },
                AccessRule { path: None, rules: vec![(true, Addresses::All)] },
            ],
            auth: Vec::new(),
            proxy: Vec::new(),
            blocks: vec![
                Block { max_body_bytes: Some(1), try_files: Some(vec!["{path}.json".into()]), ..block("*.json") },
                Block { max_body_bytes: Some(2), ..block("/api/*") },
                Block { max_body_bytes: Some(3), ..block("/api/v2/*") },
                Block { max_body_bytes: Some(4), ..block("/api/v2/exact") },
                Block { error_pages: Some(vec![(404, "/api.html".into())]), ..block("/api/**") },
            ],
        };
        let site = SiteWide { try_files: vec!["{path}.html".into()], ..SiteWide::default() };
        Locations::new(rules, site)
    }

    #[test]
    fn each_kind_takes_its_first_match_and_blocks_the_most_specific() {
        let l = locations();
        for (path, redirect, admin, body, try_files, pages) in [
            ("/", None, false, None, "{path}.html", 0),
            ("/old/x", Some("/new/{*}"), false, None, "{path}.html", 0),
            ("/old", Some("/new/{*}"), false, None, "{path}.html", 0),
            ("/admin/", None, true, None, "{path}.html", 0),
            ("/admin", None, true, None, "{path}.html", 0),
            ("/administrator", None, false, None, "{path}.html", 0),
            ("/x/y.json", None, false, Some(1), "{path}.json", 0),
            ("/api/x", None, false, Some(2), "{path}.html", 1),
            ("/api/a/b/c", None, false, Some(2), "{path}.html", 1),
            ("/api/v2/x", None, false, Some(3), "{path}.html", 1),
            ("/api/v2/x.json", None, false, Some(3), "{path}.json", 1),
            ("/api/v2/exact", None, false, Some(4), "{path}.html", 1),
            ("/api", None, false, Some(2), "{path}.html", 1),
            ("/apiary", None, false, None, "{path}.html", 0),
        ] {
            let r = l.find(Some(path));
            assert_eq!(r.redirect.map(|r| r.to.as_str()), redirect, "{path}");
            let denied = r.access.is_some_and(|a| a.path.is_some());
            assert_eq!(denied, admin, "{path}");
            assert!(r.access.is_some(), "{path}: the pathless block covers the rest");
            assert_eq!(r.at.max_body_bytes, body, "{path}");
            assert_eq!(r.at.try_files, [try_files.to_string()], "{path}");
            assert_eq!(r.at.error_pages.len(), pages, "{path}");
        }
    }

    #[test]
    fn a_path_that_cannot_be_normalised_matches_nothing_but_the_first_auth_rule() {
        let l = locations();
        let r = l.find(None);
        assert!(r.redirect.is_none() && r.access.is_none() && r.proxy.is_none() && r.auth.is_none());
        assert_eq!(r.at.try_files, ["{path}.html".to_string()]);
    }

    #[test]
    fn the_tree_visits_only_the_patterns_on_the_path() {
        let blocks = (0..200).map(|i| Block { max_body_bytes: Some(i), ..block(&format!("/p{i}/*")) }).collect();
        let l = Locations::new(Rules { blocks, ..Rules::default() }, SiteWide::default());
        assert_eq!(l.tree.next.len(), 200);
        assert!(l.tree.here.is_empty());
        assert_eq!(l.find(Some("/p137/x/y")).at.max_body_bytes, Some(137));
        assert_eq!(l.find(Some("/p1370/x")).at.max_body_bytes, None);
    }
}
