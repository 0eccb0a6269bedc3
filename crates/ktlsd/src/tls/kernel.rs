//! The kernel record layer (kTLS): after the handshake the traffic keys go to the
//! kernel, which then encrypts and decrypts every record on this socket.
//! Wiring pending.

use std::io;
use std::time::Duration;

use rustls::server::UnbufferedServerConnection;
use rustls::{CipherSuite, ProtocolVersion};
use tokio::net::TcpStream;

/// What the running kernel can do, probed once at start-up.
pub struct Support {}

impl Support {
    pub fn probe() -> Support {
        Support {}
    }
    pub fn usable(&self) -> bool {
        false
    }
    pub fn unavailable_reason(&self) -> Option<&str> {
        Some("not wired")
    }
    pub fn summary(&self) -> String {
        String::new()
    }
    pub fn supports_both(&self, _v: ProtocolVersion, _s: CipherSuite) -> bool {
        false
    }
}

pub struct KernelTls {}

impl KernelTls {
    pub fn install(_stream: &TcpStream, _conn: UnbufferedServerConnection) -> Result<KernelTls, String> {
        Err("not wired".into())
    }
    pub async fn read(&mut self, _stream: &TcpStream, _out: &mut Vec<u8>, _t: Duration) -> io::Result<usize> {
        Ok(0)
    }
    pub async fn close_notify(&mut self, _stream: &TcpStream, _t: Duration) -> io::Result<()> {
        Ok(())
    }
}
