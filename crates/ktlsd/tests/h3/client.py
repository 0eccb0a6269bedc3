#!/usr/bin/python3
"""An HTTP/3 client at frame level for the end-to-end tests (aioquic).

    client.py HOST PORT [--sni NAME] requests JSON
        JSON: a list of {"path": "/f", "method": "GET", "authority": "a.example",
        "headers": [["range", "bytes=0-9"]], "body": "text"}, all sent at once on
        one connection ("body": sent in DATA frames after the HEADERS; "body_len": N
        sends N bytes "b" instead).
        Prints {"cert": the server certificate's SHA-256 (colon-separated hex),
        "retried": whether the server sent a Retry, "responses": one object per
        request: status, interim (the statuses of 1xx heads before it), headers (of
        every head), len, sha256 and the first 4096 bytes of the body as text (or
        "reset": code, "error")}.
    client.py HOST PORT [--sni NAME] wait-close SECONDS
        GET /, print {"status": ...}, then wait for the server to close the
        connection and print {"closed": error code or null, "reason": ...}.
    client.py HOST PORT [--sni NAME] cross-goaway PATH
        GET PATH and print {"status": ...}; then (the test stops the server) wait for
        the server's first GOAWAY, GET PATH again at once (a request crossing it), and
        print {"goaways": the ids of the GOAWAY frames on the server's control stream,
        "second": that request's summary, "closed": error code or null}.
    client.py HOST PORT [--sni NAME] abuse KIND
        KIND: data-first (a DATA frame opens a request stream), qpack-garbage (a
        HEADERS frame QPACK cannot decode), huge-headers (a field section over the
        server's limit), cancel-flood:N:PATH (N requests, each cancelled at once). Prints {"closed": error code or null, "reason": ...,
        "status": ..., "reset": ...}: what the server did about it.

Exit status 0 when it could talk to the server at all; the test judges the rest.
"""

import argparse
import asyncio
import hashlib
import json
import ssl

from cryptography.hazmat.primitives import serialization

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamDataReceived, StreamReset

TIMEOUT = 60


class H3(H3Connection):
    """aioquic's H3Connection, told which streams asked HEAD: it checks every
    response's body against its Content-Length, which a HEAD response states for the
    body it has not (RFC 9110 section 9.3.2)."""

    def __init__(self, quic):
        super().__init__(quic)
        self.head_streams = set()

    def _check_content_length(self, stream):
        if stream.stream_id not in self.head_streams:
            super()._check_content_length(stream)


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3(self._quic)
        self.waiters = {}
        self.terminated = asyncio.get_event_loop().create_future()
        # Bytes of the server's unidirectional streams, for the GOAWAYs on its control
        # stream (aioquic reads their frames but keeps no GOAWAY id).
        self.uni = {}
        self.goaway = asyncio.Event()

    def _finish(self, sid, **extra):
        fut, res = self.waiters.get(sid, (None, None))
        if fut is not None and not fut.done():
            res.update(extra)
            fut.set_result(res)

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            if not self.terminated.done():
                self.terminated.set_result(event)
            for sid in list(self.waiters):
                self._finish(sid, error="connection closed %#x %s" % (event.error_code, event.reason_phrase))
            return
        if isinstance(event, StreamReset):
            self._finish(event.stream_id, reset=event.error_code)
        if isinstance(event, StreamDataReceived) and event.stream_id % 4 == 3:
            self.uni[event.stream_id] = self.uni.get(event.stream_id, b"") + event.data
            if self.goaways():
                self.goaway.set()
        for e in self.h3.handle_event(event):
            if e.stream_id not in self.waiters:
                continue
            res = self.waiters[e.stream_id][1]
            if isinstance(e, HeadersReceived):
                res["headers"].extend((k.decode(), v.decode()) for k, v in e.headers)
            elif isinstance(e, DataReceived):
                res["body"] += e.data
            if e.stream_ended:
                self._finish(e.stream_id)

    def open(self):
        sid = self._quic.get_next_available_stream_id()
        fut = asyncio.get_event_loop().create_future()
        self.waiters[sid] = (fut, {"headers": [], "body": bytearray()})
        return sid, fut

    async def request(self, method, path, authority, headers, body=None):
        sid, fut = self.open()
        fields = [(b":method", method.encode()), (b":scheme", b"https"), (b":authority", authority.encode()),
                  (b":path", path.encode())]
        fields += [(k.encode(), v.encode()) for k, v in headers]
        if method == "HEAD":
            self.h3.head_streams.add(sid)
        self.h3.send_headers(sid, fields, end_stream=body is None)
        if body is not None:
            self.h3.send_data(sid, body.encode(), end_stream=True)
        self.transmit()
        return await asyncio.wait_for(fut, TIMEOUT)

    def goaways(self):
        """The ids of the GOAWAY frames the server's control stream carried so far."""
        for data in self.uni.values():
            kind, i = read_varint(data, 0)
            if kind != 0:  # not the control stream
                continue
            ids = []
            while True:
                ftype, j = read_varint(data, i)
                length, k = read_varint(data, j) if ftype is not None else (None, j)
                if length is None or k + length > len(data):
                    return ids
                if ftype == 0x7:
                    ids.append(read_varint(data[k:k + length], 0)[0])
                i = k + length
        return []

    async def raw(self, data):
        sid, fut = self.open()
        self._quic.send_stream_data(sid, data, end_stream=True)
        self.transmit()
        done, _ = await asyncio.wait([fut, self.terminated], timeout=10, return_when=asyncio.FIRST_COMPLETED)
        return fut.result() if fut.done() else {}


