#!/usr/bin/python3
"""Hostile raw UDP at an HTTP/3 port, for the end-to-end tests: datagrams no QUIC
client sends, from one socket, as fast as it can.

    hostile.py HOST PORT [--initials N]

Sends, in order: random bytes of every length class; truncated Initial packets
(a real client Initial, built by aioquic, cut short at many points); N Initials
(default 10000), each a new connection with its own random Destination Connection
ID; datagrams of the largest UDP payload (65507 bytes); packets the size and shape
of a stateless reset (a short header and random bytes, 21 to 42 bytes); long
headers with versions the server does not speak (which must draw a Version
Negotiation packet, RFC 9000 section 6) and a Version Negotiation packet sent to
the server (which must draw nothing). Then prints JSON: {"sent": datagrams sent by
kind, "version_negotiation": how many Version Negotiation packets came back to the
unknown-version packets (told apart by the Source Connection ID each one echoes as
its Destination Connection ID), "vn_other": Version Negotiation packets that came
back to anything else (random bytes can look like a long header of an unknown
version), "vn_versions": the versions the first one offered}.
"""

import argparse
import json
import os
import select
import socket
import ssl
import struct
import time

from aioquic.h3.connection import H3_ALPN
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

MAX_UDP = 65507


def initial(host, port):
    """A real client's first datagram (an Initial carrying a ClientHello, padded to 1200 bytes)."""
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_NONE,
                               server_name="localhost")
    conn = QuicConnection(configuration=config)
    conn.connect((host, port), now=time.time())
    return conn.datagrams_to_send(now=time.time())[0][0]


def long_header(version, size, scid):
    """A long-header packet of `version` padded to `size` bytes: connection IDs of 8 bytes, then noise."""
    head = bytes([0xC0]) + struct.pack("!I", version) + bytes([8]) + os.urandom(8) + bytes([len(scid)]) + scid
    return head + os.urandom(size - len(head))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--initials", type=int, default=10000)
    a = ap.parse_args()
    target = (a.host, a.port)
    s = socket.socket(socket.AF_INET6 if ":" in a.host else socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.setblocking(False)
    sent = {}
    vn = {"count": 0, "other": 0, "versions": None}
    # Source Connection IDs of the unknown-version packets that must each draw one answer.
    awaited = set()

    def drain():
        # Counts the Version Negotiation packets among the answers (version field 0).
        while select.select([s], [], [], 0)[0]:
            data = s.recv(MAX_UDP)
            if len(data) >= 7 and data[0] & 0x80 and data[1:5] == b"\0\0\0\0":
                dcid_len = data[5]
                if data[6:6 + dcid_len] not in awaited:
                    vn["other"] += 1
                    continue
                vn["count"] += 1
                if vn["versions"] is None:
                    scid_len = data[6 + dcid_len]
                    rest = data[7 + dcid_len + scid_len:]
                    vn["versions"] = ["%#x" % v for (v,) in struct.iter_unpack("!I", rest[: len(rest) // 4 * 4])]

    def send(kind, datagram):
        for _ in range(100):
            try:
                s.sendto(datagram, target)
                break
            except BlockingIOError:
                time.sleep(0.001)
        sent[kind] = sent.get(kind, 0) + 1
        if sent[kind] % 256 == 0:
            drain()

    for length in (1, 2, 5, 20, 21, 64, 1199, 1200, 1350, 1500, 9000):
        for _ in range(20):
            send("random", os.urandom(length))
    first = initial(*target)
    for cut in range(1, len(first), 7):
        send("truncated-initial", first[:cut])
    for _ in range(a.initials):
        send("initial-flood", initial(*target))
    for _ in range(20):
        send("oversized", os.urandom(MAX_UDP))
        send("oversized-initial", first + os.urandom(MAX_UDP - len(first)))
    for length in range(21, 43):
        send("stateless-reset-shaped", bytes([0x40 | os.urandom(1)[0] & 0x3F]) + os.urandom(length - 1))
    for version in (0x1A2A3A4A, 0xFF00001D, 0x00000002, 0x6B3343CF):
        scid = os.urandom(8)
        awaited.add(scid)
        send("unknown-version", long_header(version, 1200, scid))
    # Too short for a Version Negotiation answer (RFC 9000 section 14.1: only datagrams of 1200 bytes or more).
    scid = os.urandom(8)
    awaited.add(scid)
    send("unknown-version-short", long_header(0x1A2A3A4A, 100, scid))
    scid = os.urandom(8)
    awaited.add(scid)
    send("version-negotiation", long_header(0, 60, scid))
    deadline = time.time() + 2
    while time.time() < deadline:
        drain()
        time.sleep(0.05)
    print(json.dumps({"sent": sent, "version_negotiation": vn["count"], "vn_other": vn["other"], "vn_versions": vn["versions"]}))


if __name__ == "__main__":
    main()
