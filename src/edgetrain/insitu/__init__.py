"""In-situ student-teacher training on a camera node (the founding paper's section III).

``world`` renders a seeded camera world with ground truth; ``detect`` is a stand-in detector and
the crop function; ``tracker`` is SORT; ``model`` the teacher's and student's CNN; ``labels`` the
competence gate and track propagation; ``store`` the crash-safe frame store; ``simulate`` runs
them all and scores them (docs/guide/insitu.md). The modules are imported by name: the package itself
imports nothing, so ``edgetrain.insitu.store`` does not pay for PyTorch.
"""
