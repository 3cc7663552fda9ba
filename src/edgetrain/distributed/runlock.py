"""One run-directory lock for all the processes of a run: their parent holds it, they inherit it.

NOTE [ One lock for a run's processes ]
``cluster local`` and ``cluster federated`` start processes that write one run directory (rank 0
of the nodes; the federated server). Their parent, the supervisor or the launcher, takes the run
directory's lock (NOTE [ Run directory protocol ]) before any of them starts and names its own
pid in it, so a second command on the directory is refused with that pid, however far the first
one has got. Every process it starts gets the locked descriptor (``RunDirectory.lock_fd``, by
``Popen(pass_fds=...)``). An ``flock`` belongs to the open file, which they then share, so:

* the lock lasts until the last of them exits: a process killed with its parent (NOTE [ Children
  die with their parent ]) may still be exiting when the parent is gone;
* a writer among them must not take the lock again: opening ``.lock`` anew makes another open
  file, which the held lock refuses. It writes under the lock it inherited
  (:class:`InheritedRunDirectory`).
"""

from __future__ import annotations

from ..train.rundir import RunDirectory

__all__ = ["InheritedRunDirectory"]


class InheritedRunDirectory(RunDirectory):
    """The run directory as a process started by the lock's holder writes it: locked already, by the descriptor it
    inherited, which it keeps until it exits (NOTE [ One lock for a run's processes ]); the pid named in the lock
    stays its parent's."""

    def __enter__(self) -> InheritedRunDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def claim(self) -> None:
        return None
