"""The crypto limit of the throughput scenarios: CPU seconds per GiB that the AEAD alone costs on
this machine in this run, as a floor to read the servers' CPU s/GiB against.

Two references: AES-128-GCM sealing 16 KiB records with aws-lc-rs on one core (the example
program crates/ktlsd/examples/aead_limit, built by bench/run), which is what ktlsd's userspace
record layer runs; and, where the kernel has kTLS, the kernel's own AES-GCM as kTLS uses it
(tls_sw): one socket with TLS_TX on a loopback connection, fed by sendfile from a file of zeros,
drained by a reader thread, measured as the sending thread's CPU time. That kernel figure also
holds the TCP send path (and, on loopback, some of the receive path), so it is an upper bound on
the kernel's AEAD cost, not the AEAD alone. Not a server benchmark: no HTTP, no handshake.

Beside the AEAD, a userspace record layer cannot avoid two kernel costs: reading the file into its
own memory and writing the sealed records to the socket. The socket floor measures both as such a
layer does them, with no cipher: `preadv` of a file in the page cache into the payload areas of
16 KiB records laid out in one reused buffer, then one `send` of that buffer (16 records, 256 KiB)
to a loopback TCP connection that another process drains. The CPU is the sending thread's, as
`/proc` accounts it (the receive work loopback does in the sender's context included), per GiB of
payload, the median of five slices. AEAD + floor estimates the least a userspace record layer can spend per GiB
on this machine; each part is measured alone, so a run in other conditions can put a server a little under it.

For HTTP/3 the same kind of floor is the UDP one (`udp_floor`): the kernel time of sending 1452-byte
datagrams (QUIC's packets on a 1500-byte path) in GSO batches over loopback to a receiver in another
process, with no payload work at all (no reading, no sealing, no acknowledgements)."""

import json
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time

from .system import log, make_file, sh

SOL_TLS, TLS_TX, TCP_ULP = 282, 1, 31
TLS_1_3_VERSION, TLS_CIPHER_AES_GCM_128 = 0x0304, 51
GIB = 1 << 30
RECORD, OVERHEAD = 16384, 22  # a full TLS 1.3 AES-GCM record: header 5, content type 1, tag 16
FLOOR_BATCH = 16  # records per send, as ktlsd's userspace record layer writes them
FLOOR_SLICES = 5
DRAIN = ("import socket, sys\ns = socket.socket(fileno=int(sys.argv[1]))\nb = bytearray(1 << 20)\n"
         "while s.recv_into(b):\n    pass\n")


def aead_limit(binary, seconds):
    """aws-lc-rs AES-128-GCM, 16 KiB records, one core: the example's JSON (cpu_s_per_gib, ...)."""
    if not os.path.exists(binary):
        raise RuntimeError(f"{binary} missing: cargo build --release -p ktlsd --example aead_limit (bench/run does)")
    got = json.loads(sh([binary, "--seconds", str(seconds)]))
    log(f"  AEAD alone (aws-lc-rs AES-128-GCM, 16 KiB records, one core): {got['cpu_s_per_gib']:.4f} CPU s/GiB "
        f"({got['mb_per_cpu_second']:.0f} MB per CPU second)")
    return got


