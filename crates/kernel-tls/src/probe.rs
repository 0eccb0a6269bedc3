//! Finding out what the running kernel's TLS implementation can do.
//!
//! [`probe`] tries the real operations on throw-away loopback TCP
//! connections — attach the ULP, install TX and RX keys for every
//! version × cipher, replace keys (TLS 1.3 key update), read the record-size
//! cap option — and reports the outcome as [`Capabilities`]. Trying is the
//! only reliable test: version numbers lie (backports, distribution
//! patches), and kernel crypto modules may be missing.
//!
//! The probe never panics and takes a few milliseconds (each step is a
//! `setsockopt` on a local socket). Dummy keys never leave the machine: no
//! data is sent on the probe connections. It blocks while it runs (local
//! connects and, when the ULP is missing, [`diagnose`](crate::diagnose)'s
//! file reads), so it belongs at start-up, not on the per-connection path.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rustls::SupportedCipherSuite;

use crate::crypto_info::CryptoInfo;
use crate::diagnose::{diagnose, Unavailable};
use crate::error::Error;
use crate::types::{Cipher, TlsVersion};
use crate::ulp::enable_ulp;
use crate::{keys, sys};

/// TX/RX support of one protocol version × cipher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuiteSupport {
    /// Protocol version.
    pub version: TlsVersion,
    /// Cipher.
    pub cipher: Cipher,
    /// The kernel accepted TX keys.
    pub tx: bool,
    /// The kernel accepted RX keys.
    pub rx: bool,
    /// Why TX failed, if it did.
    pub tx_error: Option<String>,
    /// Why RX failed, if it did.
    pub rx_error: Option<String>,
}

/// Whether keys can be replaced on a live connection (TLS 1.3 KeyUpdate).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RekeySupport {
    /// The test could run (TLS 1.3 AES-128-GCM TX and RX were installable).
    pub tested: bool,
    /// A second `TLS_TX` succeeded.
    pub tx: bool,
    /// A second `TLS_RX` succeeded.
    pub rx: bool,
    /// Why it failed or could not be tested.
    pub detail: Option<String>,
}

/// What the running kernel's TLS offers. Produced by [`probe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// `uname -r`.
    pub kernel_release: Option<String>,
    /// Why kTLS cannot be used at all, or `None` if the ULP attaches.
    pub unavailable: Option<Unavailable>,
    /// One entry per version × cipher (empty if unavailable).
    pub suites: Vec<SuiteSupport>,
    /// Key-update support.
    pub rekey: RekeySupport,
    /// `Some(current cap)` if the kernel knows `TLS_TX_MAX_PAYLOAD_LEN`
    /// (record size limit, RFC 8449), `None` if not.
    pub tx_max_payload_len: Option<u16>,
    /// How long the probe took.
    pub elapsed: Duration,
}

impl Capabilities {
    /// True if the ULP attaches and at least one version × cipher works in
    /// both directions.
    pub fn usable(&self) -> bool {
        self.unavailable.is_none() && self.suites.iter().any(|s| s.tx && s.rx)
    }

    /// `(tx, rx)` support for a version and cipher.
    pub fn supports(&self, version: TlsVersion, cipher: Cipher) -> (bool, bool) {
        self.suites.iter().find(|s| s.version == version && s.cipher == cipher).map_or((false, false), |s| (s.tx, s.rx))
    }

    /// `(tx, rx)` support for a rustls cipher suite.
    pub fn supports_suite(&self, suite: SupportedCipherSuite) -> (bool, bool) {
        let version = TlsVersion::from_rustls(suite.version().version);
        match (version, Cipher::for_suite(suite.suite())) {
            (Some(v), Some(c)) => self.supports(v, c),
            _ => (false, false),
        }
    }

    /// True if TLS 1.3 keys can be replaced on a live socket.
    ///
    /// Judged by TX: the kernel gained TX and RX re-keying together (6.14).
    /// The probe's RX re-key happens without a preceding `KeyUpdate`
    /// record, which a kernel could in principle refuse, so a failed RX
    /// probe alone is reported in [`RekeySupport`] but not held against it.
    pub fn rekey_supported(&self) -> bool {
        self.rekey.tx
    }

