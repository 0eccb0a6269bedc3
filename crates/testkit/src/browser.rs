//! Headless Chromium for the browser tests, and what their pages are made of.

use std::path::Path;
use std::process::{Command, Stdio};

/// A 1x1 transparent GIF.
pub const GIF: &[u8] = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;";

/// The Chromium command installed here; panics when there is none (scripts/test installs Debian's).
pub fn chromium() -> &'static str {
    ["chromium", "chromium-browser"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
        .unwrap_or_else(|| panic!("chromium is not installed (scripts/test installs Debian's chromium)"))
}

/// Headless Chromium as every browser test runs it, its profile in `profile`: no
/// sandbox, GPU, first-run or background traffic, `/tmp` rather than a container's
/// small `/dev/shm`, the tests' self-signed certificates taken, no stdin. The test
/// adds what it asks for (`--dump-dom URL`, `--screenshot`, a virtual time budget).
pub fn headless_chromium(profile: &Path) -> Command {
    let mut c = Command::new(chromium());
    c.stdin(Stdio::null()).args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--ignore-certificate-errors",
        "--no-first-run",
        "--disable-background-networking",
    ]);
    c.arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// `b` with a page, `/index.html`, of 50 subresources (20 images, 15 scripts, 15 style
/// sheets) that, once loaded, writes into its `#result` paragraph what loaded, what
/// failed, how many scripts ran, how many resources came over `protocol` (Resource
/// Timing's `nextHopProtocol`) and the page's own protocol:
/// `loaded=50 failed=0 scripts=15 h2=50 page=h2`.
pub fn subresource_page(mut b: crate::ServerBuilder, protocol: &str) -> crate::ServerBuilder {
    let mut tags = String::new();
    for i in 0..20 {
        b = b.file(&format!("img/{i}.gif"), GIF);
        tags += &format!("<img src=\"/img/{i}.gif\" onload=\"ok()\" onerror=\"bad()\">\n");
    }
    for i in 0..15 {
        b = b.file(
            &format!("js/{i}.js"),
            format!("window.scripts = (window.scripts || 0) + 1; // {}\n", "x".repeat(i * 500)),
        );
        tags += &format!("<script src=\"/js/{i}.js\" onload=\"ok()\" onerror=\"bad()\"></script>\n");
    }
    for i in 0..15 {
        b = b.file(&format!("css/{i}.css"), format!(".c{i} {{ color: #{i:06x}; }}\n"));
        tags += &format!("<link rel=\"stylesheet\" href=\"/css/{i}.css\" onload=\"ok()\" onerror=\"bad()\">\n");
    }
    let page = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\">\n<script>\n\
         var loaded = 0, failed = 0;\n\
         function ok() {{ loaded++; }}\n\
         function bad() {{ failed++; }}\n\
         window.addEventListener('load', function () {{\n\
           var n = performance.getEntriesByType('resource').filter(function (e) {{ return e.nextHopProtocol === '{protocol}'; }}).length;\n\
           var page = performance.getEntriesByType('navigation')[0].nextHopProtocol;\n\
           document.getElementById('result').textContent = 'loaded=' + loaded + ' failed=' + failed + ' scripts=' + window.scripts + ' {protocol}=' + n + ' page=' + page;\n\
         }});\n\
         </script>\n{tags}</head><body><p id=\"result\">pending</p></body></html>\n"
    );
    b.file("index.html", page)
}
