"""The command line: the one place that prints and picks exit codes.

Lives here: the group and its global options (main), the commands by group
(profile_commands, host_commands, logs_command, bench_commands, tune_command, lab_command),
where output goes and how errors become exit codes (console), and rich tables and the live
view (view).

May import: every layer below (tuning/, hosts/, render/, profile/), lab/ and the foundation.
"""
