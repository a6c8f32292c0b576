#!/usr/bin/env python3
"""The rooms of src/ and what may name what, checked by `make lint`:

- the base rooms (what talks to the server, and shared helpers) never name a
  capability or `compose`;
- a capability names only base rooms, never another capability: the calls
  that span several are in `compose`, built from their operations;
- a table of ours (`static ...: access::Table`) and its columns (`const ...:
  access::Col`) are named only in the room that defines them: another room
  uses that room's operations, never its columns;
- no two rooms import each other, directly or round a cycle;
- no source file is over 850 lines, its tests aside.

Prints each breach and exits 1 if there is one.
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
BASE = {"access", "activity", "args", "datum", "error", "fmgr", "fragment", "grants", "heads", "placement", "plan", "planner",
        "scaleout", "rescan", "sequence", "shard", "subxact", "testing"}
CAPABILITIES = {"batch", "checkpoint", "claim", "outbox", "queue", "workflow"}
COMPOSED = {"compose"}  # the calls that span capabilities
MAX_LINES = 850


def rooms():
    """{room: [(path, text without its tests)]}"""
    out = {}
    for entry in sorted(os.listdir(SRC)):
        path = os.path.join(SRC, entry)
        if entry.endswith(".rs") and entry != "lib.rs":
            out.setdefault(entry[:-3], []).append(path)
        elif os.path.isdir(path):
            for sub in sorted(os.listdir(path)):
                if sub.endswith(".rs"):
                    out.setdefault(entry, []).append(os.path.join(path, sub))
    texts = {}
    for room, paths in out.items():
        for path in paths:
            text = open(path).read()
            if os.path.basename(path) == "tests.rs":
                continue
            text = re.split(r"\n#\[cfg\(any\(test, feature = \"pg_test\"\)\)\]\n(?:#\[pgrx::pg_schema\]\n)?mod tests \{\n",
                            text)[0]
            texts.setdefault(room, []).append((path, text))
    return texts


def main():
    breaches = []
    texts = rooms()
    unknown = set(texts) - BASE - CAPABILITIES - COMPOSED
    breaches += [f"src/{r}: a room this script does not know: add it to BASE, CAPABILITIES or COMPOSED"
                 for r in sorted(unknown)]
    uses = {r: set() for r in texts}
    owned = {}  # name -> room
    for room, files in texts.items():
        for path, text in files:
            for name in re.findall(r"\b(?:static|const) ([A-Z][A-Z0-9_]*): access::(?:Table|Col)\b", text):
                owned[name] = room
            for other in re.findall(r"\bcrate::([a-z_]+)", text):
                if other != room and other in texts:
                    uses[room].add(other)
            lines = text.count("\n")
            if lines > MAX_LINES:
                breaches.append(f"{os.path.relpath(path, SRC + '/..')}: {lines} lines outside its tests (at most {MAX_LINES})")
    for room, files in texts.items():
        if room in BASE:
            for other in sorted(uses[room] - BASE):
                breaches.append(f"src/{room}: a base room names {other}, which is not a base room")
        if room in CAPABILITIES:
            for other in sorted(uses[room] - BASE):
                breaches.append(f"src/{room}: a capability names {other}: compose the two in src/compose/")
        for path, text in files:
            for name, owner in owned.items():
                if owner != room and re.search(rf"\b{name}\b", text):
                    breaches.append(f"{os.path.relpath(path, SRC + '/..')}: names {name}, a table or column of {owner}")
    # cycles, by depth-first search
    state = {}

    def visit(room, trail):
        state[room] = "open"
        for other in sorted(uses[room]):
            if state.get(other) == "open":
                cycle = trail[trail.index(other):] + [other]
                breaches.append("an import cycle: " + " -> ".join(cycle))
            elif other not in state:
                visit(other, trail + [other])
        state[room] = "done"

    for room in sorted(uses):
        if room not in state:
            visit(room, [room])
    for b in breaches:
        print(f"rooms: {b}")
    if breaches:
        sys.exit(1)
    print(f"rooms: {len(texts)} rooms, no breach")


if __name__ == "__main__":
    main()
