"""The link emulator (bench/linkemu, a small Rust program) between two network namespaces, and
its self-test (`bench/run linkemu --check`).

`Link` makes namespaces `lecli` (the clients') and `lesrv` (the servers'), starts the forwarder,
which creates one TUN device for each side, moves each device into its namespace and gives it an
address (CLI_IP, SRV_IP; MTU 1500), and tears it all down again. Every packet between the two
addresses then crosses the forwarder, which delays it, drops it at random (seeded) and,
if asked, rate-limits and reorders it. TUN devices have no segmentation offloads, so TCP and UDP
GSO batches are cut into MTU-sized packets before the forwarder sees them: loss acts per real
packet, as on a wire. Each namespace's TCP settings are its own (congestion control,
tcp_no_metrics_save), so nothing here changes the host's.

`in_ns(name)` moves the calling thread into a namespace (processes it starts inherit it);
threads created afterwards by that thread start there too."""

import contextlib
import ctypes
import fcntl
import json
import os
import re
import socket
import statistics
import subprocess
import threading
import time

from . import plots
from .system import log

NS_CLI, NS_SRV = "lecli", "lesrv"
DEV_CLI, DEV_SRV = "lecli0", "lesrv0"
CLI_IP, SRV_IP = "10.77.0.1", "10.77.0.2"
CLONE_NEWNET = 0x40000000
LOCK = "/run/lock/ktlsd-linkemu.lock"
HERE = os.path.dirname(os.path.abspath(__file__))
BINARY = os.path.join(os.path.dirname(HERE), "linkemu", "target", "release", "linkemu")

_libc = ctypes.CDLL(None, use_errno=True)


def setns(name):
    """Moves the calling thread into network namespace `name` (a name under /run/netns, or
    a path such as /proc/1/ns/net)."""
    path = name if name.startswith("/") else f"/run/netns/{name}"
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns {name}: {os.strerror(e)}")
    finally:
        os.close(fd)


@contextlib.contextmanager
def in_ns(name):
    """The calling thread in namespace `name` for the block, then back where it was."""
    home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    try:
        setns(name)
        yield
    finally:
        try:
            if _libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
        finally:
            os.close(home)


def run(cmd, ns=None, check=True):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + cmd
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def cpu_ticks(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Link:
    """The two namespaces joined by the forwarder: `delay_ms` each way, `loss` (percent) each
    way, optional `rate_mbit` with a `queue` of packets, `reorder` percent held back by
    `reorder_ms`; `seed` fixes the losses. `cpu`: the core the forwarder is pinned to."""

    def __init__(self, delay_ms, loss, rate_mbit=0, queue=20000, reorder=0, reorder_ms=1, seed=1, cpu=None, rt=True,
                 work="/tmp", binary=BINARY):
        self.stats_path = os.path.join(work, "linkemu-stats.json")
        self.delay_ms, self.loss = delay_ms, loss
        # One link on the machine at a time: the namespaces' names are fixed, and setting up
        # a second link would tear down the first under a running bench.
        self.lock = open(LOCK, "w")
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.lock.close()
            raise RuntimeError(f"another bench holds the link emulator ({LOCK})") from None
        teardown()
        for ns in (NS_CLI, NS_SRV):
            run(["ip", "netns", "add", ns])
        cmd = [binary, "--dev-a", DEV_CLI, "--dev-b", DEV_SRV, "--delay-ms", str(delay_ms), "--loss", str(loss),
               "--rate-mbit", str(rate_mbit), "--queue", str(queue), "--reorder", str(reorder),
               "--reorder-ms", str(reorder_ms), "--seed", str(seed), "--stats", self.stats_path]
        if cpu is not None:
            cmd = ["taskset", "-c", str(cpu)] + cmd
        if rt:
            # The wire is not subject to the machine's load: real-time priority, so a busy core
            # (builds) delays no packet. The kernel's RT throttling still leaves 5% to the rest.
            cmd = ["chrt", "-f", "10"] + cmd
        self.err = open(os.path.join(work, "linkemu.err"), "a")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True)
        try:
            if self.proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"linkemu did not start (exit {self.proc.wait()}); see {self.err.name}")
            for ns, dev, ip, peer in ((NS_CLI, DEV_CLI, CLI_IP, SRV_IP), (NS_SRV, DEV_SRV, SRV_IP, CLI_IP)):
                run(["ip", "link", "set", "dev", dev, "netns", ns])
                run(["ip", "link", "set", "lo", "up"], ns)
                # A point-to-point address: the peer is reached straight through the device.
                run(["ip", "addr", "add", ip, "peer", peer, "dev", dev], ns)
                run(["ip", "link", "set", "dev", dev, "mtu", "1500", "txqueuelen", "10000", "up"], ns)
                # Cold means cold: no ssthresh or RTT carried over from an earlier connection. (The
                # congestion control a namespace starts with is the host's default, which a namespace
                # other than the first may not change: servers that vary it set it per socket.)
                run(["sysctl", "-qw", "net.ipv4.tcp_no_metrics_save=1"], ns)
        except Exception:
            self.close()
            raise

    def stats(self):
        """The forwarder's counters: {"seconds", "a_to_b": {...}, "b_to_a": {...}} (a: the clients)."""
        time.sleep(0.25)  # rewritten every 100 ms
        with open(self.stats_path) as f:
            return json.load(f)

    def cpu(self):
        return cpu_ticks(self.proc.pid)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.err.close()
        teardown()
        self.lock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def teardown():
    for ns in (NS_CLI, NS_SRV):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def snmp(ns, table):
    """/proc/net/snmp's `table` line ("Udp:", "Tcp:") as seen in namespace `ns`."""
    lines = [l.split() for l in run(["cat", "/proc/net/snmp"], ns).splitlines() if l.startswith(table)]
    return dict(zip(lines[0][1:], map(int, lines[1][1:])))


