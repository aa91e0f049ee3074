"""Measuring and tuning: bench a server, compare profiles, search a space.

Lives here: the bench client and its maths (bench, stats), prompt datasets (datasets), the
--plot pictures (plot), the canary deploy that benches before it goes on (canary), the sweep
over profiles (sweep), and the tune campaign over a space file (space, tune).

May import: hosts/, render/, profile/ and the foundation. The engine never prints.
"""
