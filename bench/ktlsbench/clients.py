"""Load generators and their parsing: curl downloads, wrk and h2load runs, and the asyncio client
that holds many idle TLS connections (open_idle, idle_memory)."""

import random
import re
import time

from .system import children_cpu_seconds, cpu_seconds, log, rss_kib, sh, tls_tx_contexts


def curl_download(url, extra=()):
    out = sh(["curl", "-sk", "-o", "/dev/null", "-w",
              "%{http_code} %{size_download} %{speed_download} %{time_starttransfer} %{time_total}",
              *extra, url])
    code, size, speed, ttfb, total = out.split()
    if code not in ("200", "206"):
        raise RuntimeError(f"{url}: HTTP {code}")
    return int(size), float(speed), float(ttfb), float(total)


def download_runs(servers, path, size, runs):
    """Interleaved single-connection HTTP/1.1 downloads: speed (MB/s), server CPU s/GiB and the
    kernel TLS transmit contexts each download installed (None without kTLS in the kernel), and
    curl's own CPU time over the download's wall time (in cores: near 1.00, curl set the speed)."""
    res = {s.name: {"speed": [], "cpu_per_gib": [], "ktls_tx": [], "client_cores": []} for s in servers}
    for i in range(runs):
        order = servers[:]
        random.shuffle(order)
        for s in order:
            t0, c0, w0 = tls_tx_contexts(), cpu_seconds(s.pids()), children_cpu_seconds()
            got, speed, _, total = curl_download(f"https://localhost:{s.port}/{path}",
                                             ["--http1.1", "--resolve", f"localhost:{s.port}:127.0.0.1"])
            c1, t1 = cpu_seconds(s.pids()), tls_tx_contexts()
            res[s.name]["client_cores"].append((children_cpu_seconds() - w0) / total)
            res[s.name]["ktls_tx"].append(None if t0 is None else t1 - t0)
            if got != size:
                raise RuntimeError(f"{s.name}: got {got} bytes of {size}")
            res[s.name]["speed"].append(speed / 1e6)
            res[s.name]["cpu_per_gib"].append((c1 - c0) / (size / (1 << 30)))
        log(f"  run {i + 1}/{runs}: " + ", ".join(
            f"{s.name} {res[s.name]['speed'][-1]:.0f} MB/s" for s in servers))
    return res


def wrk_rps(s, path, conns, duration, extra=(), threads=2, client=None):
    """Runs wrk against s; returns (requests/s, server CPU microseconds per request). With a
    list as `client`, appends wrk's own CPU time over the run's wall time to it (in cores)."""
    c0, w0, t0 = cpu_seconds(s.pids()), children_cpu_seconds(), time.monotonic()
    out = sh(["wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s", *extra, f"https://127.0.0.1:{s.port}/{path}"])
    cpu = cpu_seconds(s.pids()) - c0
    if client is not None:
        client.append((children_cpu_seconds() - w0) / (time.monotonic() - t0))
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    n = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if not m or not n or bad or int(n.group(1)) == 0:
        raise RuntimeError(f"wrk against {s.name} failed:\n{out}")
    return float(m.group(1)), cpu * 1e6 / int(n.group(1))


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


def h2_download(port, path):
    """One HTTP/2 download on a fresh connection (h2load -n1 -c1): (seconds, DATA bytes)."""
    secs, _, data = h2load(["-n1", "-c1", f"https://127.0.0.1:{port}/{path}"])
    return secs, data


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


def negotiated_suite(port):
    """The TLS suite the server at port chooses for an OpenSSL client with its default order (as wrk's)."""
    import socket
    import ssl
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with ctx.wrap_socket(sock, server_hostname="localhost") as t:
            return t.cipher()[0]
