#!/usr/bin/python3
"""HTTP/2 frame-level conformance checks for a TLS server (RFC 9113, RFC 7541),
section by section as a conformance tool such as h2spec does, plus the limits
against known HTTP/2 attacks.

Each case opens its own TLS connection with ALPN `h2`, sends the client preface
and an empty SETTINGS frame, acknowledges the server's SETTINGS, then sends the
frames under test and checks the server's answer: a response, a PING ACK, a
RST_STREAM or GOAWAY with the error code the RFC requires. As in h2spec, a
connection error may also be shown by closing the connection after GOAWAY.

usage: conformance.py HOST PORT --path /FILE [-k SUBSTRING] [--list]
  --path names a file of at least 64 bytes on the server (used where a case
  needs a response body). Exit status 0 when every selected case passes.
"""

import argparse
import socket
import ssl
import struct
import sys
import time

import hpack
from hyperframe.frame import (
    ContinuationFrame, DataFrame, Frame, GoAwayFrame, HeadersFrame, PingFrame,
    PriorityFrame, RstStreamFrame, SettingsFrame, WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
SETTINGS_TIMEOUT, STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM = 0x4, 0x5, 0x6, 0x7
CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x8, 0x9, 0xB

TIMEOUT = 3.0


class Failed(Exception):
    pass


class Closed(Exception):
    pass


def raw_frame(ftype, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


class Conn:
    def __init__(self, host, port, authority):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection((host, port), timeout=TIMEOUT)
        self.sock = ctx.wrap_socket(raw, server_hostname=authority)
        if self.sock.selected_alpn_protocol() != "h2":
            raise Failed(f"ALPN selected {self.sock.selected_alpn_protocol()!r}, not h2")
        self.authority = authority
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.buf = b""
        self.server_settings = {}

    def send(self, data):
        try:
            self.sock.sendall(data)
        except (ConnectionError, ssl.SSLError, OSError) as e:
            raise Closed(str(e))

    def send_frame(self, f):
        self.send(f.serialize())

    def _fill(self, deadline):
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError("no frame in time")
            except (ConnectionError, ssl.SSLError, OSError) as e:
                raise Closed(str(e))
            if not chunk:
                raise Closed("connection closed")
            self.buf += chunk
            return

    def read_frame(self, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while len(self.buf) < 9:
            self._fill(deadline)
        f, length = Frame.parse_frame_header(memoryview(self.buf[:9]))
        while len(self.buf) < 9 + length:
            self._fill(deadline)
        body, self.buf = self.buf[9:9 + length], self.buf[9 + length:]
        f.parse_body(memoryview(body))
        if isinstance(f, (HeadersFrame, ContinuationFrame)):
            f.decoded = None
        return f

    def handshake(self):
        self.send(PREFACE)
        self.send_frame(SettingsFrame(0))
        deadline = time.monotonic() + TIMEOUT
        while True:
            f = self.read_frame(max(0.1, deadline - time.monotonic()))
            if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
                self.server_settings = dict(f.settings)
                self.send_frame(SettingsFrame(0, flags=["ACK"]))
                return

    def headers_block(self, extra=(), method="GET", path="/", base=True):
        hs = []
        if base:
            hs = [(":method", method), (":scheme", "https"), (":path", path), (":authority", self.authority)]
        return self.enc.encode(hs + list(extra))

    def request(self, stream, path="/", end_stream=True, extra=(), method="GET"):
        f = HeadersFrame(stream)
        f.data = self.headers_block(extra, method=method, path=path)
        f.flags.add("END_HEADERS")
        if end_stream:
            f.flags.add("END_STREAM")
        self.send_frame(f)

    def frames(self, timeout=TIMEOUT):
        """Yields frames until `timeout` passes without one or the connection closes."""
        while True:
            try:
                yield self.read_frame(timeout)
            except (TimeoutError, Closed):
                return


def code_name(code):
    names = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
             4: "SETTINGS_TIMEOUT", 5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM",
             8: "CANCEL", 9: "COMPRESSION_ERROR", 0xB: "ENHANCE_YOUR_CALM"}
    return names.get(code, hex(code))


def expect_connection_error(c, *codes):
    """A GOAWAY with one of `codes`, then the connection closes (or closing at once)."""
    seen = []
    try:
        while True:
            f = c.read_frame()
            seen.append(type(f).__name__)
            if isinstance(f, GoAwayFrame):
                if f.error_code not in codes:
                    raise Failed(f"GOAWAY {code_name(f.error_code)}, expected {'/'.join(map(code_name, codes))}")
                for _ in c.frames(2.0):
                    pass
                return
    except Closed:
        return
    except TimeoutError:
        raise Failed(f"no GOAWAY ({'/'.join(map(code_name, codes))}) and no close; saw {seen}")


def expect_stream_error(c, stream, *codes):
    """RST_STREAM on `stream` with one of `codes`; a connection error with the code also conforms."""
    seen = []
    try:
        while True:
            f = c.read_frame()
            seen.append(type(f).__name__)
            if isinstance(f, RstStreamFrame) and f.stream_id == stream:
                if f.error_code not in codes:
                    raise Failed(f"RST_STREAM {code_name(f.error_code)}, expected {'/'.join(map(code_name, codes))}")
                return
            if isinstance(f, GoAwayFrame):
                if f.error_code not in codes:
                    raise Failed(f"GOAWAY {code_name(f.error_code)}, expected {'/'.join(map(code_name, codes))}")
                return
    except Closed:
        return
    except TimeoutError:
        raise Failed(f"no RST_STREAM/GOAWAY ({'/'.join(map(code_name, codes))}); saw {seen}")


def expect_ping_ack(c, data):
    for f in c.frames():
        if isinstance(f, PingFrame) and "ACK" in f.flags:
            if f.opaque_data != data:
                raise Failed(f"PING ACK carries {f.opaque_data!r}, expected {data!r}")
            return
        if isinstance(f, GoAwayFrame):
            raise Failed(f"GOAWAY {code_name(f.error_code)} instead of PING ACK")
    raise Failed("no PING ACK (connection closed or silent)")


def expect_alive(c):
    """The connection still works: a PING is answered."""
    data = b"alive!!!"
    c.send_frame(PingFrame(0, opaque_data=data))
    expect_ping_ack(c, data)


def read_response(c, stream):
    """Returns (headers dict, body bytes) for `stream`, opening windows as needed."""
    headers, body = None, b""
    for f in c.frames():
        if isinstance(f, GoAwayFrame):
            raise Failed(f"GOAWAY {code_name(f.error_code)} instead of a response")
        if isinstance(f, RstStreamFrame) and f.stream_id == stream:
            raise Failed(f"RST_STREAM {code_name(f.error_code)} instead of a response")
        if f.stream_id != stream:
            continue
        if isinstance(f, HeadersFrame):
            if headers is None:
                headers = {k.encode() if isinstance(k, str) else k: v.encode() if isinstance(v, str) else v for k, v in c.dec.decode(f.data)}
            if "END_STREAM" in f.flags:
                return headers, body
        elif isinstance(f, DataFrame):
            body += f.data
            if f.flow_controlled_length:
                c.send_frame(WindowUpdateFrame(0, window_increment=f.flow_controlled_length))
                c.send_frame(WindowUpdateFrame(stream, window_increment=f.flow_controlled_length))
            if "END_STREAM" in f.flags:
                return headers, body
    raise Failed(f"no complete response on stream {stream}")


CASES = []


def case(name):
    def wrap(fn):
        CASES.append((name, fn))
        return fn
    return wrap


# --- 3.4 / 3.5: starting HTTP/2 -----------------------------------------------------------

@case("3.4/1 server sends SETTINGS first and acknowledges ours")
def _(c, a):
    c.send(PREFACE)
    c.send_frame(SettingsFrame(0))
    first = c.read_frame()
    if not isinstance(first, SettingsFrame) or "ACK" in first.flags:
        raise Failed(f"first frame is {type(first).__name__}, not SETTINGS")
    c.send_frame(SettingsFrame(0, flags=["ACK"]))
    for f in c.frames():
        if isinstance(f, SettingsFrame) and "ACK" in f.flags:
            return
    raise Failed("no SETTINGS ACK")


@case("3.4/2 invalid connection preface")
def _(c, a):
    c.send(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")
    c.send_frame(SettingsFrame(0))
    expect_connection_error(c, PROTOCOL_ERROR)


# --- 4.1 / 4.2 / 4.3: frames ----------------------------------------------------------------

@case("4.1/1 unknown frame type is ignored")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x16, 0, 0, b"ignored"))
    expect_alive(c)


@case("4.1/2 undefined flags are ignored")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x6, 0x16, 0, b"12345678"))
    expect_ping_ack(c, b"12345678")


