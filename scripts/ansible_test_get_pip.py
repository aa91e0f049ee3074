"""What ansible-test's get-pip-24.2.py does (install pip, and the packages it names, into this venv),
for machines that reach PyPI but not ci-files.testing.ansible.com. The pip of the Python this venv
was made from installs into it (`pip --python`), with the machine's own pip configuration; without
one, the pip this Python bundles (ensurepip) does. Saved there by tests/unit/test_collection.py."""

import importlib.util
import os
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]  # get-pip's own flags
base = getattr(sys, "_base_executable", "")
has_pip = (
    base
    and base != sys.executable
    and subprocess.call([base, "-m", "pip", "--version"], stdout=subprocess.DEVNULL) == 0
)
if has_pip and subprocess.call([base, "-m", "pip", "--python", sys.executable, "install", *args]) == 0:
    sys.exit(0)
# No pip there, or one older than 22.3 (no --python): the bundled one.
environment = dict(os.environ)
import ensurepip  # noqa: E402

ensurepip.bootstrap(upgrade=False)  # it drops the PIP_* settings from os.environ: the copy keeps them
importlib.invalidate_caches()
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args], env=environment))
