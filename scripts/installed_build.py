"""Which build of pg_sturdy a PostgreSQL installation would load.

The measuring scripts (bench.py, bench_batch.py, bench_outbox.py,
instructions.py, soak.py) must measure the release build. `make bench` and
its kin install it first, but a script run by hand measures whatever was
installed last, and `make test` (as `cargo pgrx test`) leaves the debug build
installed: unoptimized, it runs the job cycle at about 60% of the release
build's rate, with nothing in the output to say so. A debug build carries
DWARF sections (`.debug_info`); the release profile strips them.
"""
import os
import struct
import subprocess
import sys


def library(pg_config):
    libdir = subprocess.run([pg_config, "--pkglibdir"], check=True, capture_output=True,
                            text=True).stdout.strip()
    return os.path.join(libdir, "pg_sturdy.so")


def section_names(path):
    """The section names of a 64-bit little-endian ELF file (x86-64, aarch64)."""
    with open(path, "rb") as f:
        ident = f.read(16)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        header = f.read(48)
        shoff, = struct.unpack_from("<Q", header, 24)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", header, 42)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        entries = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        _, _, _, _, str_off, str_size = entries[shstrndx]
        f.seek(str_off)
        strings = f.read(str_size)
    return [strings[name:strings.index(b"\0", name)].decode() for name, *_ in entries]


def refused(path):
    """Whether the library at `path` is a debug build that is not to be
    measured (BENCH_ALLOW_DEBUG=1 allows it)."""
    return ".debug_info" in section_names(path) and os.environ.get("BENCH_ALLOW_DEBUG") != "1"


def require_release(pg_config):
    """Exit unless the installed pg_sturdy is a release build
    (BENCH_ALLOW_DEBUG=1 measures a debug build anyway)."""
    path = library(pg_config)
    if not os.path.exists(path):
        sys.exit(f"{path} is not there: install pg_sturdy first (make install PG_CONFIG={pg_config})")
    if refused(path):
        sys.exit(f"{path} is a debug build (it has .debug_info; `make test` leaves one installed): "
                 f"run `make install PG_CONFIG={pg_config}` for the release build, or set "
                 "BENCH_ALLOW_DEBUG=1 to measure this one anyway")