# The self-test.

def ping_rtt(count=50):
    """Mean, min and max RTT (ms) of `count` pings from the clients' namespace to the servers'
    (ping's summary, to 3 decimals; its per-packet times have only 3 significant digits)."""
    out = run(["ping", "-n", "-c", str(count), "-i", "0.02", "-W", "2", SRV_IP], NS_CLI)
    times = [float(t) for t in re.findall(r"time=([\d.]+) ms", out)]
    summary = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/", out)
    if len(times) < count * 0.9 or not summary:
        raise RuntimeError(f"ping: {len(times)} of {count} answered:\n{out[-500:]}")
    return float(summary.group(2)), float(summary.group(1)), float(summary.group(3)), len(times)


def connect_rtt(count=50, port=18990):
    """Median and max time (ms) of a TCP connect (SYN to SYN-ACK: one round trip) from the
    clients' namespace to a listener in the servers'."""
    with in_ns(NS_SRV):
        ls = socket.socket()
    ls.bind((SRV_IP, port))
    ls.listen(128)
    stop = threading.Event()

    def accept():
        ls.settimeout(0.2)
        while not stop.is_set():
            try:
                ls.accept()[0].close()
            except OSError:
                pass
    t = threading.Thread(target=accept)
    t.start()
    times = []
    try:
        with in_ns(NS_CLI):
            for _ in range(count):
                s = socket.socket()
                t0 = time.perf_counter()
                s.connect((SRV_IP, port))
                times.append((time.perf_counter() - t0) * 1000)
                s.close()
    finally:
        stop.set()
        t.join()
        ls.close()
    return statistics.median(times), min(times), max(times), len(times)


UDP_RECEIVER = """
import socket, sys
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
rx.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
rx.settimeout(float(sys.argv[3]))
n = 0
try:
    while rx.recv(2048) != b"end":
        n += 1
except socket.timeout:
    pass
print(n)
"""

UDP_SENDER = """
import socket, sys, time
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tx.connect((sys.argv[1], int(sys.argv[2])))
packets, pps, payload, sent = int(sys.argv[3]), int(sys.argv[4]), b"x" * 200, 0
start = time.perf_counter()
for i in range(packets):
    try:
        tx.send(payload)
        sent += 1
    except OSError:
        pass
    if i % 50 == 49:  # paced, so that no queue on the way overflows
        lag = start + (i + 1) / pps - time.perf_counter()
        if lag > 0:
            time.sleep(lag)
for _ in range(100):  # the end, sent until one gets through (then the port is closed)
    try:
        tx.send(b"end")
    except OSError:
        break
    time.sleep(0.01)
print(sent)
"""