def socket_floor(work, seconds, batch=FLOOR_BATCH):
    """The kernel's share of a userspace record layer, without the cipher: CPU s/GiB of payload
    for reading a cached file into record slots (preadv) and for sending the records over loopback."""
    path = os.path.join(work, "floor.bin")
    size = 64 << 20
    make_file(path, size)
    stride = RECORD + OVERHEAD
    buf = bytearray(batch * stride)
    view = memoryview(buf)
    slots = [view[i * stride + 5:i * stride + 5 + RECORD] for i in range(batch)]
    lst = socket.create_server(("127.0.0.1", 0))
    tx = socket.create_connection(lst.getsockname())
    rx, _ = lst.accept()
    lst.close()
    # The reader is another process, so that it takes no CPU time from the measured thread.
    reader = subprocess.Popen([sys.executable, "-c", DRAIN, str(rx.fileno())], pass_fds=[rx.fileno()])
    rx.close()
    fd = os.open(path, os.O_RDONLY)
    slices, t0 = [], time.monotonic()
    try:
        for off in range(0, size, 1 << 20):  # into the page cache first
            os.pread(fd, 1 << 20, off)
        off = 0
        # Five slices, and the median one: a busy machine disturbs some of them, not the median.
        for _ in range(FLOOR_SLICES):
            read_cpu = send_cpu = 0.0
            payload = 0
            while read_cpu + send_cpu < seconds / FLOOR_SLICES:
                c0 = time.thread_time()
                got = os.preadv(fd, slots, off)
                c1 = time.thread_time()
                tx.sendall(view)
                c2 = time.thread_time()
                if got != batch * RECORD:
                    raise RuntimeError(f"socket floor: short read of {path} ({got} bytes at {off})")
                read_cpu, send_cpu = read_cpu + c1 - c0, send_cpu + c2 - c1
                payload += got
                off = (off + got) % size
            gib = payload / GIB
            slices.append({"read_s_per_gib": read_cpu / gib, "send_s_per_gib": send_cpu / gib,
                           "cpu_s_per_gib": (read_cpu + send_cpu) / gib})
    finally:
        os.close(fd)
        tx.close()
        reader.wait(timeout=30)
        os.unlink(path)
    slices.sort(key=lambda s: s["cpu_s_per_gib"])
    got = {**slices[len(slices) // 2], "records_per_send": batch, "wall_seconds": time.monotonic() - t0,
           "slices_cpu_s_per_gib": [s["cpu_s_per_gib"] for s in slices]}
    log(f"  socket floor ({batch} records of 16 KiB per send, loopback): {got['cpu_s_per_gib']:.4f} CPU s/GiB "
        f"(preadv {got['read_s_per_gib']:.4f}, send {got['send_s_per_gib']:.4f}; median of "
        + ", ".join(f"{c:.4f}" for c in got["slices_cpu_s_per_gib"]) + ")")
    return got


UDP_SEGMENT, UDP_GRO = 103, 104
UDP_DRAIN = ("import socket, sys\ns = socket.socket(fileno=int(sys.argv[1]))\n"
             "s.setsockopt(socket.IPPROTO_UDP, 104, int(sys.argv[2]))\nb = bytearray(1 << 16)\n"
             "while s.recv_into(b) != 1:\n    pass\n")


def udp_floor(seconds, segment=1452, segments=10, gro=False):
    """Kernel CPU s/GiB of payload for sending `segment`-byte UDP datagrams over loopback,
    `segments` per `send` (UDP GSO), to a receiver that asks for GRO or not: the sending
    thread's system time only (the loopback delivery it does in its context included), so the
    Python loop around it is not counted. The least any QUIC stack sending such packets pays."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(rx.getsockname())
    reader = subprocess.Popen([sys.executable, "-c", UDP_DRAIN, str(rx.fileno()), str(int(gro))],
                              pass_fds=[rx.fileno()])
    rx.close()
    if segments > 1:
        tx.setsockopt(socket.IPPROTO_UDP, UDP_SEGMENT, segment)
    payload = bytes(segment * segments)
    slices = []
    try:
        for _ in range(FLOOR_SLICES):
            r0, sent = resource.getrusage(resource.RUSAGE_THREAD), 0
            c0 = time.thread_time()
            while time.thread_time() - c0 < seconds / FLOOR_SLICES:
                sent += tx.send(payload)
            r1 = resource.getrusage(resource.RUSAGE_THREAD)
            slices.append((r1.ru_stime - r0.ru_stime) / (sent / GIB))
    finally:
        if segments > 1:
            tx.setsockopt(socket.IPPROTO_UDP, UDP_SEGMENT, 0)
        for _ in range(100):  # the stop datagram; the receiver may drop some under load
            if reader.poll() is not None:
                break
            try:
                tx.send(b"!")
            except ConnectionRefusedError:  # the receiver has closed its socket: it is gone
                break
            time.sleep(0.01)
        reader.kill()
        tx.close()
    slices.sort()
    got = {"cpu_s_per_gib": slices[len(slices) // 2], "segment": segment, "segments_per_send": segments,
           "gro": gro, "slices_cpu_s_per_gib": slices}
    log(f"  UDP floor ({segments} x {segment}-byte datagrams per send, receiver GRO {'on' if gro else 'off'}): "
        f"{got['cpu_s_per_gib']:.4f} kernel CPU s/GiB (median of " + ", ".join(f"{c:.4f}" for c in slices) + ")")
    return got


def userspace_limits(args, work):
    """The references of a userspace-record-layer scenario: (AEAD alone, socket floor)."""
    return aead_limit(args.aead_limit, args.aead_seconds), socket_floor(work, args.aead_seconds)


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


def limit_lines(aead, kernel, server_cpu, kernel_servers=(), floor=None):
    """Report lines: each reference's CPU s/GiB and each server's CPU s/GiB as a multiple of
    it ({name: s/GiB}); servers in kernel_servers are read against the kernel's reference, the
    others also against AEAD + socket floor when the floor was measured."""
    lines = ["", "| crypto limit (same machine, same run) | CPU s/GiB |", "|---|---|",
             f"| AEAD alone: AES-128-GCM seal of 16 KiB records, aws-lc-rs, one core | {aead['cpu_s_per_gib']:.4f} |"]
    if floor is not None:
        both = aead["cpu_s_per_gib"] + floor["cpu_s_per_gib"]
        lines += [f"| socket floor: preadv into 16 KiB record slots, then one send of {floor['records_per_send']} "
                  f"records over loopback (no cipher) | {floor['cpu_s_per_gib']:.4f} (preadv "
                  f"{floor['read_s_per_gib']:.4f}, send {floor['send_s_per_gib']:.4f}) |",
                  "| AEAD + socket floor: a userspace record layer's least cost, each part measured alone | "
                  f"{both:.4f} |"]
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
        elif ref is aead and floor is not None:
            both = aead["cpu_s_per_gib"] + floor["cpu_s_per_gib"]
            lines.append(f"- {name}: {cpu / ref['cpu_s_per_gib']:.1f}x {what}, {cpu / both:.2f}x AEAD + socket floor")
        else:
            lines.append(f"- {name}: {cpu / ref['cpu_s_per_gib']:.1f}x {what}")
    return "\n".join(lines)
