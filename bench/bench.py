#!/usr/bin/env python3
"""ktlsd benchmarks, always side by side with nginx in one run, reported as ratios.

Scenarios:
  throughput  (host)  1 GiB single-connection download with curl (speed, server CPU s/GiB)
                      and 10 KiB requests with wrk (64 keep-alive connections): ktlsd vs nginx.
  ktls        (VM)    32 MiB download: ktlsd kTLS vs ktlsd userspace vs nginx kTLS
                      (ssl_conf_command Options KTLS, sendfile on).
  scale-ktls  (VM)    memory per idle keep-alive connection with kTLS in both servers, at 1,000
                      and 2,000 connections.
  scale       (host)  memory per idle keep-alive TLS connection (after one small response, and
                      after the handshake alone) at 2,000 and 10,000 connections, both servers
                      fresh; 10 KiB with wrk over 1000 keep-alive connections, and with a new
                      TLS connection per request (Connection: close).
  tail        (VM)    cold connections over netem 50 ms delay / 1% loss: TTFB and total time
                      per record-size policy and nginx, for 10 KB, 100 KB and 1 MB files.
  cold        (VM)    a hot 10 KiB file fetched by wrk while other clients download cold large
                      files from a slow disk (ext4 on a loop file under dm-delay): the hot file's
                      p50/p99, idle and loaded, for ktlsd kTLS, nginx default, nginx aio threads.

Run through bench/run, which installs what is needed and boots a VM for the VM scenarios.
"""
import argparse
import concurrent.futures
import csv
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


# ---------------------------------------------------------------- servers

def cpu_seconds(pids):
    """utime+stime of the given processes (all threads), in seconds."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / CLK_TCK


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except OSError:
                pass
    return out


def wait_port(port, timeout=20):
    import socket
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


class Ktlsd:
    def __init__(self, name, binary, root, port, work, extra=()):
        self.name, self.port = name, port
        self.err = open(os.path.join(work, f"{name}.err"), "w")
        cmd = [binary, "serve", root, "--listen", f"127.0.0.1:{port}", "--workers", str(WORKERS),
               "--cert", CERT, "--key", KEY, "--access-log", os.path.join(work, f"{name}.access"), *extra]
        if os.geteuid() == 0:
            cmd.append("--allow-root")  # the bench's files are root's; nginx reads them as root too
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.err)
        wait_port(port)

    def pids(self):
        return [self.proc.pid]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


class Nginx:
    def __init__(self, name, root, port, work, ktls=False, buffer="16k", connections=4096, http2=False, extra=""):
        self.name, self.port = name, port
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        conf = os.path.join(d, "nginx.conf")
        ktls_line = "ssl_conf_command Options KTLS;" if ktls else ""
        with open(conf, "w") as f:
            f.write(f"""
