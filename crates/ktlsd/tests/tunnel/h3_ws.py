#!/usr/bin/python3
"""WebSocket over HTTP/3 (RFC 9220) with aioquic, frame by frame: an extended
CONNECT to ktlsd, then WebSocket frames (RFC 6455, masked as a client's) in DATA
frames. Usage: h3_ws.py HOST PORT SCENARIO. Prints `settings N` (the server's
SETTINGS_ENABLE_CONNECT_PROTOCOL), `status S` and one line per check (`ok NAME` or
`fail NAME: why`); exits 1 if any failed.

Scenarios:
  echo     to /api/echo: a text message, a binary one, a 1 MB binary one, a ping
           answered by a pong, then a close (4000) answered by the upstream's
           close with the same code, and the stream's end (`ok end`)
  refused  an extended CONNECT with `:protocol = webtransport` gets a 400, one with
           a protocol nobody defined (`chat`) has its stream reset (H3_MESSAGE_ERROR),
           and the connection goes on: a WebSocket on it echoes (`ok after`)
  idle     to /api/echo: one echo, then nothing either way until the server ends the
           stream; prints `idle SECONDS fin` (or `reset CODE`)
  die      to /api/die, an upstream that aborts its connection after one echo:
           the client's stream ends, reset or finished (`ok died`), never hangs
"""

import asyncio
import os
import ssl
import struct
import sys
import time

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection, Setting
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamReset

from wsframe import ws_frame, ws_parse

TIMEOUT = 10
failed = False


def check(name, ok, why=""):
    global failed
    print(f"ok {name}" if ok else f"fail {name}: {why}", flush=True)
    failed |= not ok


class Tunnel:
    """One request stream: its head, the bytes received and how it ended."""

    def __init__(self):
        self.headers = None
        self.buf = bytearray()
        self.ended = False
        self.reset = None
        self.changed = asyncio.Event()

    def wake(self):
        self.changed.set()


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.streams = {}
        self.settings = asyncio.Event()
        self.closed = None
        self.authority = ""

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            self.closed = "connection closed %#x %s" % (event.error_code, event.reason_phrase)
            for t in self.streams.values():
                t.wake()
            return
        if isinstance(event, StreamReset) and event.stream_id in self.streams:
            self.streams[event.stream_id].reset = event.error_code
            self.streams[event.stream_id].wake()
        for e in self.h3.handle_event(event):
            t = self.streams.get(e.stream_id)
            if t is None:
                continue
            if isinstance(e, HeadersReceived):
                t.headers = dict((k.decode(), v.decode()) for k, v in e.headers)
            elif isinstance(e, DataReceived):
                t.buf += e.data
            if e.stream_ended:
                t.ended = True
            t.wake()
        if self.h3.received_settings is not None:
            self.settings.set()

    async def until(self, t, done):
        """Waits until done() is true of stream t (or it ended, was reset, or the
        connection closed); returns done()."""
        while not done():
            if t.ended or t.reset is not None or self.closed:
                return done()
            t.changed.clear()
            await asyncio.wait_for(t.changed.wait(), TIMEOUT)
        return True

    async def open(self, path, protocol="websocket"):
        """An extended CONNECT; the stream id and its tunnel, once the head came."""
        sid = self._quic.get_next_available_stream_id()
        t = self.streams[sid] = Tunnel()
        self.h3.send_headers(
            sid,
            [
                (b":method", b"CONNECT"),
                (b":protocol", protocol.encode()),
                (b":scheme", b"https"),
                (b":path", path.encode()),
                (b":authority", self.authority.encode()),
                (b"sec-websocket-version", b"13"),
                (b"user-agent", b"h3_ws.py"),
            ],
        )
        self.transmit()
        await self.until(t, lambda: t.headers is not None)
        return sid, t

    def send(self, sid, data):
        self.h3.send_data(sid, data, end_stream=False)
        self.transmit()

    async def message(self, t):
        """The next WebSocket frame from the server, or None if the stream ended first."""
        parsed = []

        def got():
            f = ws_parse(t.buf)
            if f is not None:
                parsed.append(f)
            return f is not None

        if not await self.until(t, got):
            return None
        opcode, payload, used = parsed[0]
        del t.buf[:used]
        return opcode, payload


