"""The crypto limit of the throughput scenarios: CPU seconds per GiB that the AEAD alone costs on
this machine in this run, as a floor to read the servers' CPU s/GiB against.

Two references: AES-128-GCM sealing 16 KiB records with aws-lc-rs on one core (the example
program crates/ktlsd/examples/aead_limit, built by bench/run), which is what ktlsd's userspace
record layer runs; and, where the kernel has kTLS, the kernel's own AES-GCM as kTLS uses it
(tls_sw): one socket with TLS_TX on a loopback connection, fed by sendfile from a file of zeros,
drained by a reader thread, measured as the sending thread's CPU time. That kernel figure also
holds the TCP send path (and, on loopback, some of the receive path), so it is an upper bound on
the kernel's AEAD cost, not the AEAD alone. Not a server benchmark: no HTTP, no handshake."""

import json
import os
import socket
import struct
import threading
import time

from .system import log, sh

SOL_TLS, TLS_TX, TCP_ULP = 282, 1, 31
TLS_1_3_VERSION, TLS_CIPHER_AES_GCM_128 = 0x0304, 51
GIB = 1 << 30


def aead_limit(binary, seconds):
    """aws-lc-rs AES-128-GCM, 16 KiB records, one core: the example's JSON (cpu_s_per_gib, ...)."""
    if not os.path.exists(binary):
        raise RuntimeError(f"{binary} missing: cargo build --release -p ktlsd --example aead_limit (bench/run does)")
    got = json.loads(sh([binary, "--seconds", str(seconds)]))
    log(f"  AEAD alone (aws-lc-rs AES-128-GCM, 16 KiB records, one core): {got['cpu_s_per_gib']:.4f} CPU s/GiB "
        f"({got['mb_per_cpu_second']:.0f} MB per CPU second)")
    return got


def kernel_ktls_limit(work, seconds):
    """The kernel's kTLS send (AES-128-GCM, TLS 1.3 records) over loopback: CPU s/GiB of the
    sending thread, or None where the kernel has no kTLS."""
    path = os.path.join(work, "zeros.bin")
    chunk = 16 << 20
    with open(path, "wb") as f:
        f.truncate(chunk)
    lst = socket.create_server(("127.0.0.1", 0))
    tx = socket.create_connection(lst.getsockname())
    rx, _ = lst.accept()
    lst.close()
    try:
        tx.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
        key = struct.pack("=HH8s16s4s8s", TLS_1_3_VERSION, TLS_CIPHER_AES_GCM_128, b"\1" * 8, b"\2" * 16, b"\3" * 4,
                          b"\0" * 8)
        tx.setsockopt(SOL_TLS, TLS_TX, key)
    except OSError as e:
        tx.close()
        rx.close()
        log(f"  kernel kTLS send: not measured ({e})")
        return None

    def drain():
        buf = bytearray(1 << 20)
        while rx.recv_into(buf):
            pass
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    sent, cpu0, t0 = 0, time.thread_time(), time.monotonic()
    try:
        with open(path, "rb") as f:
            while time.thread_time() - cpu0 < seconds:
                off = 0
                while off < chunk:
                    off += os.sendfile(tx.fileno(), f.fileno(), off, chunk - off)
                sent += chunk
        cpu = time.thread_time() - cpu0
    finally:
        tx.close()
        reader.join(timeout=30)
        rx.close()
    got = {"bytes": sent, "cpu_seconds": cpu, "wall_seconds": time.monotonic() - t0, "cpu_s_per_gib": cpu / (sent / GIB)}
    log(f"  kernel kTLS send (AES-128-GCM, sendfile over loopback): {got['cpu_s_per_gib']:.4f} CPU s/GiB")
    return got


def limit_lines(aead, kernel, server_cpu, kernel_servers=()):
    """Report lines: each reference's CPU s/GiB and each server's CPU s/GiB as a multiple of
    it ({name: s/GiB}); servers in kernel_servers are read against the kernel's reference."""
    lines = ["", "| crypto limit (same machine, same run) | CPU s/GiB |", "|---|---|",
             f"| AEAD alone: AES-128-GCM seal of 16 KiB records, aws-lc-rs, one core | {aead['cpu_s_per_gib']:.4f} |"]
    if kernel is None and kernel_servers:
        lines.append("| kernel AES-GCM as kTLS uses it (tls_sw) | not measured (no kTLS in this kernel) |")
    elif kernel is not None:
        lines.append(f"| kernel kTLS send over loopback (tls_sw AES-128-GCM plus the TCP send path) | "
                     f"{kernel['cpu_s_per_gib']:.4f} |")
    lines += ["", "Server CPU s/GiB as a multiple of the crypto limit:"]
    for name, cpu in server_cpu.items():
        ref, what = (kernel, "the kernel's kTLS send") if name in kernel_servers else (aead, "aws-lc-rs AEAD alone")
        if isinstance(cpu, str) or cpu != cpu:
            lines.append(f"- {name}: n/a ({cpu})")
        elif ref is None:
            lines.append(f"- {name}: {cpu:.3f} s/GiB; {what} not measured")
        else:
            lines.append(f"- {name}: {cpu / ref['cpu_s_per_gib']:.1f}x {what}")
    return "\n".join(lines)
