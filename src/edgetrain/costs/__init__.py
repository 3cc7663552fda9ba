"""What a step costs beside its bytes: the time model and the energy model."""
