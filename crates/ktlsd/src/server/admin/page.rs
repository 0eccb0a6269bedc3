//! The status page: one HTML document, its script and its style sheet, built into
//! the binary (`include_str!`) and served by the admin listener at `/`,
//! `/status.js` and `/status.css`. The script fetches `/status.json` every second
//! and builds the page with DOM calls (`textContent`, never HTML from data) and
//! hand-written SVG charts; nothing is fetched from elsewhere, and the
//! Content-Security-Policy forbids it. Not the document (`super::document`).

use super::Reply;

/// One embedded file.
pub struct Asset {
    ctype: &'static str,
    body: &'static str,
}

const INDEX: Asset = Asset { ctype: "text/html; charset=utf-8", body: include_str!("page/index.html") };
const SCRIPT: Asset = Asset { ctype: "text/javascript; charset=utf-8", body: include_str!("page/status.js") };
const STYLE: Asset = Asset { ctype: "text/css; charset=utf-8", body: include_str!("page/status.css") };

/// The policy of the page: its own script, style and JSON; nothing else, no framing.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The asset served at `path`, if any.
pub fn asset(path: &str) -> Option<&'static Asset> {
    match path {
        "/" | "/index.html" => Some(&INDEX),
        "/status.js" => Some(&SCRIPT),
        "/status.css" => Some(&STYLE),
        _ => None,
    }
}

/// The answer that serves `asset`.
pub fn reply(asset: &'static Asset) -> Reply {
    Reply::new("200 OK", asset.ctype, asset.body)
        .header("Content-Security-Policy", POLICY.into())
        .header("X-Frame-Options", "DENY".into())
        .header("Referrer-Policy", "no-referrer".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assets_are_self_contained() {
        for a in [&INDEX, &SCRIPT, &STYLE] {
            // The SVG namespace is a name, not a fetch.
            let body = a.body.replace("http://www.w3.org/2000/svg", "");
            assert!(!body.contains("http://") && !body.contains("https://") && !body.contains("//cdn"), "{body}");
        }
        // Data reaches the DOM as text only.
        assert!(!SCRIPT.body.contains("innerHTML"), "the script builds the DOM with textContent");
        assert!(!SCRIPT.body.contains("insertAdjacentHTML") && !SCRIPT.body.contains("document.write"));
        assert!(asset("/").is_some() && asset("/status.js").is_some() && asset("/nope").is_none());
    }
}
