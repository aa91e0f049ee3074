"""The profile: its model and every rule on it, checked on the control machine.

Lives here: the pydantic model and loading (model), YAML read as a profile means it (yaml12),
the rules of SGLang, systemd and container engines (sglang_rules, systemd_rules,
container_rules), and SGLang's flags per version (sglang_flags, from the real --help texts in
sglang_help/).

May import: the foundation (errors, paths). Nothing here knows hosts or Ansible.
"""