    /// True if the kernel can cap record sizes (`TLS_TX_MAX_PAYLOAD_LEN`).
    pub fn record_size_cap(&self) -> bool {
        self.tx_max_payload_len.is_some()
    }
}

/// Probes the running kernel. Never panics; see the module docs.
pub fn probe() -> Capabilities {
    let start = Instant::now();
    let mut caps = Capabilities {
        kernel_release: sys::kernel_release(),
        unavailable: None,
        suites: Vec::new(),
        rekey: RekeySupport::default(),
        tx_max_payload_len: None,
        elapsed: Duration::ZERO,
    };
    if let Err(u) = probe_into(&mut caps) {
        caps.unavailable = Some(u);
    }
    caps.elapsed = start.elapsed();
    caps
}

fn probe_into(caps: &mut Capabilities) -> Result<(), Unavailable> {
    let listener = Loopback::new().map_err(|e| Unavailable::Other {
        detail: format!("cannot create a loopback TCP connection to probe with: {e}"),
    })?;
    let other =
        |e: io::Error| Unavailable::Other { detail: format!("loopback TCP connection for probing failed: {e}") };

    // 1. Can the ULP attach at all?
    let (client, _server) = listener.pair().map_err(other)?;
    match enable_ulp(&client) {
        Ok(()) => {}
        // Only here, once, is the system examined for the cause.
        Err(Error::UlpMissing) => return Err(diagnose()),
        Err(Error::UlpDenied(e)) => return Err(Unavailable::Denied { detail: e.to_string() }),
        Err(Error::UlpUnsupported(e)) => return Err(Unavailable::UnsupportedSocket { detail: e.to_string() }),
        Err(e) => return Err(Unavailable::Other { detail: e.to_string() }),
    }
    // 2. Record-size cap: a getsockopt that only kernels with the option know.
    caps.tx_max_payload_len = keys::tx_max_payload_len(&client).ok();

    // 3. Every version × cipher, TX on one end and RX on the other.
    for version in TlsVersion::ALL {
        for cipher in Cipher::ALL {
            let mut s = SuiteSupport { version, cipher, tx: false, rx: false, tx_error: None, rx_error: None };
            match listener.pair() {
                Ok((a, b)) => {
                    match try_install(&a, version, cipher, Install::Tx) {
                        Ok(()) => s.tx = true,
                        Err(e) => s.tx_error = Some(e),
                    }
                    match try_install(&b, version, cipher, Install::Rx) {
                        Ok(()) => s.rx = true,
                        Err(e) => s.rx_error = Some(e),
                    }
                }
                Err(e) => {
                    s.tx_error = Some(e.to_string());
                    s.rx_error = Some(e.to_string());
                }
            }
            caps.suites.push(s);
        }
    }

    // 4. Key update: TX and RX installed, then replaced.
    caps.rekey = probe_rekey(&listener);
    Ok(())
}

#[derive(Clone, Copy)]
enum Install {
    Tx,
    Rx,
}

fn dummy(version: TlsVersion, cipher: Cipher, fill: u8) -> Result<CryptoInfo, String> {
    let key = [fill; 32];
    CryptoInfo::from_parts(version, cipher, &key[..cipher.key_len()], &[fill ^ 0x5a; 12], 0).map_err(|e| e.to_string())
}

fn try_install(sock: &TcpStream, version: TlsVersion, cipher: Cipher, dir: Install) -> Result<(), String> {
    enable_ulp(sock).map_err(|e| e.to_string())?;
    let info = dummy(version, cipher, 0x42)?;
    match dir {
        Install::Tx => keys::set_tx(sock, &info),
        Install::Rx => keys::set_rx(sock, &info),
    }
    .map_err(|e| e.to_string())
}

