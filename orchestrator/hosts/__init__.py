"""Running Ansible on hosts: one typed record goes out, typed facts come back.

Lives here:
- ansible_config, inventory, vault, secrets: the user's Ansible set-up.
- playvars: the record per host.
- runner: ansible-runner.
- module_results: each module's typed result.
- readback: a host's results, read back.
- host_report, diagnose, startup_watch: what a user reads per host.
- deploy, rollback: the deploy play, and the way back to a host's last good unit.
- rotation: the smg gateway around a deploy.
- status_play, stop_play, preflight_play, logs_play: each runs playbooks/NAME.yml and reads it.
- verify/: testinfra through Ansible.

May import: render/, profile/ and the foundation. The engine never prints.
"""
