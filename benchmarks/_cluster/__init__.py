"""The tables of ``benchmarks/cluster.py``, one module per family, and what they share (:mod:`.common`).

Each family module gives its tables' builders (``builder(args, scratch, cpus)``: the table's rows), its own
options (``add_options``) and its tables' markdown (``render``); ``benchmarks/cluster.py`` runs and writes them.
"""
