#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_core.cpp (record format documented there). Run from anywhere."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def contrib(child, chunk, seq, count, dtype, elem=4):
    return bytes([1, child, chunk, seq, count - 1, dtype]) + bytes(range(count * elem))


def result(chunk, seq, count, dtype, elem=4):
    return bytes([2, chunk, seq, count - 1, dtype]) + bytes(range(count * elem))


def ipv4_checksum(h):
    s = sum(struct.unpack("!10H", h))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def raw_frame():
    # A CONTRIB from child 0 (10.0.0.100:5000) to the switch (10.0.0.1:47110), tree 9, key 0xABCD.
    payload = struct.pack("!4f", 1, 2, 3, 4)
    td = struct.pack("!BBBBHHHBBHHIIQ", 1, 1, 0, 0, 9, 0, 0, 0, 0, 4, 1, 0, 0, 0xABCD)
    udp = struct.pack("!HHHH", 5000, 47110, 8 + len(td) + len(payload), 0)
    ip = bytearray(struct.pack("!BBHHHBBHII", 0x45, 0, 20 + len(udp) + len(td) + len(payload), 0,
                               0x4000, 64, 17, 0, 0x0A000064, 0x0A000001))
    struct.pack_into("!H", ip, 10, ipv4_checksum(bytes(ip)))
    eth = bytes([2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 100]) + b"\x08\x00"
    f = eth + bytes(ip) + udp + td + payload
    return bytes([0, len(f) >> 8, len(f) & 0xFF]) + f


seeds = {
    # root, 2 children, 1 slot: complete, duplicate, next chunks reuse the slot
    "root-two-children": bytes([0x21]) + contrib(0, 0, 0, 3, 0) + contrib(1, 0, 0, 3, 0)
    + contrib(1, 0, 0, 3, 0) + contrib(0, 1, 0, 3, 0) + contrib(1, 1, 0, 3, 0)
    + contrib(0, 2, 1, 3, 0),
    # inner, 4 children, 2 slots: partial up, duplicate re-sends it, RESULT down, duplicates
    "inner-result": bytes([0x0B]) + b"".join(contrib(c, 0, 0, 2, 5) for c in range(4))
    + contrib(2, 0, 0, 2, 5) + result(0, 0, 2, 5) + result(0, 0, 2, 5) + contrib(1, 0, 0, 2, 5),
    # deterministic root, 3 children, FP8
    "deterministic-e4m3": bytes([0x62]) + b"".join(contrib(c, 3, 0, 16, 3, 1) for c in (2, 0, 1)),
    "raw-frame": bytes([0x21]) + raw_frame() + raw_frame(),
    "header-mutation": bytes([0x23]) + bytes([3, 11, 0x7F, 0, 0]) + bytes(16)
    + bytes([3, 0, 2, 1, 0]) + bytes(16) + bytes([4]) + contrib(0, 0, 0, 1, 0),
}

os.makedirs(os.path.join(HERE, "corpus"), exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(HERE, "corpus", name), "wb") as f:
        f.write(data)