def summary(res):
    headers = res.get("headers", [])
    # Interim (1xx) heads come first, each with its own :status; the last is the final one's.
    statuses = [int(v) for k, v in headers if k == ":status"]
    status = statuses[-1] if statuses else None
    body = bytes(res.get("body", b""))
    out = {"status": status, "interim": statuses[:-1],
           "headers": [[k, v] for k, v in headers if not k.startswith(":")],
           "len": len(body), "sha256": hashlib.sha256(body).hexdigest(),
           "text": body[:4096].decode("latin-1")}
    for k in ("reset", "error"):
        if k in res:
            out[k] = res[k]
    return out


def fingerprint(client):
    cert = client._quic.tls._peer_certificate
    der = cert.public_bytes(serialization.Encoding.DER)
    return ":".join("%02X" % b for b in hashlib.sha256(der).digest())


def read_varint(data, i):
    """The QUIC variable-length integer at `i` and the offset after it, or (None, i)."""
    if i >= len(data):
        return None, i
    size = 1 << (data[i] >> 6)
    if i + size > len(data):
        return None, i
    v = data[i] & 0x3F
    for b in data[i + 1:i + size]:
        v = (v << 8) | b
    return v, i + size


def varint(n):
    if n < 64:
        return bytes([n])
    if n < 16384:
        return (0x4000 | n).to_bytes(2, "big")
    return (0x80000000 | n).to_bytes(4, "big")


ABUSE = {
    # RFC 9114 section 4.1: a request stream must begin with HEADERS (H3_FRAME_UNEXPECTED).
    "data-first": b"\x00" + varint(3) + b"abc",
    # Required Insert Count 0, Base 0, then an indexed static field line whose index
    # runs past the static table (QPACK_DECOMPRESSION_FAILED).
    "qpack-garbage": b"\x01" + varint(6) + b"\x00\x00\xff\xff\xff\x7f",
}


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--sni", default="localhost")
    ap.add_argument("mode", choices=["requests", "abuse", "wait-close", "cross-goaway"])
    ap.add_argument("arg")
    a = ap.parse_args()
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_NONE,
                               server_name=a.sni, max_datagram_frame_size=None)
    async with connect(a.host, a.port, configuration=config, create_protocol=Client, wait_connected=True) as c:
        if a.mode == "requests":
            reqs = json.loads(a.arg)
            tasks = [c.request(r.get("method", "GET"), r["path"], r.get("authority", a.sni),
                               r.get("headers", []), r.get("body", "b" * r["body_len"] if "body_len" in r else None))
                     for r in reqs]
            results = await asyncio.gather(*tasks)
            print(json.dumps({"cert": fingerprint(c), "retried": c._quic._retry_source_connection_id is not None,
                              "responses": [summary(r) for r in results]}))
            return
        if a.mode == "wait-close":
            # One request, then wait (up to ARG seconds) for the server to close the connection.
            res = summary(await c.request("GET", "/", a.sni, []))
            print(json.dumps({"status": res["status"]}), flush=True)
            try:
                ev = await asyncio.wait_for(asyncio.shield(c.terminated), float(a.arg))
                print(json.dumps({"closed": ev.error_code, "reason": ev.reason_phrase}))
            except asyncio.TimeoutError:
                print(json.dumps({"closed": None}))
            return
        if a.mode == "cross-goaway":
            res = summary(await c.request("GET", a.arg, a.sni, []))
            print(json.dumps({"status": res["status"]}), flush=True)
            out = {}
            try:
                await asyncio.wait_for(c.goaway.wait(), 10)
                out["second"] = summary(await c.request("GET", a.arg, a.sni, []))
            except asyncio.TimeoutError:
                out["second"] = None
            try:
                ev = await asyncio.wait_for(asyncio.shield(c.terminated), 10)
                out["closed"] = ev.error_code
            except asyncio.TimeoutError:
                out["closed"] = None
            out["goaways"] = c.goaways()
            print(json.dumps(out))
            return
        if a.arg.startswith("cancel-flood:"):
            # N requests for PATH, each cancelled (STOP_SENDING) as soon as it is sent.
            n, path = a.arg.split(":", 2)[1:]
            for i in range(int(n)):
                sid, _ = c.open()
                c.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
                                        (b":authority", a.sni.encode()), (b":path", path.encode())], end_stream=True)
                c._quic.stop_stream(sid, 0x10C)  # H3_REQUEST_CANCELLED
                c.transmit()
                if c.terminated.done():
                    break
                await asyncio.sleep(0.002)
            out = {}
        elif a.arg == "huge-headers":
            res = await c.request("GET", "/", a.sni, [("x-big-%d" % i, "a" * 1000) for i in range(40)])
            out = summary(res)
        else:
            out = summary(await c.raw(ABUSE[a.arg]))
        try:
            ev = await asyncio.wait_for(asyncio.shield(c.terminated), 5)
            out["closed"] = ev.error_code
            out["reason"] = ev.reason_phrase
        except asyncio.TimeoutError:
            out["closed"] = None
        print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
