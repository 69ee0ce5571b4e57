"""Pools: batch clusters behind the one queue, reached over SSH at a login node.

``base.py`` is the interface every kind offers the head (submit, poll, cancel, logs,
capacity); ``slurm.py`` is the Slurm kind, ``slurm_parse.py`` reads Slurm's outputs (pure),
``keys.py`` makes the head's pool key. Nothing is installed on the cluster: every action
is one of its own commands run over one SSH connection per account.
"""