user root;
worker_processes {WORKERS};
pid {d}/nginx.pid;
error_log {d}/error.log;
worker_rlimit_nofile {2 * connections + 64};
events {{ worker_connections {connections}; }}
http {{
  include /etc/nginx/mime.types;
  access_log {d}/access.log;
  sendfile on;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port} ssl{" http2" if http2 else ""} reuseport;
    ssl_certificate {CERT};
    ssl_certificate_key {KEY};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_tickets on;
    ssl_buffer_size {buffer};
    {ktls_line}
    {extra}
    root {root};
  }}
}}
""")
        self.proc = subprocess.Popen(["nginx", "-c", conf, "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port)

    def pids(self):
        return [self.proc.pid] + children(self.proc.pid)

    def stop(self):
        self.proc.send_signal(signal.SIGQUIT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ---------------------------------------------------------------- helpers

def make_cert(work):
    global CERT, KEY
    CERT, KEY = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
    sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", KEY, "-out", CERT, "-days", "30", "-subj", "/CN=localhost",
        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])


def make_file(path, size):
    with open(path, "wb") as f:
        block = os.urandom(1 << 20)
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def curl_download(url, extra=()):
    out = sh(["curl", "-sk", "-o", "/dev/null", "-w",
              "%{http_code} %{size_download} %{speed_download} %{time_starttransfer} %{time_total}",
              *extra, url])
    code, size, speed, ttfb, total = out.split()
    if code not in ("200", "206"):
        raise RuntimeError(f"{url}: HTTP {code}")
    return int(size), float(speed), float(ttfb), float(total)


def download_runs(servers, path, size, runs):
    """Interleaved single-connection downloads: speed (MB/s) and server CPU s/GiB."""
    res = {s.name: {"speed": [], "cpu_per_gib": []} for s in servers}
    for i in range(runs):
        order = servers[:]
        random.shuffle(order)
        for s in order:
            c0 = cpu_seconds(s.pids())
            got, speed, _, _ = curl_download(f"https://localhost:{s.port}/{path}",
                                             ["--resolve", f"localhost:{s.port}:127.0.0.1"])
            c1 = cpu_seconds(s.pids())
            if got != size:
                raise RuntimeError(f"{s.name}: got {got} bytes of {size}")
            res[s.name]["speed"].append(speed / 1e6)
            res[s.name]["cpu_per_gib"].append((c1 - c0) / (size / (1 << 30)))
        log(f"  run {i + 1}/{runs}: " + ", ".join(
            f"{s.name} {res[s.name]['speed'][-1]:.0f} MB/s" for s in servers))
    return res


# ---------------------------------------------------------------- scenarios

def versus_table(rows, measure="measure", digits=2):
    """A Markdown table of (measure, ktlsd, nginx, goal) rows with the ktlsd/nginx ratio."""
    table = [f"| {measure} | ktlsd | nginx | ktlsd/nginx | goal |", "|---|---|---|---|---|"]
    table += [f"| {m} | {a:.{digits}f} | {b:.{digits}f} | {a / b:.2f}x | {g} |" for m, a, b, g in rows]
    return "\n".join(table)


def size_name(n):
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


def download_servers(args, work, http2=False):
    """ktlsd and nginx over a root holding big.bin (1 GiB, 64 MiB with --quick) and
    10k.bin, for the download scenarios; returns (servers, big's size)."""
    root = os.path.join(work, "www")
    os.makedirs(root)
    big = 1 << 30 if not args.quick else 64 << 20
    make_file(os.path.join(root, "big.bin"), big)
    make_file(os.path.join(root, "10k.bin"), 10 * 1024)
    extra = ["--record-size", args.record_size] if args.record_size else []
    return [Ktlsd("ktlsd", args.ktlsd, root, 18443, work, extra), Nginx("nginx", root, 18444, work, http2=http2)], big


def scenario_throughput(args, work):
    servers, big = download_servers(args, work)
    try:
        log(f"download: {big >> 20} MiB x {args.runs} runs each, interleaved")
        dl = download_runs(servers, "big.bin", big, args.runs)
        rps = {s.name: [] for s in servers}
        rounds = max(1, args.runs // 3)
        for i in range(rounds):
            for s in random.sample(servers, len(servers)):
                rps[s.name].append(wrk_rps(s, "10k.bin", 64, args.duration, threads=1)[0])
            log(f"  wrk round {i + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.0f} req/s" for n, v in rps.items()))
    finally:
        for s in servers:
            s.stop()
    k, n = dl["ktlsd"], dl["nginx"]
    rows = [
        (f"{size_name(big)} download speed, median MB/s", median(k["speed"]), median(n["speed"]), ">= 1.0"),
        ("server CPU s per GiB, median", median(k["cpu_per_gib"]), median(n["cpu_per_gib"]), "<= 1.0"),
        (f"10 KiB wrk -c64 {args.duration}s, median req/s", median(rps["ktlsd"]), median(rps["nginx"]), ">= 1.2"),
    ]
    return versus_table(rows), {"download": dl, "wrk": rps}


# ---------------------------------------------------------------- scale

def rss_kib(pids):
    """Resident memory of the given processes (all threads share it), in KiB."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
        except (OSError, AttributeError):
            pass
    return total


def open_idle(port, n, request, hold):
    """Opens n TLS connections to port (at most 200 handshakes at once); on each sends one
    keep-alive GET of /small.txt and reads the whole answer when `request` ("http/1.1" or "h2",
    also the ALPN offered; None: the handshake alone), then leaves it idle. Calls hold() while
    all are open, then closes them. Returns what hold returned."""
    import asyncio
    import resource
    import ssl
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if n + 64 > hard:
        raise RuntimeError(f"{n} connections need {n + 64} file descriptors; the hard limit is {hard}")
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols([request or "http/1.1"])

    async def h2_get(r, w):
        import h2.config
        import h2.connection
        import h2.events
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        c.initiate_connection()
        c.send_headers(1, [(":method", "GET"), (":path", "/small.txt"), (":scheme", "https"),
                           (":authority", "localhost")], end_stream=True)
        w.write(c.data_to_send())
        while True:
            data = await r.read(65536)
            if not data:
                raise RuntimeError("HTTP/2 connection closed before the answer")
            ended = any(isinstance(e, h2.events.StreamEnded) for e in c.receive_data(data))
            w.write(c.data_to_send())  # SETTINGS and PING acknowledgements
            if ended:
                return

    async def one(gate):
        async with gate:
            r, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
            if request == "h2":
                await h2_get(r, w)
            elif request:
                w.write(b"GET /small.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
                head = await r.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
                await r.readexactly(length)
            return w

    async def main():
        gate = asyncio.Semaphore(200)
        writers = await asyncio.gather(*(one(gate) for _ in range(n)))
        await asyncio.sleep(1)  # let the servers settle after the last answer
        got = await asyncio.get_running_loop().run_in_executor(None, hold)
        for w in writers:
            w.transport.abort()
        return got

    return asyncio.run(main())


def idle_memory(make, n, request):
    """KiB per connection: RSS of a fresh server before and with n idle connections."""
    s = make()
    try:
        time.sleep(0.5)
        before = rss_kib(s.pids())
        after = open_idle(s.port, n, request, lambda: rss_kib(s.pids()))
    finally:
        s.stop()
    return (after - before) / n, before, after


def wrk_rps(s, path, conns, duration, extra=(), threads=2):
    """Runs wrk against s; returns (requests/s, server CPU microseconds per request)."""
    c0 = cpu_seconds(s.pids())
    out = sh(["wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s", *extra, f"https://127.0.0.1:{s.port}/{path}"])
    cpu = cpu_seconds(s.pids()) - c0
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    n = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if not m or not n or bad or int(n.group(1)) == 0:
        raise RuntimeError(f"wrk against {s.name} failed:\n{out}")
    return float(m.group(1)), cpu * 1e6 / int(n.group(1))


def negotiated_suite(port):
    """The TLS suite the server at port chooses for an OpenSSL client with its default order (as wrk's)."""
    import socket
    import ssl
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with ctx.wrap_socket(sock, server_hostname="localhost") as t:
            return t.cipher()[0]


def scenario_scale(args, work):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # wrk -c1000 and the servers inherit it
    root = os.path.join(work, "www")
    os.makedirs(root)
    with open(os.path.join(root, "small.txt"), "w") as f:
        f.write("hello\n" * 20)
    make_file(os.path.join(root, "10k.bin"), 10 * 1024)
    counts = [int(c) for c in args.scale_conns.split(",")]
    makers = {
        "ktlsd": lambda: Ktlsd("ktlsd", args.ktlsd, root, 18445, work),
        "nginx": lambda: Nginx("nginx", root, 18446, work, connections=max(counts) + 1024, http2=True),
    }
    rows, raw = [], {}
    for request, what in [("http/1.1", "idle keep-alive after one response"), (None, "after the handshake only"),
                          ("h2", "idle HTTP/2 after one response")]:
        for n in counts:
            per = {}
            for name, make in makers.items():
                kib, before, after = idle_memory(make, n, request)
                per[name] = kib
                raw[f"{name} {what} {n}"] = {"kib_per_conn": kib, "rss_before_kib": before, "rss_after_kib": after}
                log(f"  {name}, {n} connections {what}: {kib:.1f} KiB each (RSS {before} -> {after} KiB)")
            rows.append((f"KiB per connection, {n} {what}", per["ktlsd"], per["nginx"], "<= 1.0"))
    # nginx again with ktlsd's TLS choices (server order with AES-128-GCM first, one
    # TLS 1.3 ticket per connection), to tell those choices from the rest of the server.
    same_tls = ("ssl_prefer_server_ciphers on; ssl_conf_command Ciphersuites "
                "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256; "
                "ssl_conf_command NumTickets 1;")
    servers = [makers["ktlsd"](), makers["nginx"](),
               Nginx("nginx-same-tls", root, 18447, work, connections=2048, http2=True, extra=same_tls)]
    try:
        for s in servers:
            log(f"  {s.name} chooses {negotiated_suite(s.port)} for an OpenSSL client")
        rps = {("keep", s.name): [] for s in servers} | {("close", s.name): [] for s in servers}
        cpu = {k: [] for k in rps}
        for i in range(args.scale_rounds):
            for s in random.sample(servers, len(servers)):
                for mode, conns, extra in [("keep", 1000, []), ("close", 64, ["-H", "Connection: close"])]:
                    r, us = wrk_rps(s, "10k.bin", conns, args.duration, extra)
                    rps[(mode, s.name)].append(r)
                    cpu[(mode, s.name)].append(us)
            log(f"  wrk round {i + 1}/{args.scale_rounds}: " + ", ".join(
                f"{k[0]} {k[1]} {v[-1]:.0f} req/s {cpu[k][-1]:.1f} us/req" for k, v in rps.items()))
    finally:
        for s in servers:
            s.stop()
    raw["wrk"] = {f"{k[0]} {k[1]}": v for k, v in rps.items()}
    raw["server_cpu_us_per_request"] = {f"{k[0]} {k[1]}": v for k, v in cpu.items()}
    for mode, what in [("keep", f"10 KiB wrk -c1000 {args.duration}s"),
                       ("close", f"10 KiB, new TLS connection per request (wrk -c64 Connection: close) {args.duration}s")]:
        for other, vs in [("nginx", ""), ("nginx-same-tls", " (nginx with ktlsd's suite order and ticket count)")]:
            rows.append((f"{what}, median req/s{vs}", median(rps[(mode, "ktlsd")]), median(rps[(mode, other)]),
                         ">= 1.2" if other == "nginx" else ""))
            # wrk shares the machine: the servers' own CPU per request shows what a rate ratio dilutes.
            rows.append((f"{what}, server CPU us per request, median{vs}", median(cpu[(mode, "ktlsd")]),
                         median(cpu[(mode, other)]), "lower is better"))
    return versus_table(rows, digits=1), raw


def scenario_scale_ktls(args, work):
    """VM: KiB per idle keep-alive connection (after one small response) with kTLS carrying
    the connections in both servers: ktlsd --ktls on, nginx with ssl_conf_command Options KTLS.
    Fails unless the kernel's TlsCurrTxSw gauge rose by the connection count while they were
    held, and unless ktlsd's access log says tls=ktls for every response."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the servers inherit it
    root = os.path.join(work, "www")
    os.makedirs(root)
    with open(os.path.join(root, "small.txt"), "w") as f:
        f.write("hello\n" * 20)
    counts = [int(c) for c in args.scale_ktls_conns.split(",")]
    makers = {
        "nginx": lambda: Nginx("nginx-ktls", root, 18448, work, ktls=True, connections=max(counts) + 1024),
        "ktlsd": lambda: Ktlsd("ktlsd-ktls", args.ktlsd, root, 18447, work, ["--ktls", "on"]),
    }

    def gauges():
        c = proc_counters_flat("/proc/net/tls_stat")
        return c.get("TlsCurrTxSw", 0), c.get("TlsCurrRxSw", 0)

    rows, raw = [], {}
    for n in counts:
        per = {}
        for name, make in makers.items():
            s = make()
            try:
                time.sleep(0.5)
                before, (tx0, rx0) = rss_kib(s.pids()), gauges()
                try:
                    after, (tx1, rx1) = open_idle(s.port, n, "http/1.1", lambda: (rss_kib(s.pids()), gauges()))
                except OSError:  # connections refused or reset: show the start-up lines (fd budget, kTLS)
                    if isinstance(s, Ktlsd):
                        with open(os.path.join(work, f"{s.name}.err")) as f:
                            lines = f.readlines()
                            log(f"  {name} stderr:\n" + "".join(lines[:12]))
                    raise
            finally:
                s.stop()
            if tx1 - tx0 < n:
                raise RuntimeError(f"{name}: TlsCurrTxSw rose by {tx1 - tx0} for {n} connections: kTLS did not carry them")
            if isinstance(s, Ktlsd):
                require_ktls(work, [s.name])
            per[name] = (after - before) / n
            raw[f"{name} {n}"] = {"kib_per_conn": per[name], "rss_before_kib": before, "rss_after_kib": after,
                                  "tls_curr_tx_sw_rise": tx1 - tx0, "tls_curr_rx_sw_rise": rx1 - rx0}
            log(f"  {name} kTLS, {n} idle keep-alive connections: {per[name]:.1f} KiB each (RSS {before} -> "
                f"{after} KiB; TlsCurrTxSw +{tx1 - tx0}, TlsCurrRxSw +{rx1 - rx0})")
        rows.append((f"KiB per connection, {n} idle keep-alive after one response, kTLS", per["ktlsd"], per["nginx"]))
    table = ["| measure | ktlsd | nginx | ktlsd/nginx |", "|---|---|---|---|"]
    table += [f"| {m} | {a:.1f} | {b:.1f} | {a / b:.2f}x |" for m, a, b in rows]
    return "\n".join(table), raw


def h2load(args):
    """Runs h2load; returns (seconds, requests succeeded, DATA bytes). Fails on any failed or errored
    request, or when ALPN did not choose h2."""
    out = sh(["h2load", *args])
    m = re.search(r"finished in ([\d.]+)(m?s),", out)
    r = re.search(r"requests: (\d+) total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
    d = re.search(r"\((\d+)\) data", out)
    if not m or not r or not d or int(r.group(3)) or int(r.group(4)) or int(r.group(2)) == 0 \
            or "Application protocol: h2" not in out:
        raise RuntimeError(f"h2load {' '.join(args)} failed:\n{out}")
    secs = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    return secs, int(r.group(2)), int(d.group(1))


def scenario_h2(args, work):
    servers, big = download_servers(args, work, http2=True)
    res = {s.name: {"rps": [], "speed": [], "cpu_per_gib": []} for s in servers}
    try:
        for i in range(args.runs):
            for s in random.sample(servers, len(servers)):
                url = f"https://127.0.0.1:{s.port}/"
                secs, done, _ = h2load(["-c16", "-m32", f"-D{args.duration}", url + "10k.bin"])
                res[s.name]["rps"].append(done / secs)
                c0 = cpu_seconds(s.pids())
                secs, _, _ = h2load(["-n1", "-c1", url + "big.bin"])
                c1 = cpu_seconds(s.pids())
                res[s.name]["speed"].append(big / secs / 1e6)
                res[s.name]["cpu_per_gib"].append((c1 - c0) / (big / (1 << 30)))
            log(f"  run {i + 1}/{args.runs}: " + ", ".join(
                f"{n} {v['rps'][-1]:.0f} req/s {v['speed'][-1]:.0f} MB/s {v['cpu_per_gib'][-1]:.2f} s/GiB"
                for n, v in res.items()))
    finally:
        for s in servers:
            s.stop()
    for s in servers[:1]:
        with open(os.path.join(work, f"{s.name}.access")) as f:
            if not any("HTTP/2.0" in l for l in f):
                raise RuntimeError(f"{s.name} served no request over HTTP/2")
    k, n = res["ktlsd"], res["nginx"]
    rows = [
        (f"10 KiB h2load -c16 -m32 -D{args.duration}, median req/s", median(k["rps"]), median(n["rps"]), ">= 1.2"),
        (f"{size_name(big)} single stream h2load -n1 -c1, median MB/s", median(k["speed"]), median(n["speed"]), ">= 1.0"),
        ("server CPU s per GiB, median", median(k["cpu_per_gib"]), median(n["cpu_per_gib"]), "<= 1.0"),
    ]
    return versus_table(rows, "measure (HTTP/2)"), res


def require_ktls(work, names):
    """Fails unless every response in these ktlsd servers' access logs went out over kTLS."""
    for name in names:
        with open(os.path.join(work, f"{name}.access")) as f:
            modes = {l.rsplit("tls=", 1)[-1].strip() for l in f if "tls=" in l}
        if modes != {"ktls"}:
            raise RuntimeError(f"{name} connections ran in modes {modes}, expected only ktls")


KTLS_BENCH_SIZE = 32 << 20


def ktls_servers(args, work, http2=False):
    """The kTLS scenarios' servers, serving www/32m.bin: ktlsd with kTLS, ktlsd in user
    space, nginx with kTLS (with `http2` on its listen line when `http2`)."""
    root = os.path.join(work, "www")
    os.makedirs(root)
    make_file(os.path.join(root, "32m.bin"), KTLS_BENCH_SIZE)
    return [
        Ktlsd("ktlsd-ktls", args.ktlsd, root, 18443, work, ["--ktls", "on"]),
        Ktlsd("ktlsd-userspace", args.ktlsd, root, 18444, work, ["--ktls", "off"]),
        Nginx("nginx-ktls", root, 18445, work, ktls=True, http2=http2),
    ]


def scenario_ktls(args, work):
    size = KTLS_BENCH_SIZE
    servers = ktls_servers(args, work)
    try:
        log(f"download: 32 MiB x {args.runs} runs each, interleaved")
        dl = download_runs(servers, "32m.bin", size, args.runs)
    finally:
        for s in servers:
            s.stop()
    require_ktls(work, ["ktlsd-ktls"])
    cpu = {n: median(v["cpu_per_gib"]) for n, v in dl.items()}
    spd = {n: median(v["speed"]) for n, v in dl.items()}
    table = ["| server | download MB/s (median) | server CPU s/GiB (median) |", "|---|---|---|"]
    table += [f"| {n} | {spd[n]:.1f} | {cpu[n]:.2f} |" for n in spd]
    table += ["", f"ktlsd kTLS CPU/GiB vs ktlsd userspace: {cpu['ktlsd-ktls'] / cpu['ktlsd-userspace']:.2f}x (goal <= 0.75x)",
              f"ktlsd kTLS CPU/GiB vs nginx kTLS: {cpu['ktlsd-ktls'] / cpu['nginx-ktls']:.2f}x (goal <= 1.0x)"]
    return "\n".join(table), {"download": dl}


def tls_tx_contexts():
    """Kernel TLS transmit contexts installed so far (TlsTxSw + TlsTxDevice), or None without kTLS."""
    try:
        c = proc_counters_flat("/proc/net/tls_stat")
    except OSError:
        return None
    return c.get("TlsTxSw", 0) + c.get("TlsTxDevice", 0)


def proc_counters_flat(path):
    """Counters by name from a `Name value` per line table such as /proc/net/tls_stat."""
    with open(path) as f:
        return {k: int(v) for k, v in (l.split() for l in f if len(l.split()) == 2)}


def h2_download(port, path):
    """One HTTP/2 download on a fresh connection (h2load -n1 -c1): (seconds, DATA bytes)."""
    secs, _, data = h2load(["-n1", "-c1", f"https://127.0.0.1:{port}/{path}"])
    return secs, data


def scenario_ktls_h2(args, work):
    """The kTLS scenario over HTTP/2: one 32 MiB stream per connection (h2load)."""
    size = KTLS_BENCH_SIZE
    servers = ktls_servers(args, work, http2=True)
    res = {s.name: {"speed": [], "cpu_per_gib": [], "ktls_tx": []} for s in servers}
    try:
        log(f"HTTP/2 download: 32 MiB x {args.runs} runs each, interleaved")
        for i in range(args.runs):
            for s in random.sample(servers, len(servers)):
                t0, c0 = tls_tx_contexts(), cpu_seconds(s.pids())
                secs, got = h2_download(s.port, "32m.bin")
                c1, t1 = cpu_seconds(s.pids()), tls_tx_contexts()
                if got != size:
                    raise RuntimeError(f"{s.name}: got {got} bytes of {size}")
                res[s.name]["speed"].append(size / secs / 1e6)
                res[s.name]["cpu_per_gib"].append((c1 - c0) / (size / (1 << 30)))
                res[s.name]["ktls_tx"].append(None if t0 is None else t1 - t0)
            log(f"  run {i + 1}/{args.runs}: " + ", ".join(
                f"{n} {v['speed'][-1]:.0f} MB/s {v['cpu_per_gib'][-1]:.2f} s/GiB kTLS TX {v['ktls_tx'][-1]}"
                for n, v in res.items()))
    finally:
        for s in servers:
            s.stop()
    require_ktls(work, ["ktlsd-ktls"])
    for name in ("ktlsd-ktls", "ktlsd-userspace"):
        with open(os.path.join(work, f"{name}.access")) as f:
            lines = [l for l in f if "32m.bin" in l]
        if len(lines) != args.runs or not all(" HTTP/2.0\" 200 " in l for l in lines):
            raise RuntimeError(f"{name}: expected {args.runs} HTTP/2.0 200 lines, got:\n{''.join(lines)}")
    cpu = {n: median(v["cpu_per_gib"]) for n, v in res.items()}
    spd = {n: median(v["speed"]) for n, v in res.items()}
    tx = {n: "?" if None in v["ktls_tx"] else f"{sum(v['ktls_tx'])}/{len(v['ktls_tx'])}" for n, v in res.items()}
    table = ["| server (HTTP/2, h2load -n1 -c1) | download MB/s (median) | server CPU s/GiB (median) | kTLS TX contexts / connections |",
             "|---|---|---|---|"]
    table += [f"| {n} | {spd[n]:.1f} | {cpu[n]:.3f} | {tx[n]} |" for n in spd]
    table += ["", f"ktlsd kTLS CPU/GiB vs ktlsd userspace: {cpu['ktlsd-ktls'] / cpu['ktlsd-userspace']:.2f}x (goal <= 0.8x)",
              f"ktlsd kTLS CPU/GiB vs nginx kTLS: {cpu['ktlsd-ktls'] / cpu['nginx-ktls']:.2f}x (goal <= 0.9x)"]
    return "\n".join(table), {"download": res}


TAIL_CONDITIONS = [
    ("static:16k", ["--record-size", "static:16k"]),
    ("static:4k", ["--record-size", "static:4k"]),
    ("dynamic", ["--record-size", "dynamic"]),
    ("dynamic-tuned", ["--record-size", "dynamic:hi=16384,threshold=10"]),
    ("adaptive", ["--record-size", "adaptive"]),
]


TAIL_SIZES = {"10KB": 10_000, "100KB": 100_000, "1MB": 1_000_000}
CURL_FIELDS = "%{http_code} %{size_download} %{num_connects} %{time_starttransfer} %{time_total}\\n"


def tail_batch(jobs, resolve):
    """One curl process fetches `jobs` [(server, size)] in order, each on a new
    connection with a full handshake (`Connection: close`, no TLS session reuse),
    so a batch costs one process start instead of one per connection."""
    cmd = ["curl", "-sk", "--no-sessionid", "-H", "Connection: close", "--max-time", "60",
           "-w", CURL_FIELDS, *resolve]
    for s, size in jobs:
        cmd += ["-o", "/dev/null", f"https://localhost:{s.port}/{size}"]
    out = subprocess.run(cmd, text=True, capture_output=True).stdout.splitlines()
    if len(out) != len(jobs):
        raise RuntimeError(f"curl reported {len(out)} of {len(jobs)} transfers")
    rows = []
    for (s, size), line in zip(jobs, out):
        code, got, connects, ttfb, total = line.split()
        if code != "200" or int(got) != TAIL_SIZES[size] or connects != "1":
            raise RuntimeError(f"{s.name} {size}: HTTP {code}, {got} bytes, {connects} new connections")
        rows.append((s.name, size, float(ttfb) * 1000, float(total) * 1000))
    return rows


def tail_batch_h2(jobs, resolve):
    """tail_batch over HTTP/2: curl keeps an h2 connection for every later request
    to the same host and ignores `Connection: close`, so each job gets a host name
    of its own (resolved to 127.0.0.1) and with it a new connection and a full
    handshake."""
    del resolve  # one name per job instead
    cmd = ["curl", "-sk", "--http2", "--no-sessionid", "--max-time", "60",
           "-w", "%{http_version} " + CURL_FIELDS]
    for i, (s, size) in enumerate(jobs):
        host = f"c{i}.localhost"
        cmd += ["--resolve", f"{host}:{s.port}:127.0.0.1", "-o", "/dev/null", f"https://{host}:{s.port}/{size}"]
    out = subprocess.run(cmd, text=True, capture_output=True).stdout.splitlines()
    if len(out) != len(jobs):
        raise RuntimeError(f"curl reported {len(out)} of {len(jobs)} transfers")
    rows = []
    for (s, size), line in zip(jobs, out):
        version, code, got, connects, ttfb, total = line.split()
        if version != "2" or code != "200" or int(got) != TAIL_SIZES[size] or connects != "1":
            raise RuntimeError(f"{s.name} {size}: HTTP/{version} {code}, {got} bytes, {connects} new connections")
        rows.append((s.name, size, float(ttfb) * 1000, float(total) * 1000))
    return rows


def proc_counters(path, prefix):
    """Counters by name from a /proc/net/{snmp,netstat} table (a names line, then a values line)."""
    with open(path) as f:
        names, values = [l.split()[1:] for l in f if l.startswith(prefix)][:2]
    return dict(zip(names, map(int, values)))


def tcp_retransmits():
    return proc_counters("/proc/net/snmp", "Tcp:")["RetransSegs"]


def tcp_ext():
    return proc_counters("/proc/net/netstat", "TcpExt:")


def backlog_drops():
    """Packets dropped because a CPU's receive backlog was full (softnet_stat, 2nd column)."""
    with open("/proc/net/softnet_stat") as f:
        return sum(int(l.split()[1], 16) for l in f)


def scenario_tail(args, work):
    root = os.path.join(work, "www")
    os.makedirs(root)
    for name, n in TAIL_SIZES.items():
        make_file(os.path.join(root, name), n)
    servers, port = [], 18450
    for name, extra in TAIL_CONDITIONS:
        servers.append(Ktlsd(name, args.ktlsd, root, port, work, ["--ktls", args.tail_ktls, *extra]))
        port += 1
    servers.append(Nginx("nginx-16k", root, port, work, ktls=args.tail_ktls != "off", buffer="16k", http2=args.http2))
    resolve = [a for s in servers for a in ("--resolve", f"localhost:{s.port}:127.0.0.1")]
    # Loopback's 64 KiB MTU and segmentation offloads would hand netem one
    # 64 KiB packet where a real link carries 45: give lo a 1500-byte MTU and
    # no offloads, so delay and loss act per real-sized segment.
    sh(["ip", "link", "set", "lo", "mtu", "1500"])
    subprocess.run(["ethtool", "-K", "lo", "tso", "off", "gso", "off", "gro", "off"], capture_output=True)
    # Cold means cold: no ssthresh or RTT carried over from earlier connections.
    # netem releases each delayed burst at once; a longer backlog keeps the
    # receive side from dropping any of it, so netem's loss is the only loss.
    sh(["sysctl", "-qw", "net.ipv4.tcp_no_metrics_save=1", "net.core.netdev_max_backlog=100000"])
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    # netem holds every packet of the delay line in its queue; its default limit of
    # 1000 packets would add drops of its own once a few 1 MB transfers overlap.
    sh(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", args.delay, "loss", args.loss,
        "limit", "100000"])
    plan = [(s, size) for s in servers for size in TAIL_SIZES for _ in range(args.n)]
    random.shuffle(plan)
    batches = [plan[i:i + 40] for i in range(0, len(plan), 40)]
    rows = []
    # Rows are written as they come, so an interrupted run still leaves its data.
    raw = open(os.path.join(args.out, "tail.csv"), "w", newline="")
    out = csv.writer(raw)
    out.writerow(["condition", "size", "ttfb_ms", "total_ms"])
    started, retrans0, backlog0, ext0 = time.monotonic(), tcp_retransmits(), backlog_drops(), tcp_ext()
    try:
        # A few clients at once: each connection mostly waits on the 100 ms round
        # trips, and every condition shares the same concurrency.
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            batch = tail_batch_h2 if args.http2 else tail_batch
            for got in pool.map(lambda b: batch(b, resolve), batches):
                rows += got
                out.writerows(got)
                raw.flush()
                log(f"  {len(rows)}/{len(plan)} connections, {time.monotonic() - started:.0f} s")
        # Every drop should be netem's: report the retransmits it caused and any drop it did not.
        netem = re.search(r"dropped (\d+)", sh(["tc", "-s", "qdisc", "show", "dev", "lo"]))
        log(f"  segments retransmitted: {tcp_retransmits() - retrans0}; netem drops: "
            f"{netem.group(1) if netem else '?'}; receive backlog drops: {backlog_drops() - backlog0}")
        ext = {k: v - ext0.get(k, 0) for k, v in tcp_ext().items()}
        log("  TcpExt: " + " ".join(f"{k}={v}" for k, v in ext.items()
                                    if v and re.search("Drop|Spurious|Timeout|LossProbe|Retrans|Prune|Recover", k)))
    finally:
        raw.close()
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
        subprocess.run(["ip", "link", "set", "lo", "mtu", "65536"], capture_output=True)
        for s in servers:
            s.stop()
    if args.tail_ktls != "off":
        require_ktls(work, [name for name, _ in TAIL_CONDITIONS])
    return tail_report(rows, TAIL_SIZES, [s.name for s in servers], args.out)


def tail_report(rows, sizes, names, out):
    """The tail table and chart from (condition, size, ttfb_ms, total_ms) rows."""
    counts = [sum(1 for r in rows if r[0] == n and r[1] == size) for n in names for size in sizes]
    table = [f"connections per size x condition: {min(counts)} to {max(counts)}", "",
             "| size | condition | TTFB p50 | TTFB p95 | TTFB p99 | total p50 | total p95 |",
             "|---|---|---|---|---|---|---|"]
    stats = {}
    for size in sizes:
        for n in names:
            t = [r[2] for r in rows if r[0] == n and r[1] == size]
            tot = [r[3] for r in rows if r[0] == n and r[1] == size]
            stats[(size, n)] = (pct(t, 50), pct(t, 95), pct(t, 99), pct(tot, 50), pct(tot, 95))
            table.append(f"| {size} | {n} | " + " | ".join(f"{v:.0f}" for v in stats[(size, n)]) + " |")
    cell = lambda n, size, col: [r[col] for r in rows if r[0] == n and r[1] == size]
    goals = [("100KB", "TTFB", 2, 95, 0.72), ("1MB", "total", 3, 95, 1.0), ("10KB", "TTFB", 2, 95, 1.05)]
    table += ["", "adaptive vs static:16k, with a 95% bootstrap interval:"]
    for size, what, col, p, goal in goals:
        r, lo, hi = ratio_ci(cell("adaptive", size, col), cell("static:16k", size, col), p)
        table.append(f"- {size} p{p} {what}: {r:.2f}x [{lo:.2f}, {hi:.2f}] (goal <= {goal}x)")
    chart(stats, rows, sizes, names, os.path.join(out, "tail.png"))
    return "\n".join(table), {"stats": {f"{k[0]} {k[1]}": v for k, v in stats.items()}}


def ratio_ci(a, b, p, rounds=2000):
    """pct(a, p) / pct(b, p), and the 2.5th and 97.5th percentiles of that ratio
    over `rounds` bootstrap resamples of both samples."""
    rng = random.Random(1)
    boot = sorted(pct(rng.choices(a, k=len(a)), p) / pct(rng.choices(b, k=len(b)), p) for _ in range(rounds))
    return pct(a, p) / pct(b, p), pct(boot, 2.5), pct(boot, 97.5)


def chart(stats, rows, sizes, names, path):
    try:
        # Kept beside the results, so its font cache is built once, not in every VM.
        os.environ.setdefault("MPLCONFIGDIR", os.path.join(os.path.dirname(path), ".matplotlib"))
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no chart")
        return
    # Top: p50 and p95 per condition. Bottom: the whole TTFB distribution, where
    # the loss-delayed share (and so where a p95 lands) can be read off.
    fig, axes = plt.subplots(2, len(sizes), figsize=(5 * len(sizes), 8))
    for col, size in enumerate(sizes):
        ax = axes[0][col]
        p50 = [stats[(size, n)][0] for n in names]
        p95 = [stats[(size, n)][1] for n in names]
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], p50, 0.4, label="TTFB p50")
        ax.bar([i + 0.2 for i in x], p95, 0.4, label="TTFB p95")
        ax.set_xticks(list(x), names, rotation=40, ha="right")
        ax.set_title(f"{size}: time to first byte (ms)")
        ax.legend(loc="upper left", fontsize="small")
        ax = axes[1][col]
        for n in names:
            t = sorted(r[2] for r in rows if r[0] == n and r[1] == size)
            ax.step(t, [(i + 1) / len(t) for i in range(len(t))], where="post", label=n)
        ax.axhline(0.95, color="grey", lw=0.5, ls="--")
        ax.set_xlim(250, 1600)
        ax.set_ylim(0.5, 1.0)
        ax.set_xlabel("TTFB (ms)")
        ax.set_ylabel("fraction of connections")
        ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


