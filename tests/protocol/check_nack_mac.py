#!/usr/bin/env python3
"""The NACK MAC of docs/protocol.md section 2.2, computed from the page's words alone.

Reads the test vector from the page, builds the NACK header from the fields the page names with
struct (section 2's layout, big-endian) and computes HMAC-SHA256 with Python's hmac, truncated to
8 bytes: an implementation independent of protocol/src/wire.cpp. Exit 0 when the page agrees with
itself; test_wire.cpp checks the C++ code against the same vector.
"""
import hashlib
import hmac
import re
import struct
import sys


def doc_hex(doc: str, label: str) -> bytes:
    m = re.search(r"^" + re.escape(label) + r"\s*((?:[0-9a-f]{2}\s?)+)$", doc, re.MULTILINE)
    if m is None:
        sys.exit(f"docs/protocol.md has no line '{label} ...'")
    return bytes.fromhex(m.group(1))


def main() -> int:
    doc = open(sys.argv[1], encoding="utf-8").read()
    key = doc_hex(doc, "nack-mac key:")
    message = doc_hex(doc, "nack-mac message:")
    mac = doc_hex(doc, "nack-mac result:")
    # version 1, opcode 3 (NACK), f32 (0), sum (0), tree 7, child 2, slot 13 mod 8, slot_ver
    # (13 / 8) mod 2, reason 15 (bad_key), count 0, ncontrib 0, chunk 13, seq 3.
    fields = struct.pack(">BBBBHHHBBHHII", 1, 3, 0, 0, 7, 2, 13 % 8, (13 // 8) % 2, 15, 0, 0, 13, 3)
    ok = True
    if fields != message:
        print(f"message: the fields give {fields.hex(' ')}, the page says {message.hex(' ')}")
        ok = False
    want_key = struct.pack(">Q", 0x0123456789ABCDEF)
    if key != want_key:
        print(f"key: big-endian 0x0123456789ABCDEF is {want_key.hex(' ')}, the page says {key.hex(' ')}")
        ok = False
    got = hmac.new(key, message, hashlib.sha256).digest()[:8]
    if got != mac:
        print(f"MAC: HMAC-SHA256 gives {got.hex(' ')}, the page says {mac.hex(' ')}")
        ok = False
    print("nack-mac test vector:", "agrees" if ok else "WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
