"""A WebSocket upstream for the tunnel tests (Python's websockets), on 127.0.0.1.

Prints `listening PORT`, then one line per connection it accepts (`open PATH`).
Paths:
  /api/echo    echoes every message, text as text and binary as binary
  /api/close   closes at once with code 4001 and reason "bye"
  /api/die     echoes the first message, then aborts its TCP connection (RST):
               an upstream that dies mid-tunnel
  /api/flood   sends 64 KiB binary messages as fast as the tunnel takes them, until
               the connection ends; prints `flooded N` with the bytes it got out
  /api/sink    reads nothing (a slow upstream): what it is sent waits in the sockets
Anything else: the handshake is refused with 404.
"""

import asyncio
import http
import sys

import websockets


async def handler(ws, path):
    print(f"open {path}", flush=True)
    if path == "/api/echo":
        try:
            async for message in ws:
                await ws.send(message)
        except websockets.ConnectionClosed:
            pass
        print(f"closed {path} {ws.close_code}", flush=True)
    elif path == "/api/close":
        await ws.close(code=4001, reason="bye")
    elif path == "/api/die":
        message = await ws.recv()
        await ws.send(message)
        await asyncio.sleep(0.2)
        ws.transport.abort()
    elif path == "/api/sink":
        # websockets stops reading its socket once its own queue is full.
        await ws.wait_closed()
        print(f"closed {path}", flush=True)
    elif path == "/api/flood":
        sent = 0
        block = b"f" * 65536
        try:
            while True:
                await ws.send(block)
                sent += len(block)
        except websockets.ConnectionClosed:
            pass
        finally:
            print(f"flooded {sent}", flush=True)


async def refuse_unknown(path, headers):
    if path not in ("/api/echo", "/api/close", "/api/die", "/api/flood", "/api/sink"):
        return (http.HTTPStatus.NOT_FOUND, [], b"no such socket\n")
    return None


async def main():
    # No compression: the tests count bytes on the wire.
    async with websockets.serve(
        handler, "127.0.0.1", 0, process_request=refuse_unknown, max_size=None, compression=None, ping_interval=None
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        print(f"listening {port}", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
