"""edgetrain's benchmarks: each measures a claim as a ratio against its baseline in the same run.

``python -m benchmarks run NAME`` runs one and writes ``benchmarks/results/NAME.json`` with its provenance;
``python -m benchmarks pages`` makes ``docs/results/NAME.md`` from those files (NOTE [ Results files ] in
``edgetrain/bench/results.py``). The scripts that define no ``TITLE`` are not in
:data:`benchmarks.__main__.BENCHMARKS` and run on their own: ``python benchmarks/SCRIPT.py --help``.
"""
