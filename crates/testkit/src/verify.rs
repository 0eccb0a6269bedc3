//! The one certificate verifier of the tests: it accepts any server
//! certificate (the tests check the server's TLS and HTTP, not its PKI) but
//! still verifies the handshake signatures against it. Never for anything
//! but tests.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Accepts any certificate; verifies handshake signatures with the algorithms given.
#[derive(Debug)]
pub struct AcceptAnyCert(pub WebPkiSupportedAlgorithms);

impl AcceptAnyCert {
    /// With `provider`'s signature verification algorithms.
    pub fn new(provider: &CryptoProvider) -> AcceptAnyCert {
        AcceptAnyCert(provider.signature_verification_algorithms)
    }

    /// Like [`AcceptAnyCert::new`], but offering only `schemes` (in the provider's
    /// order) in the handshake's signature_algorithms.
    pub fn offering(provider: &CryptoProvider, schemes: &[SignatureScheme]) -> AcceptAnyCert {
        let all = provider.signature_verification_algorithms;
        let mapping: Vec<_> = all.mapping.iter().filter(|(s, _)| schemes.contains(s)).copied().collect();
        // Leaked once per test client: the algorithms table must be 'static.
        AcceptAnyCert(WebPkiSupportedAlgorithms { all: all.all, mapping: Vec::leak(mapping) })
    }
}

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}