@case("4.1/3 the reserved bit of the stream id is ignored")
def _(c, a):
    c.handshake()
    f = HeadersFrame(1)
    f.data = c.headers_block(path=a.path)
    f.flags.add("END_HEADERS"); f.flags.add("END_STREAM")
    wire = bytearray(f.serialize())
    wire[5] |= 0x80
    c.send(bytes(wire))
    h, _ = read_response(c, 1)
    if h.get(b":status") != b"200":
        raise Failed(f"status {h.get(b':status')}")


@case("4.2/1 DATA of SETTINGS_MAX_FRAME_SIZE is accepted")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST", extra=[("content-length", "16384")])
    c.send_frame(DataFrame(1, data=b"x" * 16384, flags=["END_STREAM"]))
    for f in c.frames():
        if isinstance(f, HeadersFrame) and f.stream_id == 1:
            return
        if isinstance(f, GoAwayFrame):
            raise Failed(f"GOAWAY {code_name(f.error_code)}")
    raise Failed("no response")


@case("4.2/2 DATA over SETTINGS_MAX_FRAME_SIZE")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST")
    c.send(raw_frame(0x0, 0x1, 1, b"x" * 16385))
    expect_stream_error(c, 1, FRAME_SIZE_ERROR)


@case("4.2/3 HEADERS over SETTINGS_MAX_FRAME_SIZE")
def _(c, a):
    c.handshake()
    block = c.headers_block(extra=[("x-filler", "y" * 20000)])
    assert len(block) > 16384
    c.send(raw_frame(0x1, 0x5, 1, block))
    expect_connection_error(c, FRAME_SIZE_ERROR)


