"""Processes and the kernel, as the scenarios measure them: running commands, CPU seconds and RSS
from /proc, waiting for a port, test files, and /proc/net counters (tls_stat, TCP retransmits).
Not servers or clients: see servers and clients."""

import os
import re
import resource
import subprocess
import sys
import time


CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def children_cpu_seconds():
    """utime+stime of this process's waited-for children (the clients `sh` ran), in seconds."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


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


def make_file(path, size):
    with open(path, "wb") as f:
        block = os.urandom(1 << 20)
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


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


def proc_counters(path, prefix):
    """Counters by name from a /proc/net/{snmp,netstat} table (a names line, then a values line)."""
    with open(path) as f:
        names, values = [l.split()[1:] for l in f if l.startswith(prefix)][:2]
    return dict(zip(names, map(int, values)))


def proc_counters_flat(path):
    """Counters by name from a `Name value` per line table such as /proc/net/tls_stat."""
    with open(path) as f:
        return {k: int(v) for k, v in (l.split() for l in f if len(l.split()) == 2)}


def tls_tx_contexts():
    """Kernel TLS transmit contexts installed so far (TlsTxSw + TlsTxDevice), or None without kTLS."""
    try:
        c = proc_counters_flat("/proc/net/tls_stat")
    except OSError:
        return None
    return c.get("TlsTxSw", 0) + c.get("TlsTxDevice", 0)


def tcp_retransmits():
    return proc_counters("/proc/net/snmp", "Tcp:")["RetransSegs"]


def tcp_ext():
    return proc_counters("/proc/net/netstat", "TcpExt:")


def backlog_drops():
    """Packets dropped because a CPU's receive backlog was full (softnet_stat, 2nd column)."""
    with open("/proc/net/softnet_stat") as f:
        return sum(int(l.split()[1], 16) for l in f)