fn probe_rekey(listener: &Loopback) -> RekeySupport {
    let mut r = RekeySupport::default();
    let (v, c) = (TlsVersion::Tls13, Cipher::Aes128Gcm);
    // Both ends stay open: the ULP only attaches to an ESTABLISHED socket,
    // and a dropped peer would leave `sock` in CLOSE_WAIT.
    let (sock, _peer) = match listener.pair() {
        Ok(pair) => pair,
        Err(e) => {
            r.detail = Some(format!("loopback TCP connection failed: {e}"));
            return r;
        }
    };
    let initial = try_install(&sock, v, c, Install::Tx).and_then(|()| {
        let info = dummy(v, c, 0x42)?;
        keys::set_rx(&sock, &info).map_err(|e| e.to_string())
    });
    if let Err(e) = initial {
        r.detail = Some(format!("TLS1.3 AES-128-GCM keys could not be installed: {e}"));
        return r;
    }
    r.tested = true;
    let mut problems = Vec::new();
    match dummy(v, c, 0x43).and_then(|i| keys::update_tx(&sock, &i).map_err(|e| e.to_string())) {
        Ok(()) => r.tx = true,
        Err(e) => problems.push(e),
    }
    match dummy(v, c, 0x44).and_then(|i| keys::update_rx(&sock, &i).map_err(|e| e.to_string())) {
        Ok(()) => r.rx = true,
        Err(e) => problems.push(e),
    }
    if !problems.is_empty() {
        r.detail = Some(problems.join("; "));
    }
    r
}

/// A loopback listener that hands out connected TCP pairs.
struct Loopback {
    listener: TcpListener,
    addr: SocketAddr,
}

impl Loopback {
    fn new() -> io::Result<Self> {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).or_else(|_| TcpListener::bind((Ipv6Addr::LOCALHOST, 0)))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        Ok(Loopback { listener, addr })
    }

    /// A connected (client, server) pair.
    ///
    /// The limits are seconds, not milliseconds: a lossy qdisc on `lo` (netem)
    /// can drop a SYN or the final ACK, and TCP retransmits those after 1 s.
    fn pair(&self) -> io::Result<(TcpStream, TcpStream)> {
        const LIMIT: Duration = Duration::from_secs(5);
        let client = TcpStream::connect_timeout(&self.addr, LIMIT)?;
        let client_addr = client.local_addr()?;
        // The connection is normally already queued; poll if not.
        let deadline = Instant::now() + LIMIT;
        while Instant::now() < deadline {
            match self.listener.accept() {
                Ok((server, peer)) if peer == client_addr => return Ok((client, server)),
                // A stray connection from someone else: drop it.
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_micros(500)),
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, "loopback accept timed out"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_is_quick_and_consistent() {
        let caps = probe();
        assert!(caps.elapsed < Duration::from_secs(2), "{:?}", caps.elapsed);
        assert!(caps.kernel_release.is_some());
        match &caps.unavailable {
            Some(u) => {
                assert!(!caps.usable());
                assert!(caps.suites.is_empty());
                assert!(!u.reason().is_empty() && !u.advice().is_empty());
            }
            None => {
                assert_eq!(caps.suites.len(), 6);
                // Any kernel with kTLS has TLS 1.2 AES-128-GCM TX.
                assert!(caps.supports(TlsVersion::Tls12, Cipher::Aes128Gcm).0);
            }
        }
    }

    /// This development host's kernel is built without CONFIG_TLS; the
    /// probe must say so. Runs only where `tls` is absent from the ULP list
    /// (kTLS kernels, e.g. the VM suite, skip it).
    #[test]
    fn host_without_ktls_reports_why() {
        let ulps = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp").unwrap_or_default();
        if ulps.split_whitespace().any(|u| u == "tls") {
            return;
        }
        let caps = probe();
        let u = caps.unavailable.clone().expect("kTLS must be reported unavailable");
        let text = u.to_string();
        assert!(text.contains("CONFIG_TLS") || text.contains("modprobe tls"), "{text}");
        assert!(!caps.usable());
        assert!(!caps.rekey_supported());
        eprintln!("probe: {text} ({:?})", caps.elapsed);
    }
}