@case("4.3/1 invalid header block fragment")
def _(c, a):
    c.handshake()
    # An indexed field with index 0 is a decoding error (RFC 7541 section 6.1).
    c.send(raw_frame(0x1, 0x5, 1, b"\x80"))
    expect_connection_error(c, COMPRESSION_ERROR)


@case("4.3/2 PRIORITY in the middle of a header block")
def _(c, a):
    c.handshake()
    block = c.headers_block()
    c.send(raw_frame(0x1, 0x1, 1, block[:3]))  # END_STREAM, no END_HEADERS
    c.send(raw_frame(0x2, 0x0, 1, b"\x00\x00\x00\x00\x10"))
    c.send(raw_frame(0x9, 0x4, 1, block[3:]))
    expect_connection_error(c, PROTOCOL_ERROR)


# --- 5.1: stream states -------------------------------------------------------------------

@case("5.1/1 idle: DATA")
def _(c, a):
    c.handshake()
    c.send_frame(DataFrame(1, data=b"x", flags=["END_STREAM"]))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("5.1/2 idle: RST_STREAM")
def _(c, a):
    c.handshake()
    c.send_frame(RstStreamFrame(1, error_code=CANCEL))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("5.1/3 idle: WINDOW_UPDATE")
def _(c, a):
    c.handshake()
    c.send_frame(WindowUpdateFrame(1, window_increment=100))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("5.1/4 idle: CONTINUATION")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x9, 0x4, 1, c.headers_block()))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("5.1/5 half-closed (remote): DATA")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path)
    c.send_frame(DataFrame(1, data=b"x", flags=["END_STREAM"]))
    expect_stream_error(c, 1, STREAM_CLOSED)


@case("5.1/6 half-closed (remote): HEADERS")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path)
    c.request(1, path=a.path)
    expect_stream_error(c, 1, STREAM_CLOSED)


@case("5.1/7 half-closed (remote): CONTINUATION")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path)
    c.send(raw_frame(0x9, 0x4, 1, c.headers_block(base=False, extra=[("x-a", "b")])))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("5.1/8 closed: DATA after RST_STREAM")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST")
    c.send_frame(RstStreamFrame(1, error_code=CANCEL))
    c.send_frame(DataFrame(1, data=b"x"))
    expect_stream_error(c, 1, STREAM_CLOSED)


