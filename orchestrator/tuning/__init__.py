"""Measuring and tuning: bench a server, compare profiles, search a space.

Lives here:
- bench, stats: the bench client and its maths.
- datasets: prompt datasets.
- plot: the --plot pictures.
- canary: the canary deploy that benches before it goes on.
- sweep: the sweep over profiles.
- space, tune: the tune campaign over a space file.

May import: hosts/, render/, profile/ and the foundation. The engine never prints.
"""
