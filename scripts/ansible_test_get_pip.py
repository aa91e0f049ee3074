"""What ansible-test's get-pip-24.2.py does (install pip and the packages it names into this Python),
with the pip that Python bundles (ensurepip) and the machine's own pip configuration, for machines
that reach PyPI but not ci-files.testing.ansible.com. Saved there by tests/unit/test_collection.py."""

import ensurepip
import os
import subprocess
import sys

environment = dict(os.environ)
ensurepip.bootstrap(upgrade=False)  # it drops the PIP_* settings from os.environ: the copy keeps them
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]  # get-pip's own flags
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args], env=environment))