@case("5.1/9 closed: HEADERS after the stream ended")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path)
    read_response(c, 1)
    c.request(1, path=a.path)
    expect_connection_error(c, STREAM_CLOSED, PROTOCOL_ERROR)


@case("5.1.1/1 even-numbered stream id")
def _(c, a):
    c.handshake()
    c.request(2, path=a.path)
    expect_connection_error(c, PROTOCOL_ERROR)


@case("5.1.1/2 stream id lower than an earlier one")
def _(c, a):
    c.handshake()
    c.request(5, path=a.path)
    c.request(3, path=a.path)
    expect_connection_error(c, PROTOCOL_ERROR, STREAM_CLOSED)


@case("5.1.2/1 more streams than SETTINGS_MAX_CONCURRENT_STREAMS")
def _(c, a):
    c.handshake()
    limit = c.server_settings.get(SettingsFrame.MAX_CONCURRENT_STREAMS)
    if limit is None or limit > 1000:
        raise Failed(f"server advertises no practical SETTINGS_MAX_CONCURRENT_STREAMS ({limit})")
    # Requests whose bodies never come keep their streams open.
    for i in range(limit):
        c.request(1 + 2 * i, path=a.path, end_stream=False, method="POST")
    over = 1 + 2 * limit
    c.request(over, path=a.path, end_stream=False, method="POST")
    expect_stream_error(c, over, PROTOCOL_ERROR, REFUSED_STREAM)


# --- 5.3 / 5.4 / 5.5 --------------------------------------------------------------------

@case("5.3.1/1 HEADERS depending on its own stream")
def _(c, a):
    c.handshake()
    f = HeadersFrame(1, depends_on=1, stream_weight=16)
    f.data = c.headers_block(path=a.path)
    f.flags.add("END_HEADERS"); f.flags.add("END_STREAM"); f.flags.add("PRIORITY")
    c.send_frame(f)
    expect_stream_error(c, 1, PROTOCOL_ERROR)


@case("5.3.1/2 PRIORITY depending on its own stream")
def _(c, a):
    c.handshake()
    c.send_frame(PriorityFrame(1, depends_on=1, stream_weight=16))
    expect_stream_error(c, 1, PROTOCOL_ERROR)


@case("5.5/1 unknown extension frame is ignored")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0xFF, 0, 0, b"x" * 8))
    expect_alive(c)


@case("5.5/2 unknown frame in the middle of a header block")
def _(c, a):
    c.handshake()
    block = c.headers_block()
    c.send(raw_frame(0x1, 0x1, 1, block[:3]))
    c.send(raw_frame(0xFF, 0, 1, b"x"))
    c.send(raw_frame(0x9, 0x4, 1, block[3:]))
    expect_connection_error(c, PROTOCOL_ERROR)


# --- 6.1 DATA ----------------------------------------------------------------------------

@case("6.1/1 DATA on stream 0")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x0, 0x1, 0, b"x"))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.1/2 DATA on a half-closed (remote) stream")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path)
    c.send(raw_frame(0x0, 0x1, 1, b"x"))
    expect_stream_error(c, 1, STREAM_CLOSED)


@case("6.1/3 DATA whose padding exceeds its payload")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST")
    c.send(raw_frame(0x0, 0x8 | 0x1, 1, b"\x06abc"))
    expect_connection_error(c, PROTOCOL_ERROR)


# --- 6.2 HEADERS -------------------------------------------------------------------------

@case("6.2/1 HEADERS without END_HEADERS followed by another frame type")
def _(c, a):
    c.handshake()
    block = c.headers_block()
    c.send(raw_frame(0x1, 0x1, 1, block))
    c.send(raw_frame(0x0, 0x1, 1, b"x"))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.2/2 HEADERS without END_HEADERS followed by HEADERS of another stream")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x1, 0x1, 1, c.headers_block()))
    c.send(raw_frame(0x1, 0x5, 3, c.headers_block()))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.2/3 HEADERS on stream 0")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x1, 0x5, 0, c.headers_block()))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.2/4 HEADERS whose padding exceeds its payload")
def _(c, a):
    c.handshake()
    block = c.headers_block()
    c.send(raw_frame(0x1, 0x5 | 0x8, 1, bytes([len(block) + 1]) + block))
    expect_connection_error(c, PROTOCOL_ERROR)


