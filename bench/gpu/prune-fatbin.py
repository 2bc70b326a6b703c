#!/usr/bin/env python3
"""Keeps, in place, only the PTX for one arch in every CUDA fatbin of a shared library.

node-llama-cpp's CUDA build (libggml-cuda.so, 159 MB) holds cubins for sm_86/89/120/121 and
PTX for compute_75/80/90; a device call carries at most 64 MiB. An H100/H200 (sm_90) runs the
compute_90 PTX (the driver compiles it at load), so the other entries' payloads become zeros:
the file keeps its size and layout, and xz shrinks the zeros to nothing.

That PTX says `.version 9.1` (CUDA 13.1's nvcc), and a driver of CUDA 13.0 (580.x) refuses it
("the provided PTX was compiled with an unsupported toolchain"). With --ptx-isa 9.0 each fatbin
is rewritten as one entry, its compute_90 PTX with the .version line set to the ISA given,
compressed again (zstd) into the room all the fatbin's entries held.
Usage: prune-fatbin.py LIB.so 90 [--ptx-isa 9.0]
"""
import re
import struct
import subprocess
import sys

MAGIC = struct.pack('<I', 0xBA55ED50)
KIND_PTX = 1
# Fields of a fatbin entry header (offsets in bytes).
PADDED_SIZE_AT = 8
COMPRESSED_SIZE_AT = 16
ISA_MINOR_AT, ISA_MAJOR_AT = 24, 26
ARCH_AT = 28
FLAGS_AT = 40
UNCOMPRESSED_SIZE_AT = 56
FLAG_ZSTD = 0x8000


def with_isa(data: bytearray, entry: int, header: int, isa: str) -> tuple[bytes, bytes]:
    """The entry's header and its PTX recompressed with `.version` set to `isa`."""
    flags = struct.unpack_from('<Q', data, entry + FLAGS_AT)[0]
    if not flags & FLAG_ZSTD:
        raise SystemExit(f'entry at {entry:#x} is not zstd-compressed (flags {flags:#x})')
    size = struct.unpack_from('<I', data, entry + COMPRESSED_SIZE_AT)[0]
    start = entry + header
    ptx = subprocess.run(['zstd', '-dcq'], input=bytes(data[start:start + size]), capture_output=True, check=True).stdout
    ptx, n = re.subn(rb'^\.version \d+\.\d+$', b'.version ' + isa.encode(), ptx, count=1, flags=re.M)
    if n != 1:
        raise SystemExit(f'entry at {entry:#x}: no .version line')
    packed = subprocess.run(['zstd', '-19', '-cq'], input=ptx, capture_output=True, check=True).stdout
    head = bytearray(data[entry:entry + header])
    major, minor = (int(x) for x in isa.split('.'))
    struct.pack_into('<HH', head, ISA_MINOR_AT, minor, major)
    struct.pack_into('<I', head, COMPRESSED_SIZE_AT, len(packed))
    struct.pack_into('<Q', head, UNCOMPRESSED_SIZE_AT, len(ptx))
    return bytes(head), packed


def main(path: str, keep_arch: int, isa: str | None = None) -> None:
    data = bytearray(open(path, 'rb').read())
    kept = zeroed = fatbins = 0
    for m in re.finditer(re.escape(MAGIC), data):
        p = m.start()
        version, header_size, fat_size = struct.unpack_from('<HHQ', data, p + 4)
        if version != 1 or header_size != 16 or p + 16 + fat_size > len(data):
            continue
        fatbins += 1
        q, end = p + header_size, p + header_size + fat_size
        keep = None
        while q < end:
            kind, _, entry_header, payload = struct.unpack_from('<HHIQ', data, q)
            if kind not in (1, 2) or entry_header < 32 or q + entry_header + payload > end:
                raise SystemExit(f'unexpected fatbin entry at {q:#x} (kind {kind}, header {entry_header})')
            arch = struct.unpack_from('<I', data, q + ARCH_AT)[0]
            start = q + entry_header
            if kind == KIND_PTX and arch == keep_arch and keep is None:
                keep = (q, entry_header)
                kept += 1
            else:
                data[start:start + payload] = bytes(payload)
                zeroed += 1
            q = start + payload
        if keep and isa:
            # One entry takes the whole fatbin: its header, then the PTX, then zeros to the end.
            head, packed = with_isa(data, keep[0], keep[1], isa)
            room = fat_size - len(head)
            if len(packed) > room:
                raise SystemExit(f'fatbin at {p:#x}: {len(packed)} bytes of PTX, room for {room}')
            head = bytearray(head)
            struct.pack_into('<Q', head, PADDED_SIZE_AT, room)
            first = p + header_size
            data[first:end] = bytes(head) + packed + bytes(room - len(packed))
    if kept == 0:
        raise SystemExit(f'no PTX for compute_{keep_arch} in {path}: nothing would run')
    open(path, 'wb').write(data)
    print(f'{path}: {fatbins} fatbins, kept {kept} compute_{keep_arch} PTX entries{f" (PTX ISA set to {isa})" if isa else ""}, zeroed {zeroed}')


if __name__ == '__main__':
    main(sys.argv[1], int(sys.argv[2]), sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == '--ptx-isa' else None)