COLD_FILE_SIZE = 16 << 20


def slow_disk(work, delay_ms, size):
    """An ext4 filesystem on a loop file under dm-delay: every read waits delay_ms
    (writes do not, so filling it is quick). Returns (mount point, teardown)."""
    sh(["modprobe", "loop"])
    sh(["modprobe", "dm-delay"])
    img = os.path.join(work, "slow.img")
    with open(img, "wb") as f:
        f.truncate(size)
    loop = sh(["losetup", "-f", "--show", img]).strip()
    sectors = sh(["blockdev", "--getsz", loop]).strip()
    name = f"ktlsd-slow-{os.getpid()}"
    sh(["dmsetup", "create", name, "--table", f"0 {sectors} delay {loop} 0 {delay_ms} {loop} 0 0"])
    subprocess.run(["dmsetup", "mknodes"], check=False)
    dev = f"/dev/mapper/{name}"
    sh(["mkfs.ext4", "-q", dev])
    mnt = os.path.join(work, "slow")
    os.makedirs(mnt)
    sh(["mount", dev, mnt])

    def teardown():
        for cmd in (["umount", mnt], ["dmsetup", "remove", name], ["losetup", "-d", loop]):
            subprocess.run(cmd, check=False)
    return mnt, teardown


def evict(path):
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def wrk_latency(port, path, duration, conns):
    """The hot file's latency under wrk: (p50 ms, p99 ms, requests/s)."""
    out = sh(["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--latency", f"https://127.0.0.1:{port}/{path}"])
    if re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        raise RuntimeError(f"wrk got errors:\n{out}")
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    pcts = {p: float(v) * unit[u] for p, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)}
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if "50" not in pcts or "99" not in pcts or not rps:
        raise RuntimeError(f"cannot read wrk's latency distribution:\n{out}")
    return pcts["50"], pcts["99"], float(rps.group(1))


