#!/usr/bin/env bash
# Installs orchestrator on a fresh Debian machine (run as root), into the current Python.
#   bash scripts/setup.sh           what the run needs: the lab's packages and the project.
#   bash scripts/setup.sh --test    that, and what the tests need besides.
# The run needs no container engine and no test tools, so a first deploy waits for neither.
set -euo pipefail
cd "$(dirname "$0")/.."

test_tools=false
case "${1:-}" in
  "") ;;
  --test) test_tools=true ;;
  *) echo "usage: bash scripts/setup.sh [--test]" >&2; exit 2 ;;
esac

# The lab: systemd-nspawn hosts built with debootstrap, reached over ssh in network namespaces.
packages=(systemd-container debootstrap openssh-client iproute2 procps)
# docker.io and podman for their command-line clients: tests/unit/test_container_cli.py hands every
# rendered `docker run`/`podman run` to them. No daemon is wanted (see below).
# postgresql for its programs: the ledger's tests start a cluster of their own (tests/pg.py), and the
# package's default cluster is never started.
if $test_tools; then
  packages+=(docker.io podman postgresql)
fi
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  # A started dockerd sets iptables' FORWARD policy to DROP, which cuts the lab's bridge: keep the
  # packages' scripts from starting services (policy-rc.d), unless the machine has its own policy.
  # It keeps postgresql's default cluster stopped too (its port, 5432, stays free).
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ " ${missing[*]} " == *" docker.io "* && -d /run/systemd/system ]]; then
    systemctl disable docker.service docker.socket >/dev/null 2>&1 || true  # nor at the next boot
  fi
  if [[ " ${missing[*]} " == *" postgresql "* && -d /run/systemd/system ]]; then
    systemctl disable postgresql.service >/dev/null 2>&1 || true  # its default cluster, at boot
  fi
fi

if ! $test_tools; then
  python3 -m pip install -q --disable-pip-version-check -e .
  exit 0
fi

# The gateway: smg 1.x comes with the test extra; sglang-router 0.3.2, the release before smg left
# that package, gets a venv of its own, since both install a program named `smg` (the gateway
# tests run each). An older checkout's 0.3.2 in this Python goes, with the smg it overwrote.
if python3 -m pip show -q sglang-router >/dev/null 2>&1; then
  python3 -m pip uninstall -q -y sglang-router smg >/dev/null 2>&1
fi
python3 -m pip install -q --disable-pip-version-check -e '.[test]'
previous=/opt/orchestrator/smg-0.3.2
if [[ ! -x $previous/bin/smg ]]; then
  python3 -m venv "$previous"
  "$previous/bin/pip" install -q --disable-pip-version-check 'sglang-router==0.3.2'
fi
