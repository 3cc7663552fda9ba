"""In-situ student-teacher training on a camera node (the founding paper's section III).

``world`` renders a seeded camera world with ground truth; ``detect`` is a stand-in detector and
the crop function; ``tracker`` is SORT; ``model`` the teacher's and student's CNN; the labelling
rules are ``gate`` (the competence gate and track propagation), ``posterior`` and ``sizes``, on
``geometry`` (what the mount tells of a box), applied by ``labels``; ``crossfit`` is the
cross-fitted self-training round; ``store`` the crash-safe frame store; ``simulate`` runs them all
and scores them (docs/guide/insitu.md); ``service`` is ``insitu run``, with ``camera``, ``inference``,
``supervisor``, ``latency`` and ``service_config``. The modules are imported by name: the package itself
imports nothing, so ``edgetrain.insitu.store`` does not pay for PyTorch.
"""