async def echo(c, path="/api/echo", name=""):
    sid, t = await c.open(path)
    print(f"status {t.headers.get(':status')}", flush=True)
    check(f"{name}no accept", "sec-websocket-accept" not in t.headers, str(t.headers))
    c.send(sid, ws_frame(0x1, "héllo over h3".encode()))
    check(f"{name}text", await c.message(t) == (0x1, "héllo over h3".encode()))
    return sid, t


async def scenario_echo(c):
    sid, t = await echo(c)
    c.send(sid, ws_frame(0x2, bytes(range(256))))
    check("binary", await c.message(t) == (0x2, bytes(range(256))))
    big = os.urandom(1 << 20)
    c.send(sid, ws_frame(0x2, big))
    got = await c.message(t)
    check("1MB", got == (0x2, big), f"got {None if got is None else (got[0], len(got[1]))} {t.reset} {c.closed}")
    c.send(sid, ws_frame(0x9, b"are you there"))
    check("ping", await c.message(t) == (0xA, b"are you there"))
    c.send(sid, ws_frame(0x8, struct.pack("!H", 4000) + b"done"))
    got = await c.message(t)
    code = struct.unpack("!H", got[1][:2])[0] if got and got[0] == 0x8 and len(got[1]) >= 2 else got
    check("close", code == 4000, f"{code!r}")
    # The upstream closed its connection after its close: the server ends the stream (FIN).
    await c.until(t, lambda: t.ended)
    check("end", t.ended and t.reset is None, f"ended {t.ended} reset {t.reset} {c.closed}")
    try:
        c._quic.send_stream_data(sid, b"", end_stream=True)
        c.transmit()
    except Exception:
        pass  # the server stopped reading the stream once done with it (STOP_SENDING)


async def scenario_refused(c):
    _, t = await c.open("/api/echo", "webtransport")
    check("webtransport 400", t.headers.get(":status") == "400", f"{t.headers} reset {t.reset}")
    _, t = await c.open("/api/echo", "chat")
    check("unknown reset", t.headers is None and t.reset == 0x10E, f"{t.headers} reset {t.reset}")
    await echo(c, name="after ")
    check("after", c.closed is None, str(c.closed))


async def scenario_die(c):
    sid, t = await c.open("/api/die")
    print(f"status {t.headers.get(':status')}", flush=True)
    c.send(sid, ws_frame(0x1, b"last words"))
    check("echo", await c.message(t) == (0x1, b"last words"))
    try:
        await c.until(t, lambda: False)
    except asyncio.TimeoutError:
        pass
    check("died", t.ended or t.reset is not None, f"ended {t.ended} reset {t.reset} {c.closed}")
    print(f"end {'reset %#x' % t.reset if t.reset is not None else 'fin'}", flush=True)


async def scenario_idle(c):
    sid, t = await echo(c)
    started = time.monotonic()
    try:
        await c.until(t, lambda: False)
    except asyncio.TimeoutError:
        pass
    how = "fin" if t.ended and t.reset is None else f"reset {t.reset} {c.closed}"
    print(f"idle {time.monotonic() - started:.2f} {how}", flush=True)


async def main():
    host, port, scenario = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    config.verify_mode = ssl.CERT_NONE
    async with connect(host, port, configuration=config, create_protocol=Client) as c:
        c.authority = f"{host}:{port}"
        await asyncio.wait_for(c.settings.wait(), TIMEOUT)
        print(f"settings {c.h3.received_settings.get(Setting.ENABLE_CONNECT_PROTOCOL)}", flush=True)
        await {"echo": scenario_echo, "refused": scenario_refused, "die": scenario_die, "idle": scenario_idle}[scenario](c)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(1 if failed else 0)