def udp_loss(link, packets=100_000, pps=20_000, port=18991):
    """Sends `packets` UDP datagrams of 200 bytes from the clients' namespace to the servers' at
    `pps` (one process each side), and counts what reached the servers' namespace: (loss %
    measured there, the forwarder's own count of losses %, datagrams lost before the forwarder
    read them, datagrams the forwarder read, datagrams that arrived while the receiver's socket
    buffer was full)."""
    rx = subprocess.Popen(["ip", "netns", "exec", NS_SRV, "/usr/bin/python3", "-c", UDP_RECEIVER, SRV_IP, str(port),
                           "30"], stdout=subprocess.PIPE, text=True)
    if rx.stdout.readline().strip() != "ready":
        raise RuntimeError("UDP receiver did not start")
    before, udp0 = link.stats()["a_to_b"], snmp(NS_SRV, "Udp:")
    tx0 = dev_counters(NS_CLI, DEV_CLI)
    sent = int(run(["/usr/bin/python3", "-c", UDP_SENDER, SRV_IP, str(port), str(packets), str(pps)], NS_CLI))
    got = int(rx.communicate(timeout=60)[0])
    after, udp1 = link.stats()["a_to_b"], snmp(NS_SRV, "Udp:")
    tx1 = dev_counters(NS_CLI, DEV_CLI)
    fwd_in = after["packets_in"] - before["packets_in"]
    fwd_lost = after["lost"] - before["lost"]
    # What reached the servers' namespace: what the receiver took, and what arrived while its
    # socket buffer was full (a loaded machine can keep the receiver off the CPU for a while).
    arrived = got + udp1["RcvbufErrors"] - udp0["RcvbufErrors"]
    # Lost before the forwarder: sends refused, or the clients' device's queue full.
    before_link = (packets - sent) + (tx1["dropped"] - tx0["dropped"])
    return ((1 - arrived / packets) * 100, fwd_lost / fwd_in * 100 if fwd_in else float("nan"), before_link, fwd_in,
            arrived - got)


def dev_counters(ns, dev):
    """A device's TX counters (packets, dropped) in namespace `ns`."""
    got = run(["cat", f"/sys/class/net/{dev}/statistics/tx_packets", f"/sys/class/net/{dev}/statistics/tx_dropped"], ns)
    packets, dropped = map(int, got.split())
    return {"packets": packets, "dropped": dropped}


def tcp_throughput(link, seconds=5, streams=4, port=18992):
    """Bulk TCP from the servers' namespace to the clients' (`streams` connections, `seconds`):
    (Mbit/s, forwarder CPU seconds, packets forwarded, bytes forwarded)."""
    with in_ns(NS_CLI):
        ls = socket.socket()
    ls.bind((CLI_IP, port))
    ls.listen(16)
    total, stop = [0], threading.Event()

    def sink(c):
        buf = bytearray(1 << 20)
        while True:
            n = c.recv_into(buf)
            if not n:
                break
            total[0] += n
        c.close()

    def send():
        with in_ns(NS_SRV):
            s = socket.socket()
        s.connect((CLI_IP, port))
        data = b"\0" * (1 << 20)
        while not stop.is_set():
            s.sendall(data)
        s.close()
    senders = [threading.Thread(target=send) for _ in range(streams)]
    sinks = []
    for th in senders:
        th.start()
        c, _ = ls.accept()
        sinks.append(threading.Thread(target=sink, args=(c,)))
        sinks[-1].start()
    s0, cpu0 = link.stats(), link.cpu()
    b0, t0 = total[0], time.perf_counter()
    time.sleep(seconds)
    b1, t1 = total[0], time.perf_counter()
    s1, cpu1 = link.stats(), link.cpu()
    stop.set()
    for th in senders + sinks:
        th.join()
    ls.close()
    pk = sum(s1[d]["packets_out"] - s0[d]["packets_out"] for d in ("a_to_b", "b_to_a"))
    by = sum(s1[d]["bytes_out"] - s0[d]["bytes_out"] for d in ("a_to_b", "b_to_a"))
    return (b1 - b0) * 8 / (t1 - t0) / 1e6, cpu1 - cpu0, pk, by