# --- 6.3 PRIORITY ------------------------------------------------------------------------

@case("6.3/1 PRIORITY on stream 0")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x2, 0, 0, b"\x00\x00\x00\x01\x10"))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.3/2 PRIORITY with a length other than 5")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x2, 0, 1, b"\x00\x00\x00\x03\x10\x00"))
    expect_stream_error(c, 1, FRAME_SIZE_ERROR)


@case("6.3/3 PRIORITY on an idle stream is accepted")
def _(c, a):
    c.handshake()
    c.send_frame(PriorityFrame(9, depends_on=0, stream_weight=16))
    expect_alive(c)


# --- 6.4 RST_STREAM ----------------------------------------------------------------------

@case("6.4/1 RST_STREAM on stream 0")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x3, 0, 0, b"\x00\x00\x00\x08"))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.4/2 RST_STREAM with a length other than 4")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST")
    c.send(raw_frame(0x3, 0, 1, b"\x00\x00\x00\x08\x00"))
    expect_connection_error(c, FRAME_SIZE_ERROR)


# --- 6.5 SETTINGS ------------------------------------------------------------------------

@case("6.5/1 SETTINGS ACK with a payload")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x4, 0x1, 0, b"\x00\x03\x00\x00\x00\x64"))
    expect_connection_error(c, FRAME_SIZE_ERROR)


@case("6.5/2 SETTINGS on a stream")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x4, 0, 1, b"\x00\x03\x00\x00\x00\x64"))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.5/3 SETTINGS with a length not a multiple of 6")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x4, 0, 0, b"\x00\x03\x00\x00\x00"))
    expect_connection_error(c, FRAME_SIZE_ERROR)


@case("6.5.2/1 SETTINGS_ENABLE_PUSH of 2")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x4, 0, 0, b"\x00\x02\x00\x00\x00\x02"))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.5.2/2 SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x4, 0, 0, b"\x00\x04\x80\x00\x00\x00"))
    expect_connection_error(c, FLOW_CONTROL_ERROR)


@case("6.5.2/3 SETTINGS_MAX_FRAME_SIZE under 16384")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x4, 0, 0, b"\x00\x05\x00\x00\x3f\xff"))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.5.2/4 SETTINGS_MAX_FRAME_SIZE over 2^24-1")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x4, 0, 0, b"\x00\x05\x01\x00\x00\x00"))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.5.2/5 unknown setting is ignored and acknowledged")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x4, 0, 0, b"\x00\xff\x00\x00\x00\x01"))
    for f in c.frames():
        if isinstance(f, SettingsFrame) and "ACK" in f.flags:
            # The ACK of the handshake's SETTINGS may come first: then expect a second.
            for g in c.frames():
                if isinstance(g, SettingsFrame) and "ACK" in g.flags:
                    return
                if isinstance(g, GoAwayFrame):
                    raise Failed(f"GOAWAY {code_name(g.error_code)}")
            raise Failed("no SETTINGS ACK for the unknown setting")
    raise Failed("no SETTINGS ACK")


# --- 6.7 PING ----------------------------------------------------------------------------

@case("6.7/1 PING is answered with the same data")
def _(c, a):
    c.handshake()
    c.send_frame(PingFrame(0, opaque_data=b"h2ping!!"))
    expect_ping_ack(c, b"h2ping!!")


@case("6.7/2 PING with ACK is not answered")
def _(c, a):
    c.handshake()
    c.send_frame(PingFrame(0, opaque_data=b"unasked!", flags=["ACK"]))
    c.send_frame(PingFrame(0, opaque_data=b"asked!!!"))
    for f in c.frames():
        if isinstance(f, PingFrame) and "ACK" in f.flags:
            if f.opaque_data != b"asked!!!":
                raise Failed("answered a PING ACK")
            return
    raise Failed("no PING ACK")


@case("6.7/3 PING on a stream")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x6, 0, 1, b"12345678"))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.7/4 PING with a length other than 8")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x6, 0, 0, b"1234567"))
    expect_connection_error(c, FRAME_SIZE_ERROR)


# --- 6.8 GOAWAY --------------------------------------------------------------------------

