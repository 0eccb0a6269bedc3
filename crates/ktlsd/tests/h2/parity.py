#!/usr/bin/env python3
"""Raw-frame cases where HTTP/2 must answer as HTTP/1.1 and nginx do: the host
checks, Date on every response, OPTIONS *, and when a stream's NO_ERROR reset goes
out. Uses the frame helpers of conformance.py; same command line."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conformance import *  # noqa: E402,F403
from conformance import CASES, case, main  # noqa: E402

CASES.clear()


def request_fields(c, stream, fields, end_stream=True):
    f = HeadersFrame(stream)
    f.data = c.enc.encode(fields)
    f.flags.add("END_HEADERS")
    if end_stream:
        f.flags.add("END_STREAM")
    c.send_frame(f)


BASE = [(":method", "GET"), (":scheme", "https"), (":path", "/")]


def expect_status(c, stream, status):
    """Reads the response on `stream` and returns its fields if its status is `status`."""
    headers, _ = read_response(c, stream)
    if headers.get(b":status") != status:
        raise Failed(f"status {headers.get(b':status')!r}, expected {status!r}: {headers}")
    return headers

for name, fields in [
    ("host differs from :authority", BASE + [(":authority", "localhost"), ("host", "other.example")]),
    ("two different host fields", BASE + [("host", "localhost"), ("host", "other.example")]),
    (":authority ../..", BASE + [(":authority", "../..")]),
    ("empty :authority", BASE + [(":authority", "")]),
]:
    def check(c, a, fields=fields):
        c.handshake()
        request_fields(c, 1, fields)
        expect_stream_error(c, 1, PROTOCOL_ERROR)
        expect_alive(c)
    case(f"host/{name} is a malformed request")(check)


@case("host/host equal to :authority is served")
def _(c, a):
    c.handshake()
    request_fields(c, 1, [(":method", "GET"), (":scheme", "https"), (":path", a.path), (":authority", "localhost"), ("host", "LOCALHOST")])
    expect_status(c, 1, b"200")


@case("date/the 431 for an oversized header list carries Date")
def _(c, a):
    c.handshake()
    big = "b" * 1000
    # Indexed once, then referenced: small on the wire, 40 KB decoded.
    request_fields(c, 1, BASE + [(":authority", "localhost")] + [("x-big", big)] * 40)
    if not expect_status(c, 1, b"431").get(b"date"):
        raise Failed(f"no date: {headers}")


@case("options/OPTIONS * is 204 with Allow, as over HTTP/1.1")
def _(c, a):
    c.handshake()
    request_fields(c, 1, [(":method", "OPTIONS"), (":scheme", "https"), (":path", "*"), (":authority", "localhost")])
    headers = expect_status(c, 1, b"204")
    if headers.get(b"allow") != b"GET, HEAD, OPTIONS":
        raise Failed(f"got {headers}")


@case("hold/a request answered before it ends is still checked to its end")
def _(c, a):
    c.handshake()
    request_fields(c, 1, [(":method", "GET"), (":scheme", "https"), (":path", a.path),
                          (":authority", "localhost"), ("content-length", "4")], end_stream=False)
    for f in c.frames(0.3):
        if isinstance(f, RstStreamFrame) and f.stream_id == 1:
            raise Failed(f"RST_STREAM {code_name(f.error_code)} before the request ended")
    c.send(raw_frame(0x0, 0, 1, b"toolong"))
    expect_stream_error(c, 1, PROTOCOL_ERROR)


@case("hold/a request that ends in time is not reset")
def _(c, a):
    c.handshake()
    request_fields(c, 1, [(":method", "GET"), (":scheme", "https"), (":path", a.path),
                          (":authority", "localhost"), ("content-length", "4")], end_stream=False)
    c.send(raw_frame(0x0, 0x1, 1, b"abcd"))
    for f in c.frames(1.5):
        if isinstance(f, RstStreamFrame):
            raise Failed(f"RST_STREAM {code_name(f.error_code)} on stream {f.stream_id}")


if __name__ == "__main__":
    main()
