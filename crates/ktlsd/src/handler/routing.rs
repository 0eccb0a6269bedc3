//! A site's routing: what each request phase before the static answer needs,
//! compiled once at configuration load. The phases live in their own modules and
//! run in the order [`super::handle`] names: [`super::canonical`],
//! [`super::redirect`], [`super::access`], [`super::limit`], then the static
//! answer with [`super::try_files`]. Nothing here runs a phase.

use std::sync::Arc;

use super::access::AccessRule;
use super::limit::Limiter;
use super::redirect::Redirect;

/// One site's routing: what each phase before the static answer needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    /// The host every other name of the site is redirected to (301), lower-case.
    pub canonical: Option<String>,
    /// `[[redirect]]` rules, in order: the first match wins.
    pub redirects: Vec<Redirect>,
    /// `[[access]]` blocks, in order: the first whose path matches decides.
    pub access: Vec<AccessRule>,
    /// The per-client-address request rate limit, shared by all workers.
    pub limiter: Option<Arc<Limiter>>,
    /// `try_files` candidates, each with `{path}` standing for the request path.
    pub try_files: Vec<String>,
}

impl Routing {
    /// No routing: every request goes straight to the static answer.
    pub const NONE: Routing =
        Routing { canonical: None, redirects: Vec::new(), access: Vec::new(), limiter: None, try_files: Vec::new() };
}
