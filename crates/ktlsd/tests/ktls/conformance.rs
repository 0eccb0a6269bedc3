//! RFC conformance of the kernel record layer beyond the bad-record table:
//! inputs a peer may legally send after the handshake, and the answers nginx
//! gives them.

use std::time::Duration;

use testkit::ForgingClient;

use crate::harness::*;
use crate::suites::*;

/// RFC 5746 §4.4 / RFC 5246 §7.2.2: a TLS 1.2 renegotiation (a ClientHello,
/// here split over two records) gets the warning no_renegotiation, and the
/// connection goes on.
#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn renegotiation_gets_a_warning_and_the_connection_goes_on() {
    let files = standard_files();
    let server = KtlsServer::start(&files, &[]);
    let mut c = ForgingClient::connect(server.addr(), V::Tls12.rustls(), None);
    assert_eq!(c.get("/one").status, 200);
    let mut hello = vec![1, 0, 0, 40, 3, 3];
    hello.resize(44, 0x5a);
    let (first, second) = (c.seal(22, &hello[..3], 0), c.seal(22, &hello[3..], 0));
    c.send_raw(&[first, second].concat());
    let end = c.read_until_end(Duration::from_secs(2));
    println!("[renegotiation_gets_a_warning_and_the_connection_goes_on] {:?} {:?}", end.records, end.how);
    assert_eq!(end.records, vec![(21, vec![1, 100])], "the server ended {:?}", end.how);
    assert_eq!(c.get("/one").status, 200, "a request after the refused renegotiation");
    let s = server.stop();
    assert_eq!(s.stat("ktls_record_errors"), 0, "{}", s.stderr);
    assert_ktls("renegotiation_gets_a_warning_and_the_connection_goes_on", &s, &Expect::conns(1, 2));
}
