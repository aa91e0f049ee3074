"""Rendering: a profile becomes the exact argv, environment and unit a host gets.

Lives here:
- launch: the server's launch plan and unit text.
- container_unit: a container engine's part of the unit.
- systemd_check: systemd's own verdict on the planned units.
- reverse: a live server's argv and environment back to a profile (adopt), and the proof.

May import: profile/ and the foundation. Nothing here runs Ansible or touches a host.
"""
