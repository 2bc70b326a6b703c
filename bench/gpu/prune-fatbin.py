#!/usr/bin/env python3
"""Zeroes, in place, every CUDA fatbin entry of a shared library except the PTX for one arch.

node-llama-cpp's CUDA build (libggml-cuda.so, 159 MB) holds cubins for sm_86/89/120/121 and
PTX for compute_75/80/90; a device call carries at most 64 MiB. An H100/H200 (sm_90) runs the
compute_90 PTX (the driver compiles it at load), so the other entries' payloads become zeros:
the file keeps its size and layout, and xz shrinks the zeros to nothing.
Usage: prune-fatbin.py LIB.so 90
"""
import re
import struct
import sys

MAGIC = struct.pack('<I', 0xBA55ED50)
KIND_PTX = 1

def main(path: str, keep_arch: int) -> None:
    data = bytearray(open(path, 'rb').read())
    kept = zeroed = fatbins = 0
    for m in re.finditer(re.escape(MAGIC), data):
        p = m.start()
        version, header_size, fat_size = struct.unpack_from('<HHQ', data, p + 4)
        if version != 1 or header_size != 16 or p + 16 + fat_size > len(data):
            continue
        fatbins += 1
        q, end = p + header_size, p + header_size + fat_size
        while q < end:
            kind, _, entry_header, payload = struct.unpack_from('<HHIQ', data, q)
            if kind not in (1, 2) or entry_header < 32 or q + entry_header + payload > end:
                raise SystemExit(f'unexpected fatbin entry at {q:#x} (kind {kind}, header {entry_header})')
            arch = struct.unpack_from('<I', data, q + 28)[0]
            start = q + entry_header
            if kind == KIND_PTX and arch == keep_arch:
                kept += 1
            else:
                data[start:start + payload] = bytes(payload)
                zeroed += 1
            q = start + payload
    if kept == 0:
        raise SystemExit(f'no PTX for compute_{keep_arch} in {path}: nothing would run')
    open(path, 'wb').write(data)
    print(f'{path}: {fatbins} fatbins, kept {kept} compute_{keep_arch} PTX entries, zeroed {zeroed}')

if __name__ == '__main__':
    main(sys.argv[1], int(sys.argv[2]))
