#!/usr/bin/env python3
"""Draft an update script: the objects of the new install script that the old
one does not have (or has differently), in the new script's install order.

  cargo pgrx schema pg15 --no-default-features --features pg15 -o /tmp/new.sql
  scripts/release_diff.py sql/releases/pg_sturdy--A.sql /tmp/new.sql > sql/pg_sturdy--A--B.sql

A draft, to be read by hand: an object that changed (a function's body in a
SQL file, a comment) comes out as a second CREATE, which must become CREATE OR
REPLACE (or an ALTER / COMMENT ON). The upgrade test (pg_test/test_upgrade.py)
compares the catalog after the update with a fresh install's.
"""
import re
import sys


def blocks(path):
    text = open(path).read()
    return [b.strip() for b in re.findall(r"/\* <begin connected objects> \*/(.*?)/\* </end connected objects> \*/",
                                          text, re.S)]


def without_locations(block):
    # the "-- src/file.rs:LINE" comments move between versions
    return "\n".join(line for line in block.splitlines() if not re.match(r"^-- (src|sql)/", line)).strip()


def main():
    old_path, new_path = sys.argv[1], sys.argv[2]
    old = {without_locations(b) for b in blocks(old_path)}
    print("\n\n".join(b for b in blocks(new_path) if without_locations(b) not in old))


if __name__ == "__main__":
    main()