@case("6.8/1 GOAWAY on a stream")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x7, 0, 1, b"\x00\x00\x00\x00\x00\x00\x00\x00"))
    expect_connection_error(c, PROTOCOL_ERROR)


# --- 6.9 WINDOW_UPDATE -------------------------------------------------------------------

@case("6.9/1 WINDOW_UPDATE of 0 on the connection")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x8, 0, 0, b"\x00\x00\x00\x00"))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.9/2 WINDOW_UPDATE of 0 on a stream")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST")
    c.send(raw_frame(0x8, 0, 1, b"\x00\x00\x00\x00"))
    expect_stream_error(c, 1, PROTOCOL_ERROR)


@case("6.9/3 WINDOW_UPDATE with a length other than 4")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x8, 0, 0, b"\x00\x00\x00\x01\x00"))
    expect_connection_error(c, FRAME_SIZE_ERROR)


@case("6.9.1/1 connection window over 2^31-1")
def _(c, a):
    c.handshake()
    c.send_frame(WindowUpdateFrame(0, window_increment=2**31 - 1))
    c.send_frame(WindowUpdateFrame(0, window_increment=2**31 - 1))
    expect_connection_error(c, FLOW_CONTROL_ERROR)


@case("6.9.1/2 stream window over 2^31-1")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST")
    c.send_frame(WindowUpdateFrame(1, window_increment=2**31 - 1))
    c.send_frame(WindowUpdateFrame(1, window_increment=2**31 - 1))
    expect_stream_error(c, 1, FLOW_CONTROL_ERROR)


@case("6.9.2/1 SETTINGS_INITIAL_WINDOW_SIZE of 1 gives one byte of DATA")
def _(c, a):
    c.handshake()
    c.send_frame(SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 1}))
    c.request(1, path=a.path)
    got = 0
    for f in c.frames(1.5):
        if isinstance(f, DataFrame) and f.stream_id == 1:
            got += len(f.data)
    if got != 1:
        raise Failed(f"{got} bytes of DATA within a 1-byte window")


@case("6.9.2/2 SETTINGS_INITIAL_WINDOW_SIZE change overflowing a stream window")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST")
    c.send_frame(WindowUpdateFrame(1, window_increment=2**31 - 1 - 65535))
    c.send_frame(SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 65536}))
    expect_stream_error(c, 1, FLOW_CONTROL_ERROR)


# --- 6.10 CONTINUATION -------------------------------------------------------------------

@case("6.10/1 HEADERS then several CONTINUATION frames")
def _(c, a):
    c.handshake()
    block = c.headers_block(path=a.path, extra=[("x-a", "1" * 30), ("x-b", "2" * 30)])
    third = len(block) // 3
    c.send(raw_frame(0x1, 0x1, 1, block[:third]))
    c.send(raw_frame(0x9, 0x0, 1, block[third:2 * third]))
    c.send(raw_frame(0x9, 0x4, 1, block[2 * third:]))
    h, _ = read_response(c, 1)
    if h.get(b":status") != b"200":
        raise Failed(f"status {h.get(b':status')}")


@case("6.10/2 CONTINUATION after END_HEADERS")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path)
    c.send(raw_frame(0x9, 0x4, 1, c.headers_block(base=False, extra=[("x-a", "b")])))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.10/3 CONTINUATION on stream 0")
def _(c, a):
    c.handshake()
    block = c.headers_block()
    c.send(raw_frame(0x1, 0x1, 1, block[:3]))
    c.send(raw_frame(0x9, 0x4, 0, block[3:]))
    expect_connection_error(c, PROTOCOL_ERROR)


@case("6.10/4 CONTINUATION after DATA")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST")
    c.send(raw_frame(0x0, 0x0, 1, b"x"))
    c.send(raw_frame(0x9, 0x4, 1, c.headers_block(base=False, extra=[("x-a", "b")])))
    expect_connection_error(c, PROTOCOL_ERROR)


# --- 8.1 HTTP messages ---------------------------------------------------------------------

def malformed(c, a, headers, stream=1):
    c.handshake()
    f = HeadersFrame(stream)
    f.data = c.enc.encode(headers)
    f.flags.add("END_HEADERS"); f.flags.add("END_STREAM")
    c.send_frame(f)
    expect_stream_error(c, stream, PROTOCOL_ERROR)


