"""The lab: local Debian hosts for trying and testing the tool without GPUs.

Lives here: the hosts as systemd-nspawn containers (nspawn), the lab's gateway (gateway), and
the SGLang and nvidia-smi stand-ins copied onto the hosts (standins/).

May import: profile/ (the stand-ins carry sglang_flags) and the foundation. Its command is
cli/lab_command.py.
"""