def cold_clients(port, root, files, n, rate, stop):
    """n curl loops, each downloading its own cold files in turn (dropped from the
    page cache just before each download, and by no other client meanwhile).
    Returns the threads and a list that collects each download's bytes."""
    import threading
    done, procs = [], {}

    def loop(c):
        mine = files[c::n]
        i = 0
        while not stop.is_set():
            name = mine[i % len(mine)]
            i += 1
            evict(os.path.join(root, name))
            p = subprocess.Popen(["curl", "-sk", "--http1.1", "--limit-rate", rate, "-o", "/dev/null",
                                  "-w", "%{size_download}", f"https://127.0.0.1:{port}/{name}"],
                                 stdout=subprocess.PIPE, text=True)
            procs[c] = p
            out, _ = p.communicate()
            if p.returncode == 0:
                done.append(int(out))
    threads = [threading.Thread(target=loop, args=(c,), daemon=True) for c in range(n)]
    for t in threads:
        t.start()

    def halt():
        stop.set()
        for p in list(procs.values()):
            if p.poll() is None:
                p.terminate()
        for t in threads:
            t.join()
    return halt, done


def sample_wchan(pids, stop, seen):
    """Counts, every 20 ms until stop, where each thread of pids sleeps in the
    kernel (/proc/PID/task/TID/wchan), by thread name: shows what a stalled
    event loop waits for."""
    while not stop.wait(0.02):
        for pid in pids:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as f:
                        comm = f.read().strip()
                    with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                        wchan = f.read().strip() or "running"
                except OSError:  # connections refused or reset: show the start-up lines (fd budget, kTLS)
                    continue
                seen[(comm, wchan)] = seen.get((comm, wchan), 0) + 1


