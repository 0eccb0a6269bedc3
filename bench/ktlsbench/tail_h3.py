"""The HTTP/3 side of the tail scenario (`tail --http3`): ktlsd's HTTP/3 as one more condition in
the same shuffled plan as HTTP/1.1 and HTTP/2 over kTLS with each record-size policy; the client
(ngtcp2's `gtlsclient`), the netem setup that makes UDP GSO batches lose packets one by one, and
the report section comparing HTTP/3's p95 with the best TCP condition's. Not the plan itself or
the TCP clients: those are in tail."""

import collections
import os
import re
import subprocess
import tempfile
import threading

from .stats import pct, ratio_ci
from .system import log, proc_counters

PROTOCOLS = ("h1", "h2")  # the TCP protocols beside h3; each record-size policy over each
H3 = "h3"

# Client CPU per protocol, [user+system seconds, connections], summed over every client process.
CLIENT_CPU = collections.defaultdict(lambda: [0.0, 0])
_CPU_LOCK = threading.Lock()

# ngtcp2's own log lines start with the milliseconds since the connection began: I00000123.
STAMP = re.compile(r"^I(\d{8}) ")
# Per HTTP/3 connection, ms from the client's handshake completing to its first 1-RTT packet
# (Finished and request): the client's own wait, part of its TTFB.
CLIENT_WAIT = []
# Where gtlsclient's log of a connection whose TTFB is over SLOW_MS is kept (None: nowhere).
SLOW_LOGS, SLOW_MS = None, 1000


