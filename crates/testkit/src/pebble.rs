//! A real pebble ACME server (and pebble-challtestsrv as its DNS) on loopback for the
//! tests: `apt-get install pebble` provides both. Each instance has its own ports, its
//! own TLS certificate (from a CA made here, handed to the client as the directory's
//! CA) and stops when dropped. Validations go to 127.0.0.1 at the ports given; dns-01
//! records are set through pebble-challtestsrv's management API ([`Pebble::dns_management`]);
//! [`Options::eab`] makes pebble require External Account Binding.

use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Pebble {
    /// pebble-challtestsrv, then pebble.
    children: Vec<Child>,
    /// pebble's arguments, to start it again.
    pebble_args: Vec<String>,
    listen: u16,
    pub directory: String,
    pub ca: PathBuf,
    /// pebble-challtestsrv's DNS port (UDP).
    dns: u16,
    /// pebble-challtestsrv's management API (`POST /set-txt`, `/clear-txt`), on 127.0.0.1.
    pub dns_management: u16,
    _dir: tempfile::TempDir,
}

/// A port free now on 127.0.0.1 (TCP, and UDP when `udp`) and never handed out before
/// in this process, so two pebbles starting alongside never share one. Another socket
/// may still take it before pebble binds it: [`Pebble::start`] then retries.
pub fn free_port(udp: bool) -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = tcp.local_addr().expect("local address").port();
        let usable = !udp || UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if usable && GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

fn spawn(program: &str, args: &[String], envs: &[(&str, &str)], log: PathBuf) -> Child {
    let out = std::fs::File::create(&log).expect("log file");
    let err = out.try_clone().expect("log file");
    Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {program} ({e}): the ACME tests need pebble: apt-get install pebble (scripts/test installs it)")
        })
}

fn spawn_pebble(args: &[String], dir: &std::path::Path) -> Child {
    spawn("pebble", args, &[("PEBBLE_VA_NOSLEEP", "1"), ("PEBBLE_WFE_NONCEREJECT", "0")], dir.join("pebble.log"))
}

/// What a [`Pebble`] requires beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// External Account Binding keys (key id, base64url MAC key); when any, accounts must bind one.
    pub eab: Vec<(String, String)>,
}

impl Pebble {
    /// Starts pebble validating http-01 at 127.0.0.1:`http_port` and tls-alpn-01 at
    /// 127.0.0.1:`tls_port`; `validity` sets the issued certificates' lifetime.
    ///
    /// Its ports are picked free before the servers bind them, so a test running
    /// alongside may take one first: a start whose servers do not all come up is
    /// retried on new ports.
    pub fn start(http_port: u16, tls_port: u16, validity: Option<Duration>) -> Pebble {
        Pebble::start_with(http_port, tls_port, validity, &Options::default())
    }

    /// [`Pebble::start`] with `options`.
    pub fn start_with(http_port: u16, tls_port: u16, validity: Option<Duration>, options: &Options) -> Pebble {
        let mut last = String::new();
        for _ in 0..3 {
            match Pebble::try_start(http_port, tls_port, validity, options) {
                Ok(pebble) => return pebble,
                Err(why) => last = why,
            }
        }
        panic!("pebble did not start three times; the last time: {last}")
    }

