"""`pip install ./clients/python` in a fresh virtualenv gives a package
that imports with its worker, its calls and its type marker, and whose
installed metadata carries the license, the classifiers, the project's URLs
and the psycopg it needs."""
import json
import os
import subprocess
import sys

CLIENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(CLIENT))
REPOSITORY = "https://github.com/pg-sturdy/pg_sturdy"

# what the installed distribution reports (importlib.metadata, in the venv)
METADATA = """
import json
from importlib.metadata import distribution
d = distribution("pg-sturdy")
m = d.metadata
licenses = [f for f in d.files if f.parent.name == "licenses" and f.parent.parent.name.endswith(".dist-info")]
print(json.dumps({
    "license": m["License-Expression"],
    "license_classifiers": [c for c in m.get_all("Classifier", []) if c.startswith("License ::")],
    "classifiers": m.get_all("Classifier", []),
    "urls": dict(u.split(", ", 1) for u in m.get_all("Project-URL", [])),
    "requires": [r.replace(" ", "") for r in m.get_all("Requires-Dist", []) if "extra ==" not in r],
    "license_files": [str(f) for f in licenses],
    "license_text": licenses[0].read_text() if licenses else None,
}))
"""


def test_the_license_is_mit_at_the_root_and_the_client_ships_the_same_file():
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 The pg_sturdy authors" in text
    # (clients/python/LICENSE is a link to the root's, what the build packs)
    assert os.path.samefile(os.path.join(CLIENT, "LICENSE"), os.path.join(ROOT, "LICENSE"))


def test_pip_install_into_a_fresh_virtualenv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    installed = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", CLIENT],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    probe = subprocess.run(
        [python, "-c", "import os, pg_sturdy; from pg_sturdy import Worker, Sturdy, AsyncSturdy, Fenced;"
                       " print(pg_sturdy.__version__, os.path.exists(os.path.join(os.path.dirname("
                       "pg_sturdy.__file__), 'py.typed')), 'site-packages' in pg_sturdy.__file__)"],
        capture_output=True, text=True, cwd=str(tmp_path))
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["0.2.0", "True", "True"]

    read = subprocess.run([python, "-c", METADATA], capture_output=True, text=True, cwd=str(tmp_path))
    assert read.returncode == 0, read.stderr
    meta = json.loads(read.stdout)
    assert meta["license"] == "MIT"
    # (an SPDX expression and a license classifier are not given together)
    assert meta["license_classifiers"] == []
    for classifier in ("Typing :: Typed", "Topic :: Database", "Framework :: AsyncIO",
                       "Intended Audience :: Developers", "Operating System :: OS Independent",
                       "Programming Language :: Python :: 3", "Programming Language :: Python :: 3.11",
                       "Programming Language :: Python :: 3.12", "Programming Language :: Python :: 3.13"):
        assert classifier in meta["classifiers"], classifier
    assert any(c.startswith("Development Status :: ") for c in meta["classifiers"])
    assert meta["urls"] == {"Homepage": REPOSITORY, "Documentation": f"{REPOSITORY}/tree/main/docs",
                            "Source": REPOSITORY, "Issues": f"{REPOSITORY}/issues"}
    # (setuptools writes the specifiers in its own order)
    assert len(meta["requires"]) == 1 and meta["requires"][0].startswith("psycopg"), meta["requires"]
    assert sorted(meta["requires"][0][len("psycopg"):].split(",")) == ["<4", ">=3.2"]
    assert meta["license_files"] == ["pg_sturdy-0.2.0.dist-info/licenses/LICENSE"]
    with open(os.path.join(ROOT, "LICENSE")) as f:
        assert meta["license_text"] == f.read()
