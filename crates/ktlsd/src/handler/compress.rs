//! On-the-fly compression of a static answer: whether a file may be compressed
//! (its type in [`compressible`], its size between the site's bounds), which coding
//! a request gets (Accept-Encoding's qualities, then the site's order, as for
//! precompressed variants), and the validators of the variant sent: the original's
//! entity tag with the coding inside its quotes (weakness kept) and the original's
//! modification time, so that conditional and range requests work per variant.
//!
//! The bodies come from the compressed-body store ([`crate::files::compress`]),
//! where they are sent from by `sendfile`. A body not yet stored is made off the
//! event loop: a codec that can wait calls [`prepare`] before [`super::handle`],
//! so the first answer is compressed too; otherwise the answer goes out as it is
//! and the body is made for the next request. Precompressed variants win: this is
//! asked only when none was found.
//!
//! It reads no socket and compresses nothing itself.

use std::time::SystemTime;

use super::request::{AcceptEncoding, Coding, EntityTag, Request};
use super::Site;
use crate::files::compress::{self as store, Stored};
use crate::files::{self, Found, Resolved};

/// Media types compressed on the fly, besides every `text/*` and every
/// `+json`/`+xml` structured suffix. Types that are compressed already (images
/// other than SVG and icons, audio, video, fonts in WOFF, archives) are absent.
pub const COMPRESSIBLE: &[&str] = &[
    "application/javascript",
    "application/x-javascript",
    "application/ecmascript",
    "application/json",
    "application/xml",
    "application/wasm",
    "application/toml",
    "application/yaml",
    "application/x-yaml",
    "application/x-sh",
    "application/rtf",
    "application/postscript",
    "application/vnd.ms-fontobject",
    "font/ttf",
    "font/otf",
    "font/collection",
    "image/svg+xml",
    "image/x-icon",
    "image/vnd.microsoft.icon",
    "image/bmp",
];

/// Whether a Content-Type (parameters and case ignored) is one compressed on the fly.
pub fn compressible(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence.starts_with("text/")
        || essence.ends_with("+json")
        || essence.ends_with("+xml")
        || COMPRESSIBLE.contains(&essence.as_str())
}

/// The suffix a coding adds inside an entity tag's quotes.
fn tag_suffix(coding: Coding) -> &'static str {
    match coding {
        Coding::Zstd => "-zstd",
        Coding::Br => "-br",
        Coding::Gzip => "-gz",
    }
}

/// The entity tag of `tag`'s representation compressed in `coding`: the suffix
/// inside the quotes, weakness kept (`W/"a"` -> `W/"a-gz"`).
pub fn variant_tag(tag: &EntityTag, coding: Coding) -> EntityTag {
    let opaque = match tag.opaque.strip_suffix('"') {
        Some(inner) => format!("{inner}{}\"", tag_suffix(coding)),
        None => format!("{}{}", tag.opaque, tag_suffix(coding)),
    };
    EntityTag { weak: tag.weak, opaque }
}

impl Policy {
    /// Whether answers for a file of this type and size depend on Accept-Encoding.
    pub fn applies(&self, content_type: &str, size: u64) -> bool {
        (self.min_size..=self.max_size).contains(&size) && compressible(content_type)
    }
}

/// What a file's answer is sent as.
pub struct Chosen {
    /// The file sent: the original or its stored compressed body.
    pub found: Found,
    pub coding: Option<Coding>,
    pub etag: EntityTag,
    pub modified: SystemTime,
    /// Whether the answer depends on Accept-Encoding (`Vary`).
    pub varies: bool,
}