def check(args, work):
    """`bench/run linkemu --check`: the RTT, loss and throughput goals; a Markdown report."""
    delay = float(args.delay.rstrip("ms"))
    losses = [float(x.rstrip("%")) for x in args.loss.split(",") if x]
    lines, ok, bars = [], True, []
    lines += ["| check | configured | measured | goal | result |", "|---|---|---|---|---|"]

    def row(what, conf, got, goal, passed):
        nonlocal ok
        ok &= passed
        lines.append(f"| {what} | {conf} | {got} | {goal} | {'pass' if passed else 'FAIL'} |")
    cpu = args.linkemu_cpu
    with Link(delay, 0, cpu=cpu, work=work) as link:
        for what, (med, mn, mx, n) in (("ping RTT", ping_rtt()), ("TCP connect RTT", connect_rtt())):
            bars.append((f"{what} / (2 x {delay:g} ms), min to max", med / (2 * delay), mn / (2 * delay),
                         mx / (2 * delay)))
            row(f"{what} ({'mean' if what.startswith('ping') else 'median'} of {n}; min {mn:.2f}, max {mx:.2f} ms)", f"2 x {delay:g} ms", f"{med:.2f} ms",
                "within 1 ms", abs(med - 2 * delay) <= 1.0)
        mbit, fcpu, pk, by = tcp_throughput(link)
        need = args.linkemu_need_mbit
        row(f"TCP throughput, 4 streams, {delay:g} ms each way", "0% loss", f"{mbit:.0f} Mbit/s",
            f">= {need} Mbit/s", mbit >= need)
        cost = [f"forwarder CPU at {mbit:.0f} Mbit/s ({delay:g} ms): {fcpu / pk * 1e6:.2f} us per packet, "
                f"{fcpu / (by / 2**30):.2f} CPU s/GiB, {fcpu / 5 * 100:.0f}% of a core"]
    with Link(0, 0, cpu=cpu, work=work) as link:
        mbit0, fcpu, pk, by = tcp_throughput(link)
        cost.append(f"forwarder CPU at {mbit0:.0f} Mbit/s (no delay; the forwarder's ceiling with the bench's "
                    f"own sender and receiver on this machine): {fcpu / pk * 1e6:.2f} us per packet, "
                    f"{fcpu / (by / 2**30):.2f} CPU s/GiB, {fcpu / 5 * 100:.0f}% of a core")
        row("TCP throughput, 4 streams, no delay", "0% loss", f"{mbit0:.0f} Mbit/s", "(the ceiling)", True)
    for loss in losses:
        with Link(delay, loss, cpu=cpu, work=work, seed=args.linkemu_seed) as link:
            got, fwd, early, n, full = udp_loss(link)
            # The binomial 95% interval of the measured rate, as a check of the seeded draw.
            half = 1.96 * (got / 100 * (1 - got / 100) / 100_000) ** 0.5 * 100
            bars.append((f"loss measured / configured {loss:g}%, 95% binomial interval", got / loss,
                         (got - half) / loss, (got + half) / loss))
            row(f"UDP loss over 100,000 datagrams, counted in the servers' namespace (the forwarder counted "
                f"{fwd:.3f}% of the {n} it read; lost before it: {early}; arrived at a full socket buffer: {full})",
                f"{loss:g}%", f"{got:.3f}%", "within 0.2 points", abs(got - loss) <= 0.2 and early == 0)
    where = (f"forwarder pinned to CPU {cpu}" if cpu is not None else "forwarder not pinned")
    text = "\n".join([f"linkemu self-test ({where}; {os.cpu_count()} CPUs on this machine, shared)", "", *lines, "",
                      *[f"- {c}" for c in cost], "", f"result: {'pass' if ok else 'FAIL'}"])
    log(text)
    plots.ratio_bars(os.path.join(args.out, "linkemu.svg"), bars, f"linkemu --check: measured / configured ({where})",
                     "measured / configured (1 = exact)")
    return text, {"passed": ok, "throughput_mbit": mbit, "throughput_nodelay_mbit": mbit0}