def base(a, authority):
    return [(":method", "GET"), (":scheme", "https"), (":path", a.path), (":authority", authority)]


@case("8.1.1/1 content-length not matching the DATA")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST", extra=[("content-length", "1")])
    c.send_frame(DataFrame(1, data=b"xyz", flags=["END_STREAM"]))
    expect_stream_error(c, 1, PROTOCOL_ERROR)


@case("8.2/1 uppercase header name")
def _(c, a):
    malformed(c, a, base(a, c.authority) + [("X-Upper", "v")])


@case("8.2.2/1 connection-specific header")
def _(c, a):
    malformed(c, a, base(a, c.authority) + [("connection", "keep-alive")])


@case("8.2.2/2 te other than trailers")
def _(c, a):
    malformed(c, a, base(a, c.authority) + [("te", "gzip")])


@case("8.3/1 unknown pseudo-header")
def _(c, a):
    malformed(c, a, base(a, c.authority) + [(":foo", "bar")])


@case("8.3/2 response pseudo-header in a request")
def _(c, a):
    malformed(c, a, base(a, c.authority) + [(":status", "200")])


@case("8.3/3 pseudo-header after a regular header")
def _(c, a):
    h = base(a, c.authority)
    malformed(c, a, h[:3] + [("x-a", "b")] + h[3:])


@case("8.3/4 duplicated :path")
def _(c, a):
    malformed(c, a, base(a, c.authority) + [(":path", a.path)])


@case("8.3.1/1 empty :path")
def _(c, a):
    malformed(c, a, [(":method", "GET"), (":scheme", "https"), (":path", ""), (":authority", c.authority)])


@case("8.3.1/2 missing :method")
def _(c, a):
    malformed(c, a, base(a, c.authority)[1:])


@case("8.3.1/3 missing :scheme")
def _(c, a):
    h = base(a, c.authority)
    malformed(c, a, [h[0]] + h[2:])


@case("8.3.1/4 missing :path")
def _(c, a):
    h = base(a, c.authority)
    malformed(c, a, h[:2] + h[3:])


@case("8.3.1/5 :method not a token")
def _(c, a):
    # RFC 9110 section 9.1: method = token. "GET/p/x?" would make an invalid
    # request line upstream, a method with spaces a second request target.
    c.handshake()
    for stream, method in ((1, "GET/p/x?"), (3, "GET /x HTTP/1.1"), (5, "")):
        f = HeadersFrame(stream)
        f.data = c.enc.encode([(":method", method)] + base(a, c.authority)[1:])
        f.flags.add("END_HEADERS"); f.flags.add("END_STREAM")
        c.send_frame(f)
        expect_stream_error(c, stream, PROTOCOL_ERROR)


@case("8.1/2 trailers with a pseudo-header")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST")
    c.send_frame(DataFrame(1, data=b"x"))
    f = HeadersFrame(1)
    f.data = c.enc.encode([(":method", "GET")])
    f.flags.add("END_HEADERS"); f.flags.add("END_STREAM")
    c.send_frame(f)
    expect_stream_error(c, 1, PROTOCOL_ERROR)


# --- 7 / 5.4: a normal request on a clean connection -----------------------------------------

@case("8/1 GET returns the file and HEAD returns no body")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path)
    h, body = read_response(c, 1)
    if h.get(b":status") != b"200" or int(h.get(b"content-length", b"-1")) != len(body) or not body:
        raise Failed(f"GET: status {h.get(b':status')}, content-length {h.get(b'content-length')}, {len(body)} body bytes")
    c.request(3, path=a.path, method="HEAD")
    h, body = read_response(c, 3)
    if h.get(b":status") != b"200" or body:
        raise Failed(f"HEAD: status {h.get(b':status')}, {len(body)} body bytes")


# --- limits against known attacks ----------------------------------------------------------

