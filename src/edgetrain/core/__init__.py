"""The core contract: the chain of stage costs, the schedule and its simulator, the plan file, a model's
training stages and the optimizers their budget counts."""
