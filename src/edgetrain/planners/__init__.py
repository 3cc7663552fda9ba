"""Checkpointing planners: pure functions from a chain and a budget to a :class:`Schedule`."""
