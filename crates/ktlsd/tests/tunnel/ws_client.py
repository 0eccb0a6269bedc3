"""A WebSocket client for the tunnel tests (Python's websockets), over TLS to ktlsd
(certificate not verified). Usage: ws_client.py URL SCENARIO. Prints one line per
check, `ok NAME` or `fail NAME: why`, and exits 1 if any failed.

Scenarios:
  echo     text and binary messages, a 1 MB message, ping/pong, a close with code 4000
  close    the upstream closes with 4001 "bye": the client sees that code and reason
  die      the upstream aborts after one echo: the client sees the connection fail (1006)
  hold     one echo (`ok first`), then waits for the server to end the tunnel and
           prints `closed SECONDS CODE`
  stall    reads nothing for a few seconds while the upstream floods, then drains a
           little, closes and says how much it read
  after    frames after the close, on a raw TLS socket: a close (1000) then a text
           frame behind it; the upstream's close comes back, then the end of the
           connection (`ok close`, `ok end`)
"""

import asyncio
import ssl
import sys

import websockets

failed = False


def check(name, ok, why=""):
    global failed
    print(f"ok {name}" if ok else f"fail {name}: {why}", flush=True)
    failed |= not ok


async def echo(url, ctx):
    async with websockets.connect(url, ssl=ctx, max_size=None, compression=None, ping_interval=None) as ws:
        await ws.send("hello")
        got = await ws.recv()
        check("text", got == "hello", repr(got))
        await ws.send(b"\x00\x01\xfe\xff")
        got = await ws.recv()
        check("binary", got == b"\x00\x01\xfe\xff", repr(got))
        big = bytes(i % 251 for i in range(1_000_000))
        await ws.send(big)
        got = await ws.recv()
        check("1MB", got == big, f"{len(got)} bytes")
        pong = await ws.ping(b"are you there")
        await asyncio.wait_for(pong, 5)
        check("ping", True)
        for i in range(100):
            await ws.send(f"m{i}")
        got = [await ws.recv() for _ in range(100)]
        check("order", got == [f"m{i}" for i in range(100)], repr(got[:3]))
        await ws.close(code=4000, reason="done")
        check("close", ws.close_code == 4000 and ws.close_reason == "done", f"{ws.close_code} {ws.close_reason!r}")


async def upstream_closes(url, ctx):
    async with websockets.connect(url, ssl=ctx, compression=None, ping_interval=None) as ws:
        try:
            await ws.recv()
            check("close", False, "a message came")
        except websockets.ConnectionClosed:
            pass
        check("close", ws.close_code == 4001 and ws.close_reason == "bye", f"{ws.close_code} {ws.close_reason!r}")


async def dies(url, ctx):
    async with websockets.connect(url, ssl=ctx, compression=None, ping_interval=None) as ws:
        await ws.send("once")
        got = await ws.recv()
        check("echo", got == "once", repr(got))
        try:
            await asyncio.wait_for(ws.recv(), 10)
            check("died", False, "a second message came")
        except websockets.ConnectionClosedError as e:
            check("died", ws.close_code == 1006, f"{e}")


async def hold(url, ctx):
    async with websockets.connect(url, ssl=ctx, compression=None, ping_interval=None, close_timeout=2) as ws:
        await ws.send("first")
        check("first", await ws.recv() == "first")
        start = asyncio.get_running_loop().time()
        try:
            await ws.recv()
        except websockets.ConnectionClosed:
            pass
        print(f"closed {asyncio.get_running_loop().time() - start:.1f} {ws.close_code}", flush=True)


async def stall(url, ctx):
    # A small receive queue: the client itself holds little.
    async with websockets.connect(
        url, ssl=ctx, max_size=None, max_queue=1, read_limit=65536, compression=None, ping_interval=None
    ) as ws:
        first = await ws.recv()
        check("first", len(first) == 65536, f"{len(first)}")
        await asyncio.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 3)
        got = 0
        for _ in range(16):
            got += len(await ws.recv())
        check("drained", got == 16 * 65536, f"{got}")
        print(f"read {got + len(first)}", flush=True)


async def after(url, ctx):
    import base64
    import os
    import struct
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port, ssl=ctx, server_hostname="localhost")
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    check("switched", head.startswith(b"HTTP/1.1 101"), repr(head))

    def frame(opcode, payload):
        mask = os.urandom(4)
        return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))

    writer.write(frame(8, struct.pack("!H", 1000)) + frame(1, b"after close") + frame(2, b"and more"))
    await writer.drain()
    rest = await asyncio.wait_for(reader.read(), 10)
    check("close", rest[:1] == b"\x88" and rest[2:4] == struct.pack("!H", 1000), repr(rest))
    check("end", len(rest) == 2 + (rest[1] & 0x7F) if len(rest) > 1 else False, repr(rest))
    writer.close()


async def main():
    url, scenario = sys.argv[1], sys.argv[2]
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    run = {"echo": echo, "close": upstream_closes, "die": dies, "hold": hold, "stall": stall, "after": after}[scenario]
    await asyncio.wait_for(run(url, ctx), 60)


asyncio.run(main())
sys.exit(1 if failed else 0)