@case("limits/1 rapid reset (CVE-2023-44487) ends in GOAWAY ENHANCE_YOUR_CALM")
def _(c, a):
    c.handshake()
    out = b""
    for i in range(2000):
        f = HeadersFrame(1 + 2 * i)
        f.data = c.headers_block(path=a.path)
        f.flags.add("END_HEADERS"); f.flags.add("END_STREAM")
        out += f.serialize() + RstStreamFrame(1 + 2 * i, error_code=CANCEL).serialize()
    try:
        c.send(out)
    except Closed:
        return
    for f in c.frames(5.0):
        if isinstance(f, GoAwayFrame):
            if f.error_code != ENHANCE_YOUR_CALM:
                raise Failed(f"GOAWAY {code_name(f.error_code)}")
            return
    raise Failed("2000 reset streams were accepted without GOAWAY")


@case("limits/2 CONTINUATION flood ends the connection")
def _(c, a):
    c.handshake()
    c.send(raw_frame(0x1, 0x1, 1, c.headers_block()))
    try:
        for _ in range(20000):
            c.send(raw_frame(0x9, 0x0, 1, c.enc.encode([("x-flood", "z" * 100)])))
    except Closed:
        return
    expect_connection_error(c, ENHANCE_YOUR_CALM, PROTOCOL_ERROR, COMPRESSION_ERROR, FRAME_SIZE_ERROR)


@case("limits/3 HPACK bomb: a header list past the limit is refused")
def _(c, a):
    c.handshake()
    # One 4 KB header inserted in the dynamic table, then referenced many times:
    # a few bytes on the wire decode to megabytes.
    block = c.headers_block(path=a.path, extra=[("x-bomb", "b" * 4000)])
    refs = bytes([0x80 | 62]) * 2000  # indexed field: dynamic table entry 62
    c.send(raw_frame(0x1, 0x1, 1, block))
    c.send(raw_frame(0x9, 0x4, 1, refs))
    for f in c.frames():
        if isinstance(f, GoAwayFrame):
            return
        if isinstance(f, RstStreamFrame) and f.stream_id == 1:
            return
        if isinstance(f, HeadersFrame) and f.stream_id == 1:
            status = {k if isinstance(k, str) else k.decode(): v for k, v in c.dec.decode(f.data)}.get(":status")
            if status in ("431", b"431"):
                return
            raise Failed(f"bomb answered with status {status}")
    return  # closed


@case("limits/4 SETTINGS flood ends in GOAWAY ENHANCE_YOUR_CALM")
def _(c, a):
    c.handshake()
    try:
        c.send(SettingsFrame(0, settings={SettingsFrame.HEADER_TABLE_SIZE: 4096}).serialize() * 20000)
    except Closed:
        return
    for f in c.frames(5.0):
        if isinstance(f, GoAwayFrame):
            if f.error_code != ENHANCE_YOUR_CALM:
                raise Failed(f"GOAWAY {code_name(f.error_code)}")
            return
    raise Failed("20000 SETTINGS frames without GOAWAY")


@case("limits/5 PING flood ends in GOAWAY ENHANCE_YOUR_CALM")
def _(c, a):
    c.handshake()
    try:
        c.send(PingFrame(0, opaque_data=b"floodfld").serialize() * 20000)
    except Closed:
        return
    for f in c.frames(5.0):
        if isinstance(f, GoAwayFrame):
            if f.error_code != ENHANCE_YOUR_CALM:
                raise Failed(f"GOAWAY {code_name(f.error_code)}")
            return
    raise Failed("20000 PINGs without GOAWAY")


@case("limits/6 empty DATA frame flood ends the connection")
def _(c, a):
    c.handshake()
    c.request(1, path=a.path, end_stream=False, method="POST")
    try:
        c.send(raw_frame(0x0, 0, 1, b"") * 20000)
    except Closed:
        return
    expect_connection_error(c, ENHANCE_YOUR_CALM)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--path", default="/")
    p.add_argument("--authority", default="localhost")
    p.add_argument("-k", dest="filter", default="")
    p.add_argument("--list", action="store_true")
    a = p.parse_args()
    failed = 0
    ran = 0
    for name, fn in CASES:
        if a.filter not in name:
            continue
        if a.list:
            print(name)
            continue
        ran += 1
        t0 = time.monotonic()
        try:
            c = Conn(a.host, a.port, a.authority)
            try:
                fn(c, a)
            finally:
                c.sock.close()
            print(f"ok   {name} ({time.monotonic() - t0:.2f}s)")
        except (Failed, Closed, TimeoutError, OSError) as e:
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    if not a.list:
        print(f"{ran - failed}/{ran} passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
