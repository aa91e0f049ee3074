"""Running Ansible on hosts: one typed record goes out, typed facts come back.

Lives here: the user's Ansible set-up (ansible_config, inventory, vault, secrets), the record
per host (playvars), ansible-runner (runner), each module's typed result (module_results) and
a host's results read back (readback), what a user reads per host (host_report, diagnose,
startup_watch), and the plays: deploy, rollback, the gateway's rotation, status_play,
stop_play, preflight_play, journal (the logs), and verify/ (testinfra through Ansible).

May import: render/, profile/ and the foundation. The engine never prints.
"""
