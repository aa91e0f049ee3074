"""Rendering: a profile becomes the exact argv, environment and unit a host gets.

Lives here: the server's launch plan and unit text (launch), a container engine's part
(container), and systemd's own verdict on the planned units (systemd_check).

May import: profile/ and the foundation. Nothing here runs Ansible or touches a host.
"""
