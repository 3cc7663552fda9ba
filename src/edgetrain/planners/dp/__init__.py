"""The checkpointing dynamic programmes over a chain (Beaumont et al., optimal checkpointing of heterogeneous chains).

``grid.py`` holds the recurrence and its table over memory units, which ``kernel.py`` fills in compiled code;
``optimal.py`` is the time-optimal DP, ``exact.py`` its byte-exact least budget, and ``paging.py`` the DP with paging
to storage under an energy (or time) objective.
"""
