"""POET's MILP (Patil et al., *POET: Training Neural Networks on Tiny Devices with Integrated Rematerialization
and Paging*, ICML 2022): recomputation and paging on a training graph under an energy objective, solved with HiGHS.

``graph.py`` builds the training graph, ``solve.py`` the MILP, ``warmstart.py`` its heuristic starts,
``replay.py`` the graph schedule's oracle, ``ops.py`` the executor's ops from a solution, and ``strategy.py``
``edgetrain plan --strategy milp``.
"""
