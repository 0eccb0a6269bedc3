#!/usr/bin/python3
"""An HTTP/2 connection across a reload, frame by frame (RFC 9113 section 6.8).

Opens a TLS connection with ALPN `h2`, exchanges the prefaces and SETTINGS, then
prints `ready` and waits for a line on stdin (the test reloads the server
meanwhile). Then it reads what the server sends: the first GOAWAY and the PING
that goes with it. It sends a GET of PATH on stream 1 after that GOAWAY (a request
that crossed it), then the PING's ACK, and reads until the server closes.

Prints one JSON line: every GOAWAY as [last-stream-id, error code], the PING's
payload (hex), the response's status and body SHA-256, and whether the server
closed the connection.

usage: h2_goaway.py HOST PORT PATH
"""

import hashlib
import json
import socket
import ssl
import sys

import hpack
from hyperframe.frame import DataFrame, Frame, GoAwayFrame, HeadersFrame, PingFrame, SettingsFrame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TIMEOUT = 10.0


class Reader:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.closed = False

    def frame(self):
        """The next frame, or None once the server has closed."""
        while True:
            if len(self.buf) >= 9:
                f, length = Frame.parse_frame_header(memoryview(self.buf[:9]))
                if len(self.buf) >= 9 + length:
                    f.parse_body(memoryview(self.buf[9:9 + length]))
                    self.buf = self.buf[9 + length:]
                    return f
            try:
                chunk = self.sock.recv(65536)
            except (ssl.SSLError, ConnectionError):
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            self.buf += chunk


def main():
    host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    sock = ctx.wrap_socket(socket.create_connection((host, port), timeout=TIMEOUT), server_hostname="localhost")
    assert sock.selected_alpn_protocol() == "h2", sock.selected_alpn_protocol()
    sock.sendall(PREFACE + SettingsFrame(0).serialize())
    reader = Reader(sock)
    while True:
        f = reader.frame()
        assert f is not None, "closed before its SETTINGS"
        if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
            sock.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
            break
    print("ready", flush=True)
    sys.stdin.readline()

    out = {"goaways": [], "ping": None, "status": None, "sha256": None, "closed": False}
    # After the reload: the first GOAWAY and its PING, in whatever order.
    while not out["goaways"] or out["ping"] is None:
        f = reader.frame()
        if f is None:
            break
        if isinstance(f, GoAwayFrame):
            out["goaways"].append([f.last_stream_id, f.error_code])
        elif isinstance(f, PingFrame) and "ACK" not in f.flags:
            out["ping"] = f.opaque_data.hex()
    if out["ping"] is not None and not reader.closed:
        # A request that crossed the GOAWAY, then the PING's ACK.
        fields = [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", path)]
        headers = HeadersFrame(1, hpack.Encoder().encode(fields), flags=["END_HEADERS", "END_STREAM"])
        ack = PingFrame(0, bytes.fromhex(out["ping"]), flags=["ACK"])
        sock.sendall(headers.serialize() + ack.serialize())
        decoder, body = hpack.Decoder(), b""
        while True:
            f = reader.frame()
            if f is None:
                break
            if isinstance(f, GoAwayFrame):
                out["goaways"].append([f.last_stream_id, f.error_code])
            elif isinstance(f, HeadersFrame) and f.stream_id == 1:
                out["status"] = int(dict(decoder.decode(f.data))[":status"])
            elif isinstance(f, DataFrame) and f.stream_id == 1:
                body += f.data
                if "END_STREAM" in f.flags:
                    out["sha256"] = hashlib.sha256(body).hexdigest()
    out["closed"] = reader.closed
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
