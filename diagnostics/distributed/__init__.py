"""Distributed runs: launch a DDP training of a model with torchrun, profile every rank, and
analyse the per-rank traces (step time, computation vs communication, collectives, stragglers).

job.py (what to run) -> launch.py (torchrun, timeouts, which rank failed) -> rank_main.py (one
rank) -> traces on disk -> analysis.py (per-rank breakdown, collectives, stragglers).
"""
