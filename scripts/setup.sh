#!/usr/bin/env bash
# Installs what orchestrator and its tests need on a fresh Debian machine (run as root):
# the lab's Debian packages and the project with its test extras, into the current Python.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(systemd-container debootstrap openssh-client iproute2 procps)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test]'
