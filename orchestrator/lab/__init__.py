"""The lab: local Debian hosts for trying and testing the tool without GPUs.

Lives here:
- nspawn: the hosts, as systemd-nspawn containers.
- gateway: the lab's gateway.
- standins/: the SGLang and nvidia-smi stand-ins copied onto the hosts.

Its command is cli/lab_command.py.

May import: profile/ (the stand-ins carry sglang_flags) and the foundation.
"""