    fn try_start(
        http_port: u16,
        tls_port: u16,
        validity: Option<Duration>,
        options: &Options,
    ) -> Result<Pebble, String> {
        let dir = tempfile::tempdir().expect("temporary directory");
        // The TLS certificate of pebble's own listener, from a CA of the test's.
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "ktlsd test CA for pebble");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().expect("key");
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("params")
            .signed_by(&leaf_key, &issuer)
            .expect("certificate");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_cert.pem()).expect("write CA");
        std::fs::write(dir.path().join("cert.pem"), leaf.pem()).expect("write certificate");
        std::fs::write(dir.path().join("key.pem"), leaf_key.serialize_pem()).expect("write key");

        let (listen, management, dns, dns_management) =
            (free_port(false), free_port(false), free_port(true), free_port(false));
        let mut config = serde_json::json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{listen}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": dir.path().join("cert.pem"),
            "privateKey": dir.path().join("key.pem"),
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": !options.eab.is_empty(),
        }});
        if !options.eab.is_empty() {
            let keys: serde_json::Map<String, serde_json::Value> =
                options.eab.iter().map(|(kid, key)| (kid.clone(), key.clone().into())).collect();
            config["pebble"]["externalAccountMACKeys"] = keys.into();
        }
        if let Some(v) = validity {
            config["pebble"]["certificateValidityPeriod"] = v.as_secs().into();
        }
        let config_path = dir.path().join("pebble.json");
        std::fs::write(&config_path, config.to_string()).expect("write config");

        let dns_addr = format!("127.0.0.1:{dns}");
        let mut children = Vec::new();
        // The DNS server answering every name with 127.0.0.1 (no AAAA, so validations
        // never go to ::1); its own challenge servers are off.
        children.push(spawn(
            "pebble-challtestsrv",
            &[
                "-http01",
                "",
                "-https01",
                "",
                "-tlsalpn01",
                "",
                "-dns01",
                &dns_addr,
                "-management",
                &format!("127.0.0.1:{dns_management}"),
                "-defaultIPv4",
                "127.0.0.1",
                "-defaultIPv6",
                "",
            ]
            .map(String::from),
            &[],
            dir.path().join("challtestsrv.log"),
        ));
        let pebble_args =
            vec!["-config".to_string(), config_path.display().to_string(), "-dnsserver".to_string(), dns_addr];
        children.push(spawn_pebble(&pebble_args, dir.path()));
        let directory = format!("https://127.0.0.1:{listen}/dir");
        let mut pebble = Pebble { children, pebble_args, listen, directory, ca, dns, dns_management, _dir: dir };
        pebble.wait_ready(&[listen, dns_management])?;
        Ok(pebble)
    }

    /// Stops pebble and starts it again on the same addresses: a CA that has forgotten
    /// every account and order (pebble keeps them in memory only).
    pub fn restart(&mut self) {
        if let Some(mut old) = self.children.pop() {
            let _ = old.kill();
            let _ = old.wait();
        }
        self.children.push(spawn_pebble(&self.pebble_args, self._dir.path()));
        if let Err(why) = self.wait_ready(&[self.listen]) {
            panic!("pebble did not start again: {why}");
        }
    }

    /// Waits until `ports` accept connections and the DNS server answers, then checks
    /// that no server has exited meanwhile (one that could not bind its port exits,
    /// while the connection went to whoever holds the port).
    fn wait_ready(&mut self, ports: &[u16]) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let check = |pebble: &mut Pebble, what: &str| -> Result<(), String> {
            for child in &mut pebble.children {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("a server exited at start-up ({status}); logs:\n{}", pebble.logs()));
                }
            }
            if Instant::now() > deadline {
                return Err(format!("{what} after 20 s; logs:\n{}", pebble.logs()));
            }
            Ok(())
        };
        for &port in ports {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                check(self, &format!("nothing listening on {port}"))?;
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // pebble resolves every name through this server; its UDP side may come up
        // after its management port.
        while !dns_answers(self.dns) {
            check(self, &format!("no DNS answer on udp/{}", self.dns))?;
        }
        // A server that lost its port to another process exits within moments.
        std::thread::sleep(Duration::from_millis(200));
        check(self, "servers not settled")
    }

    /// Both servers' output, for failure messages.
    pub fn logs(&self) -> String {
        ["challtestsrv.log", "pebble.log"]
            .iter()
            .map(|f| std::fs::read_to_string(self._dir.path().join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Whether a DNS server on 127.0.0.1:`port` answers an A query within 200 ms.
fn dns_answers(port: u16) -> bool {
    // ID 0x6b74, recursion desired, one question: probe.invalid. A IN.
    const QUERY: &[u8] = b"\x6b\x74\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05probe\x07invalid\x00\x00\x01\x00\x01";
    let Ok(socket) = UdpSocket::bind("127.0.0.1:0") else { return false };
    let mut answer = [0u8; 512];
    socket.set_read_timeout(Some(Duration::from_millis(200))).is_ok()
        && socket.send_to(QUERY, ("127.0.0.1", port)).is_ok()
        && matches!(socket.recv(&mut answer), Ok(n) if n >= 2 && answer[..2] == QUERY[..2])
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
