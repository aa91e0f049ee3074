"""The lab: Debian hosts in systemd-nspawn containers (hosts.py) and the GPU/SGLang stand-ins they carry."""
