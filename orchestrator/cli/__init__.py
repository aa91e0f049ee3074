"""The command line: the one place that prints and picks exit codes.

Lives here:
- main: the group and its global options.
- profile_commands, host_commands, logs_command, bench_commands, tune_command, lab_command: the
  commands, by group.
- console: where output goes, and how errors become exit codes.
- view: rich tables and the live view.

May import: every layer below (tuning/, hosts/, render/, profile/), lab/ and the foundation.
"""