/// What `req` gets for `found` (no precompressed variant of it was chosen): its
/// stored compressed body in the coding the client accepts best, or the file as
/// it is. A body not yet stored is started, for later requests, when it can be.
pub fn choose(req: &Request, site: &Site<'_>, content_type: &str, found: Found) -> Chosen {
    let policy = site.at.compress;
    let etag = EntityTag::strong(files::etag(&found.meta));
    let modified = files::modified(&found.meta);
    let Some(policy) = policy.filter(|p| p.applies(content_type, found.meta.len())) else {
        return Chosen { found, coding: None, etag, modified, varies: false };
    };
    let mut chosen = Chosen { found, coding: None, etag, modified, varies: true };
    let Some(store) = store::store() else { return chosen };
    // Only the client's best coding: a worse one stored already is not sent in its stead.
    let Some(coding) = candidates(&policy.codings, req.headers.accept_encoding.as_ref()).first().copied() else {
        return chosen;
    };
    match store.get(&chosen.found, coding.token(), site.files.cache_entries) {
        Stored::Body(body) => {
            chosen.etag = variant_tag(&chosen.etag, coding);
            chosen.found = body;
            chosen.coding = Some(coding);
        }
        Stored::Original => {}
        Stored::Missing => {
            // Made for the next request; this one is not kept waiting.
            let _ = store.start(&chosen.found, coding.token());
        }
    }
    chosen
}

/// Makes, off the event loop, the compressed body [`super::handle`] would send
/// for `req` when it is not stored yet, and waits for it (with no store, no
/// compression for the site, or nothing to compress, it returns at once). Only
/// the requested path is looked at: a fallback or an error page is not waited for.
///
/// # Cancel safety
/// Cancel-safe: a compression started goes on and is stored for the next request.
pub async fn prepare(req: &Request, site: &Site<'_>) {
    let Some(policy) = site.at.compress else { return };
    let Some(store) = store::store() else { return };
    if !req.method.is_served() {
        return;
    }
    let Some(coding) = candidates(&policy.codings, req.headers.accept_encoding.as_ref()).first().copied() else {
        return;
    };
    let Ok(Resolved::File(found)) = files::resolve(site.root, &req.path, site.files) else { return };
    let content_type = site.content.content_type(&found.rel, found.mime);
    if !policy.applies(&content_type, found.meta.len()) || super::has_precompressed(req, site, &found.rel) {
        return;
    }
    // Nothing starts when the body is stored (or known not worth it) already.
    if let Some(waiter) = store.start(&found, coding.token()) {
        waiter.done().await;
    }
}

/// A site's on-the-fly compression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The codings offered, in the server's order of preference (it breaks ties
    /// between equal client qualities); never empty.
    pub codings: Vec<Coding>,
    /// Smaller files go out as they are: the coding's own framing and the
    /// Content-Encoding field would eat what little is saved.
    pub min_size: u64,
    /// Larger files go out as they are, so that one request cannot hold a
    /// compressor for long.
    pub max_size: u64,
}

