//! `ktlsd doctor` on a kernel with kTLS: every suite usable both ways, and the
//! key-update verdict agrees with tls_stat.

use std::process::Command;
use std::time::Duration;

use testkit::{bin_from_env, run_with_timeout};

use crate::harness::{kernel_can_rekey, read_tls_stat, StatDelta};
use crate::BIN;

#[test]
#[ignore = "needs a kernel with kTLS: run by tests/ktls-vm"]
fn doctor_reports_ktls_usable() {
    let before = read_tls_stat();
    let o = run_with_timeout(Command::new(bin_from_env(BIN)).args(["doctor", "--json"]), None, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "ktlsd doctor --json: {}\n{text}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("doctor JSON: {e}\n{text}"));
    assert_eq!(j["ktls"]["usable"], true, "doctor says kTLS is not usable:\n{text}");
    let suites = j["suites"].as_array().expect("suites array");
    assert_eq!(suites.len(), 6, "{text}");
    for s in suites {
        assert!(s["tx"] == true && s["rx"] == true, "suite not usable in both directions: {s}");
    }
    assert_eq!(j["rekey"]["tested"], true, "{text}");
    let rekey = kernel_can_rekey();
    assert_eq!(j["rekey"]["supported"], rekey, "doctor's key-update verdict disagrees with tls_stat:\n{text}");
    assert_eq!(j["tls_stat"]["available"], true, "{text}");

    // The human report says the same.
    let o = run_with_timeout(Command::new(bin_from_env(BIN)).arg("doctor"), None, Duration::from_secs(60));
    let human = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "ktlsd doctor: {}\n{human}", o.status);
    assert!(human.contains("usable") && !human.contains("NOT usable"), "{human}");
    let after = read_tls_stat();
    println!(
        "[tls_stat] doctor_reports_ktls_usable: {} | rekey supported: {rekey}",
        StatDelta { before, after }.summary()
    );
}
