"""Many idle WebSocket tunnels, for the tunnel tests: both ends in plain asyncio
protocols (no task per connection), so that they hold little themselves.

  idle.py [upstream]
      A WebSocket upstream on 127.0.0.1 that answers every handshake with a 101
      (Sec-WebSocket-Accept and all) and then keeps the connection open, silent.
      Prints `listening PORT`, then `upstream N` each time another thousand are open.
  idle.py client HOST PORT PATH N
      Opens N WebSocket tunnels over TLS (HTTP/1.1) to ktlsd, at most 256
      handshakes at a time; prints `open N` once all got their 101 (or `fail ...`
      and exits 1), then holds them until a line or the end of stdin, and prints
      `closed` as it closes them.
"""

import asyncio
import base64
import hashlib
import os
import ssl
import sys

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Upstream(asyncio.Protocol):
    count = 0

    def connection_made(self, transport):
        self.transport, self.head = transport, b""

    def data_received(self, data):
        if self.head is None:
            return
        self.head += data
        if b"\r\n\r\n" not in self.head:
            return
        key = b""
        for line in self.head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"sec-websocket-key":
                key = value.strip()
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        self.transport.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        self.head = None
        Upstream.count += 1
        if Upstream.count % 1000 == 0:
            print(f"upstream {Upstream.count}", flush=True)


class Tunnel(asyncio.Protocol):
    def __init__(self, request, switched):
        self.request, self.switched, self.head = request, switched, b""

    def connection_made(self, transport):
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data):
        if self.switched.done():
            return
        self.head += data
        if b"\r\n\r\n" in self.head:
            self.switched.set_result(self.head.split(b"\r\n", 1)[0])

    def connection_lost(self, exc):
        if not self.switched.done():
            self.switched.set_result(b"closed " + repr(exc).encode())


async def upstream():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Upstream, "127.0.0.1", 0, backlog=4096)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Future()


async def client(host, port, path, n):
    loop = asyncio.get_running_loop()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    gate = asyncio.Semaphore(256)
    transports = []

    async def open_one():
        key = base64.b64encode(os.urandom(16))
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: "
        ).encode() + key + b"\r\n\r\n"
        async with gate:
            switched = loop.create_future()
            transport, _ = await loop.create_connection(
                lambda: Tunnel(request, switched), host, port, ssl=ctx, server_hostname="localhost"
            )
            transports.append(transport)
            status = await asyncio.wait_for(switched, 60)
            if not status.startswith(b"HTTP/1.1 101"):
                raise RuntimeError(status.decode(errors="replace"))

    results = await asyncio.gather(*(open_one() for _ in range(n)), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        print(f"fail {len(errors)} of {n}: {errors[0]!r}", flush=True)
        sys.exit(1)
    print(f"open {n}", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    for t in transports:
        t.close()
    await asyncio.sleep(0.5)
    print("closed", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] == "upstream":
        asyncio.run(upstream())
    else:
        asyncio.run(client(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])))
