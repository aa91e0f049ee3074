#!/usr/bin/env bash
# Installs what orchestrator and its tests need on a fresh Debian machine (run as root):
# the lab's Debian packages and the project with its test extras, into the current Python.
set -euo pipefail
cd "$(dirname "$0")/.."

# docker.io and podman for their command-line clients: tests/unit/test_container_cli.py hands every
# rendered `docker run`/`podman run` to them. No daemon is wanted (see below).
packages=(systemd-container debootstrap openssh-client iproute2 procps docker.io podman)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  # A started dockerd sets iptables' FORWARD policy to DROP, which cuts the lab's bridge: keep the
  # packages' scripts from starting services (policy-rc.d), unless the machine has its own policy.
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