/// The codings to try, best first: those the client accepts (quality above 0),
/// by its quality, then by the server's order. When the client names identity, a
/// coding it ranks lower is not sent; without Accept-Encoding no coding is sent
/// (a client that says nothing may not decode).
pub fn candidates(configured: &[Coding], accept: Option<&AcceptEncoding>) -> Vec<Coding> {
    let Some(accept) = accept else { return Vec::new() };
    let identity = accept.listed("identity").unwrap_or(0);
    let mut ranked: Vec<(u16, usize, Coding)> = configured
        .iter()
        .enumerate()
        .map(|(i, c)| (accept.quality(c.token()), i, *c))
        .filter(|(q, _, _)| *q > 0 && *q >= identity)
        .collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked.into_iter().map(|(_, _, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use Coding::*;

    #[test]
    fn compressible_types() {
        for (t, want) in [
            ("text/html; charset=utf-8", true),
            ("text/css", true),
            ("TEXT/Plain", true),
            ("text/javascript; charset=utf-8", true),
            ("application/json; charset=utf-8", true),
            ("application/ld+json", true),
            ("application/manifest+json", true),
            ("application/atom+xml", true),
            ("application/wasm", true),
            ("image/svg+xml", true),
            ("font/ttf", true),
            ("image/png", false),
            ("image/jpeg", false),
            ("image/webp", false),
            ("font/woff2", false),
            ("application/zip", false),
            ("application/gzip", false),
            ("application/octet-stream", false),
            ("video/mp4", false),
            ("", false),
        ] {
            assert_eq!(compressible(t), want, "{t}");
        }
    }

    #[test]
    fn sizes_within_bounds() {
        let p = Policy { codings: vec![Zstd], min_size: 1024, max_size: 4096 };
        for (size, want) in [(0, false), (1023, false), (1024, true), (4096, true), (4097, false)] {
            assert_eq!(p.applies("text/css", size), want, "{size}");
        }
        assert!(!p.applies("image/png", 2048));
    }

    #[test]
    fn variant_tags_keep_weakness() {
        for (weak, opaque, coding, want) in [
            (false, "\"5f-1a\"", Zstd, "\"5f-1a-zstd\""),
            (false, "\"5f-1a\"", Br, "\"5f-1a-br\""),
            (false, "\"5f-1a\"", Gzip, "\"5f-1a-gz\""),
            (true, "\"x\"", Gzip, "W/\"x-gz\""),
            (false, "\"\"", Br, "\"-br\""),
        ] {
            let t = variant_tag(&EntityTag { weak, opaque: opaque.into() }, coding);
            assert_eq!(t.to_string(), want);
            assert_eq!(t.weak, weak);
        }
        let strong = EntityTag::strong("\"a\"".into());
        assert!(!variant_tag(&strong, Zstd).weak_eq(&variant_tag(&strong, Br)), "each coding its own tag");
        assert!(!variant_tag(&strong, Zstd).weak_eq(&strong));
    }

    #[test]
    fn negotiation_follows_qualities_then_the_server_order() {
        let ours = [Zstd, Br, Gzip];
        for (accept, want) in [
            (Some("gzip, deflate, br, zstd"), Some(Zstd)),
            (Some("gzip, br"), Some(Br)),
            (Some("gzip;q=1, zstd;q=0.5"), Some(Gzip)),
            (Some("zstd;q=0, br;q=0, *"), Some(Gzip)),
            (Some("zstd;q=0, br;q=0, gzip;q=0"), None),
            (Some("*"), Some(Zstd)),
            (Some("*;q=0"), None),
            (Some("identity"), None),
            (Some("identity;q=1, gzip;q=0.5"), None),
            (Some("x-gzip"), Some(Gzip)),
            (Some("deflate"), None),
            (None, None),
        ] {
            let accept = accept.map(AcceptEncoding::parse);
            assert_eq!(candidates(&ours, accept.as_ref()).first().copied(), want, "{accept:?}");
        }
    }

    #[test]
    fn candidates_follow_qualities_then_server_order() {
        let all = [Br, Zstd, Gzip];
        for (configured, accept, want) in [
            (&all[..], Some("gzip, deflate, br, zstd"), vec![Br, Zstd, Gzip]),
            (&all[..], Some("gzip, deflate"), vec![Gzip]),
            (&all[..], Some("gzip;q=1, br;q=0.5"), vec![Gzip, Br]),
            (&all[..], Some("br;q=0, *"), vec![Zstd, Gzip]),
            (&all[..], Some("*;q=0.2"), vec![Br, Zstd, Gzip]),
            (&all[..], Some("identity"), vec![]),
            (&all[..], Some(""), vec![]),
            (&all[..], None, vec![]),
            // Identity preferred over every coding: send the file as it is.
            (&all[..], Some("identity;q=1, gzip;q=0.5"), vec![]),
            (&all[..], Some("identity;q=0.5, gzip;q=0.5"), vec![Gzip]),
            (&all[..], Some("gzip;q=0.5"), vec![Gzip]),
            (&[Gzip, Br][..], Some("br, gzip"), vec![Gzip, Br]),
            (&[][..], Some("br, gzip"), vec![]),
        ] {
            let accept = accept.map(AcceptEncoding::parse);
            assert_eq!(candidates(configured, accept.as_ref()), want, "{configured:?} {accept:?}");
        }
    }
}
