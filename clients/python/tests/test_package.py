"""`pip install ./clients/python` in a fresh virtualenv gives a package
that imports with its worker, its calls and its type marker."""
import os
import subprocess
import sys

CLIENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
