"""Autograd mechanics the executor relies on: RNG state, seeded backward passes, norm statistics across
recomputation."""