def scenario_cold(args, work):
    import threading
    mnt, teardown = slow_disk(work, args.cold_delay_ms, 512 << 20)
    try:
        hot = os.path.join(mnt, "hot.bin")
        make_file(hot, 10 * 1024)
        files = [f"cold{i}.bin" for i in range(2 * args.cold_clients)]
        for name in files:
            make_file(os.path.join(mnt, name), COLD_FILE_SIZE)
        sh(["sync"])
        rows, raw = [], {}
        makers = [
            ("ktlsd (kTLS)", lambda: Ktlsd("ktlsd", args.ktlsd, mnt, 18443, work, ["--ktls", "on"])),
            ("ktlsd (userspace)", lambda: Ktlsd("ktlsd-us", args.ktlsd, mnt, 18446, work, ["--ktls", "off"])),
            ("nginx default", lambda: Nginx("nginx", mnt, 18444, work)),
            ("nginx aio threads", lambda: Nginx("nginx-aio", mnt, 18445, work, extra="aio threads;")),
        ]
        for label, make in makers:
            for name in files:
                evict(os.path.join(mnt, name))
            s = make()
            try:
                curl_download(f"https://127.0.0.1:{s.port}/hot.bin")  # the hot file is hot
                idle = wrk_latency(s.port, "hot.bin", args.duration, 4)
                halt, done = cold_clients(s.port, mnt, files, args.cold_clients, args.cold_rate, threading.Event())
                time.sleep(2)
                stop_sampling, waits = threading.Event(), {}
                sampler = threading.Thread(target=sample_wchan, args=(s.pids(), stop_sampling, waits), daemon=True)
                sampler.start()
                try:
                    loaded = wrk_latency(s.port, "hot.bin", args.duration, 4)
                finally:
                    stop_sampling.set()
                    halt()
                top = sorted(waits.items(), key=lambda kv: -kv[1])[:8]
                log(f"  {label}: where its threads slept under load (samples): " +
                    ", ".join(f"{c}/{w}={n}" for (c, w), n in top))
            finally:
                s.stop()
            cold_mb = sum(done) / 1e6
            extra = ""
            if isinstance(s, Ktlsd):
                with open(os.path.join(work, f"{s.name}.err")) as f:
                    m = re.search(r"cold_windows=(\d+) readahead_waits=(\d+)", f.read())
                extra = f"cold_windows={m.group(1)} readahead_waits={m.group(2)}" if m else "no counters"
                if s.name == "ktlsd":
                    require_ktls(work, ["ktlsd"])
            log(f"  {label}: idle p50 {idle[0]:.2f} ms p99 {idle[1]:.2f} ms; loaded p50 {loaded[0]:.2f} ms "
                f"p99 {loaded[1]:.2f} ms; {len(done)} cold downloads done {extra}")
            rows.append((label, idle, loaded, len(done), extra))
            raw[label] = {"idle": idle, "loaded": loaded, "cold_downloads_done": len(done), "cold_mb": cold_mb,
                          "counters": extra}
    finally:
        teardown()
    table = [f"Hot 10 KiB file, wrk -t1 -c4 -d{args.duration}s --latency; loaded: {args.cold_clients} curl clients "
             f"at {args.cold_rate}B/s each downloading {COLD_FILE_SIZE >> 20} MiB files dropped from the page cache, "
             f"disk reads delayed {args.cold_delay_ms} ms (dm-delay).", "",
             "| server | idle p50 ms | idle p99 ms | loaded p50 ms | loaded p99 ms | loaded p99 / idle p99 | "
             "hot req/s loaded | cold downloads finished |", "|---|---|---|---|---|---|---|---|"]
    for label, idle, loaded, n, _ in rows:
        if loaded[1] == 0:  # wrk saw no response complete
            table.append(f"| {label} | {idle[0]:.2f} | {idle[1]:.2f} | no response | no response | - | 0 | {n} |")
            continue
        table.append(f"| {label} | {idle[0]:.2f} | {idle[1]:.2f} | {loaded[0]:.2f} | {loaded[1]:.2f} | "
                     f"{loaded[1] / idle[1]:.1f}x | {loaded[2]:.0f} | {n} |")
    table += ["", "Goal: ktlsd's loaded p99 within 2x its idle p99."]
    return "\n".join(table), raw


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=["throughput", "ktls", "tail", "scale", "scale-ktls", "h2", "cold"])
    p.add_argument("--ktlsd", default=os.path.join(REPO, "target/release/ktlsd"))
    p.add_argument("--runs", type=int, default=10, help="download runs per server")
    p.add_argument("--duration", type=int, default=10, help="wrk seconds per round")
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--n", type=int, default=200, help="tail: connections per size x condition")
    p.add_argument("--tail-ktls", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--clients", type=int, default=2, help="tail: curl processes running at once")
    p.add_argument("--delay", default="50ms", help="tail: netem delay, each direction")
    p.add_argument("--loss", default="1%", help="tail: netem loss, each direction (%%)")
    p.add_argument("--quick", action="store_true", help="throughput: 64 MiB instead of 1 GiB")
    p.add_argument("--record-size", help="throughput: ktlsd's --record-size (default: ktlsd's default)")
    p.add_argument("--report-only", action="store_true",
                   help="tail: rebuild the table and chart from an existing results/tail.csv")
    p.add_argument("--scale-conns", default="2000,10000", help="scale: idle connection counts, comma-separated")
    p.add_argument("--scale-ktls-conns", default="1000,2000",
                   help="scale-ktls: idle connection counts, comma-separated")
    p.add_argument("--scale-rounds", type=int, default=3, help="scale: interleaved wrk rounds")
    p.add_argument("--out", default=os.path.join(REPO, "bench/results"))
    p.add_argument("--cold-clients", type=int, default=4, help="cold: clients downloading cold files")
    p.add_argument("--cold-rate", default="2M", help="cold: each cold client's curl --limit-rate")
    p.add_argument("--cold-delay-ms", type=int, default=20, help="cold: dm-delay read delay")
    p.add_argument("--http2", action="store_true",
                   help="ktls, tail: over HTTP/2 (h2load; curl --http2); results under OUT/h2/")
    args = p.parse_args()
    if args.http2:
        if args.scenario not in ("ktls", "tail"):
            p.error("--http2 applies to the ktls and tail scenarios (h2 is HTTP/2 on this machine)")
        args.out = os.path.join(args.out, "h2")
    global WORKERS
    WORKERS = args.workers
    os.makedirs(args.out, exist_ok=True)
    if args.report_only:
        with open(os.path.join(args.out, "tail.csv")) as f:
            rows = [(r["condition"], r["size"], float(r["ttfb_ms"]), float(r["total_ms"])) for r in csv.DictReader(f)]
        names = [n for n, _ in TAIL_CONDITIONS] + ["nginx-16k"]
        table, _ = tail_report(rows, TAIL_SIZES, names, args.out)
        print(table)
        return
    work = tempfile.mkdtemp(prefix="ktlsd-bench-")
    try:
        make_cert(work)
        table, raw = {"throughput": scenario_throughput, "ktls": scenario_ktls_h2 if args.http2 else scenario_ktls,
                      "tail": scenario_tail, "scale": scenario_scale, "h2": scenario_h2,
                      "cold": scenario_cold, "scale-ktls": scenario_scale_ktls}[args.scenario](args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kernel = os.uname().release
    report = f"## {args.scenario} (kernel {kernel}, {WORKERS} workers)\n\n{table}\n"
    print(report)
    with open(os.path.join(args.out, f"{args.scenario}.md"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, f"{args.scenario}.json"), "w") as f:
        json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
