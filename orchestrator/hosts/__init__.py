"""Running Ansible on hosts: one typed record goes out, typed facts come back.

Lives here:
- ansible_config, inventory, vault, secrets: the user's Ansible set-up.
- playvars: the record per host.
- runner: ansible-runner.
- module_results: each module's typed result.
- readback: a host's results, read back.
- host_report, diagnose, startup_watch: what a user reads per host.
- deploy, rollback, rotation, status_play, stop_play, preflight_play, journal, verify/: the plays.
  rotation is the gateway's. journal reads the logs. verify/ runs testinfra through Ansible.

May import: render/, profile/ and the foundation. The engine never prints.
"""