def run_timed(cmd, proto, conns, timeout):
    """Runs cmd to its end (killed after `timeout` s): (exit code, stdout, stderr). Its user+system
    CPU time goes to CLIENT_CPU[proto] with its `conns` connections, so the report can say what
    each protocol's client cost per connection on the same (emulated) CPU."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        with _CPU_LOCK:
            CLIENT_CPU[proto][0] += usage.ru_utime + usage.ru_stime
            CLIENT_CPU[proto][1] += conns
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read(), err.read()


def log_cpu(server_cpu):
    """Client and server CPU per connection by protocol ({proto: [seconds, connections]} each)."""
    for what, got in (("client", CLIENT_CPU), ("server", server_cpu)):
        log(f"  {what} CPU per connection: " + ", ".join(f"{k} {v[0] * 1000 / v[1]:.0f} ms"
                                                         for k, v in sorted(got.items()) if v[1]))
    if CLIENT_WAIT:
        log(f"  gtlsclient from handshake done to its request, ms: p50 {pct(CLIENT_WAIT, 50):.0f}, "
            f"p95 {pct(CLIENT_WAIT, 95):.0f}, max {max(CLIENT_WAIT)}")


def gtlsclient_batch(jobs, work, addr="127.0.0.1"):
    """Each job [(condition, size_name, size)] in turn on a new QUIC connection of its own
    (one gtlsclient process each: a full handshake, no session file, so no resumption or 0-RTT).
    TTFB is the time, on ngtcp2's log clock (from the first Initial sent), of the packet that
    completed the response's HEADERS; total is that of the packet that ended the stream. Fails
    on an exit other than 0, a status other than 200, a body of any other size, or another ALPN."""
    out_dir = os.path.join(work, f"h3-dl-{threading.get_ident()}")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for c, name, size in jobs:
        cmd = ["gtlsclient", "--no-quic-dump", "--no-http-dump", "--exit-on-all-streams-close",
               "--timeout=30s", f"--download={out_dir}", addr, str(c.port),
               f"https://localhost:{c.port}/{name}"]
        rc, _, err = run_timed(cmd, H3, 1, 120)
        ttfb = total = None
        stamp, status, alpn, done, wait = None, None, None, None, None
        for line in err.splitlines():
            m = STAMP.match(line)
            if m:
                stamp = int(m.group(1))
                if done is not None and wait is None and " pkt tx " in line and "type=1RTT" in line:
                    wait = stamp - done
            elif line.startswith("QUIC handshake has completed"):
                done = stamp
            elif line.startswith("http: stream 0x0 response headers started"):
                ttfb = stamp
            elif line.startswith("http: stream 0x0 [:status: "):
                status = line.split()[-1].rstrip("]")
            elif line.startswith("HTTP stream 0 closed"):
                total = stamp
            elif line.startswith("Negotiated ALPN is "):
                alpn = line.split()[-1]
        path = os.path.join(out_dir, name)
        got = os.path.getsize(path) if os.path.exists(path) else 0
        if os.path.exists(path):
            os.remove(path)
        if rc != 0 or status != "200" or got != size or alpn != "h3" or ttfb is None or total is None:
            raise RuntimeError(f"{c.name} {name}: gtlsclient exit {rc}, ALPN {alpn}, HTTP {status}, "
                               f"{got} of {size} bytes, TTFB {ttfb} ms, total {total} ms: {err[-1500:]}")
        rows.append((c.name, name, float(ttfb), float(total)))
        if ttfb > SLOW_MS and SLOW_LOGS is not None:  # the client's own account of its slowest connections
            with open(os.path.join(SLOW_LOGS, f"{name}-ttfb{ttfb}-{threading.get_ident()}.log"), "w") as f:
                f.write(err[:200_000])
        if wait is not None:
            CLIENT_WAIT.append(wait)
    return rows


def qdisc(delay, loss):
    """`tc` commands for lo: netem under a TBF that only splits GSO batches. quinn sends up to
    ten datagrams as one UDP GSO buffer, which the kernel segments only after the root qdisc, so
    netem alone would drop or keep all ten together; a TBF whose burst is under two segments hands
    netem each datagram on its own (a TCP segment, already MTU-sized, passes unchanged), and its
    rate is far above anything the guest sends, so it never queues."""
    return [["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "tbf", "rate", "10gbit", "burst", "2000b",
             "limit", "100000000"],
            ["tc", "qdisc", "add", "dev", "lo", "parent", "1:1", "handle", "10:", "netem", "delay", delay, "loss",
             loss, "limit", "100000"]]


def udp_counters():
    return {**proc_counters("/proc/net/snmp", "Udp:"), "TcpOutSegs": proc_counters("/proc/net/snmp", "Tcp:")["OutSegs"]}


def log_udp(before, qdisc_stats):
    """Datagrams dropped at a full socket buffer would be losses netem did not make: log them.
    Also netem's packets less TCP's segments against UDP's sends (OutDatagrams counts a GSO
    batch once): more packets than sends means batches reached the TBF and were split."""
    now = udp_counters()
    d = {k: now[k] - before.get(k, 0) for k in ("OutDatagrams", "InDatagrams", "RcvbufErrors", "SndbufErrors",
                                                 "TcpOutSegs")}
    log("  UDP: " + " ".join(f"{k}={v}" for k, v in d.items()))
    sent = re.search(r"qdisc netem .*?Sent \d+ bytes (\d+) pkt", qdisc_stats, re.S)
    if sent:
        log(f"  netem packets less TCP segments: {int(sent.group(1)) - d['TcpOutSegs']}; "
            f"UDP sends: {d['OutDatagrams']}")


def require_h3(work, name, expected):
    """Fails unless the HTTP/3 server's access log has one HTTP/3.0 200 line per job."""
    with open(os.path.join(work, f"{name}.access")) as f:
        lines = [l for l in f if l.strip()]
    good = [l for l in lines if '" 200 ' in l and "HTTP/3.0" in l]
    if len(good) != expected or len(lines) != expected:
        raise RuntimeError(f"{name}: {len(good)} HTTP/3.0 200 lines of {len(lines)} logged, expected {expected}")


def h3_section(cell, sizes, names):
    """HTTP/3's p95 TTFB and total against the best TCP condition's (the lowest p95 at that size),
    each with a 95% bootstrap interval."""
    tcp = [n for n in names if n != H3]
    lines = ["", "HTTP/3 vs the best TCP condition (lowest p95 at that size), with a 95% bootstrap interval:"]
    for size in sizes:
        parts = []
        for what, col in (("TTFB", 2), ("total", 3)):
            best = min(tcp, key=lambda n: pct(cell(n, size, col), 95))
            r, lo, hi = ratio_ci(cell(H3, size, col), cell(best, size, col), 95)
            parts.append(f"p95 {what} {pct(cell(H3, size, col), 95):.0f} vs {best} "
                         f"{pct(cell(best, size, col), 95):.0f} ms: {r:.2f}x [{lo:.2f}, {hi:.2f}]")
        lines.append(f"- {size}: " + "; ".join(parts))
    return lines
