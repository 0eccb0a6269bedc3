//! PROXY protocol headers (`server/proxy_protocol.rs`, on the `ppp` crate), as a load
//! balancer's connection begins. Besides never panicking:
//! - a whole header lies within the bytes given, and is the same header when the
//!   bytes after it change (what follows is the TLS handshake's, never the header's);
//! - the beginning of a header stays a beginning, or becomes a verdict, as bytes are
//!   added: never a header shorter than the bytes it was judged incomplete on.
#![no_main]

use ktlsd::fuzzing::proxy_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match proxy_header(data) {
        Ok(Some((len, source))) => {
            assert!(len > 0 && len <= data.len(), "{len} of {}", data.len());
            let mut other = data[..len].to_vec();
            other.extend_from_slice(b"\x16\x03\x01\x00\x05hello");
            assert_eq!(proxy_header(&other), Ok(Some((len, source))), "what follows changed the header");
        }
        Ok(None) => {
            for cut in 0..data.len().min(600) {
                if let Ok(Some((len, _))) = proxy_header(&data[..cut]) {
                    panic!("a header of {len} bytes in a prefix of an incomplete one");
                }
            }
        }
        Err(_) => {}
    }
});
