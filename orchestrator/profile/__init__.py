"""The profile: its model and every rule on it, checked on the control machine.

Lives here:
- model: the pydantic model and loading.
- yaml12: YAML read as a profile means it.
- sglang_rules, systemd_rules, container_rules: the rules of SGLang, systemd and container engines.
- sglang_flags: SGLang's flags per version, from the real --help texts in sglang_help/.
- json_schema: the JSON Schema editors read (orchestrator schema).

May import: the foundation (errors, paths). Nothing here knows hosts or Ansible.
"""
