//! h3client: an HTTP/3 load client on quinn for `bench/run h3`.
//!
//!   h3client ADDR URL --conns C --requests N [--streams S]   C connections, N requests each, S at once
//!   h3client ADDR URL --download                              one request, the body counted and discarded
//!
//! Prints one line of JSON: requests, bytes, seconds, the datagrams the client received and
//! sent, and the ACK frames it sent. Receives with UDP GRO (quinn-udp asks for it). The
//! server's certificate is not checked: this is a load generator for a server the bench
//! started itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Buf;

#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    addr: SocketAddr,
    url: http::Uri,
    conns: usize,
    requests: usize,
    streams: usize,
    download: bool,
}

fn args() -> Result<Args, Error> {
    let mut it = std::env::args().skip(1);
    let addr =
        it.next().ok_or("usage: h3client ADDR URL [--conns C --requests N --streams S | --download]")?.parse()?;
    let url = it.next().ok_or("no URL")?.parse()?;
    let mut a = Args { addr, url, conns: 1, requests: 1, streams: 16, download: false };
    while let Some(flag) = it.next() {
        let mut num = || -> Result<usize, Error> { Ok(it.next().ok_or("a number")?.parse()?) };
        match flag.as_str() {
            "--conns" => a.conns = num()?,
            "--requests" => a.requests = num()?,
            "--streams" => a.streams = num()?.max(1),
            "--download" => a.download = true,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    Ok(a)
}

fn endpoint() -> Result<quinn::Endpoint, Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut transport = quinn::TransportConfig::default();
    // Wide windows: the client must never be what holds the server back.
    transport
        .stream_receive_window(quinn::VarInt::from_u32(64 << 20))
        .receive_window(quinn::VarInt::from_u32(256 << 20))
        .max_idle_timeout(Some(Duration::from_secs(30).try_into()?));
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    let mut ep = quinn::Endpoint::client(SocketAddr::from(([0, 0, 0, 0], 0)))?;
    ep.set_default_client_config(config);
    Ok(ep)
}

/// What one connection received and sent.
#[derive(Default)]
struct Counts {
    bytes: u64,
    rx_datagrams: u64,
    tx_datagrams: u64,
    acks_sent: u64,
}

/// One connection: `requests` GETs of `url`, `streams` at a time; what it received.
async fn connection(ep: quinn::Endpoint, a: Arc<Args>, requests: usize) -> Result<Counts, Error> {
    let host = a.url.host().unwrap_or("localhost").to_string();
    let conn = ep.connect(a.addr, &host)?.await?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
    let drive = tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    let per = requests.div_ceil(a.streams);
    let mut tasks = Vec::new();
    let mut left = requests;
    for _ in 0..a.streams.min(requests) {
        let n = per.min(left);
        left -= n;
        let (mut send, url) = (send.clone(), a.url.clone());
        tasks.push(tokio::spawn(async move {
            let mut bytes = 0u64;
            for _ in 0..n {
                let mut stream = send.send_request(http::Request::get(url.clone()).body(())?).await?;
                stream.finish().await?;
                let resp = stream.recv_response().await?;
                if resp.status() != http::StatusCode::OK {
                    return Err(format!("status {}", resp.status()).into());
                }
                while let Some(mut chunk) = stream.recv_data().await? {
                    bytes += chunk.remaining() as u64;
                    chunk.advance(chunk.remaining());
                }
            }
            Ok::<u64, Error>(bytes)
        }));
    }
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await??;
    }
    drop(send);
    let stats = conn.stats();
    conn.close(quinn::VarInt::from_u32(0x100), b"");
    drive.abort();
    Ok(Counts {
        bytes,
        rx_datagrams: stats.udp_rx.datagrams,
        tx_datagrams: stats.udp_tx.datagrams,
        acks_sent: stats.frame_tx.acks,
    })
}

async fn run(a: Args) -> Result<(), Error> {
    let a = Arc::new(a);
    let ep = endpoint()?;
    let (conns, requests) = if a.download { (1, 1) } else { (a.conns, a.requests) };
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        tasks.push(tokio::spawn(connection(ep.clone(), a.clone(), requests)));
    }
    let mut c = Counts::default();
    for t in tasks {
        let one = t.await??;
        c.bytes += one.bytes;
        c.rx_datagrams += one.rx_datagrams;
        c.tx_datagrams += one.tx_datagrams;
        c.acks_sent += one.acks_sent;
    }
    let secs = t0.elapsed().as_secs_f64();
    ep.wait_idle().await;
    println!(
        "{{\"requests\": {}, \"bytes\": {}, \"seconds\": {secs:.6}, \"rx_datagrams\": {}, \"tx_datagrams\": {}, \"acks_sent\": {}}}",
        conns * requests,
        c.bytes,
        c.rx_datagrams,
        c.tx_datagrams,
        c.acks_sent
    );
    Ok(())
}

fn main() {
    let result = args().and_then(|a| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(run(a))
    });
    if let Err(e) = result {
        eprintln!("h3client: {e}");
        std::process::exit(1);
    }
}
