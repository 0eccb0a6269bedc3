"""RFC 6455 framing for the tunnel tests' own clients (h2_ws.py, h3_ws.py), which
carry WebSocket frames in HTTP/2 and HTTP/3 DATA by hand."""

import os
import struct


def ws_frame(opcode, payload, key=None):
    """A final, masked client frame (RFC 6455 section 5.3): a random key, or the
    zero key (allowed, and cheap for bulk) when `key` is four zero bytes."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    if key == b"\0\0\0\0":
        return head + key + payload
    key = os.urandom(4)
    mask = (key * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(mask, "big")).to_bytes(n, "big") if n else b""
    return head + key + masked


def ws_parse(buf):
    """(opcode, payload, used) of the first whole unmasked frame in buf, or None."""
    if len(buf) < 2:
        return None
    opcode, n, at = buf[0] & 0x0F, buf[1] & 0x7F, 2
    if n == 126:
        if len(buf) < 4:
            return None
        n, at = struct.unpack("!H", buf[2:4])[0], 4
    elif n == 127:
        if len(buf) < 10:
            return None
        n, at = struct.unpack("!Q", buf[2:10])[0], 10
    if len(buf) < at + n:
        return None
    return opcode, bytes(buf[at : at + n]), at + n
