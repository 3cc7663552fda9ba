"""The ``edgetrain`` command line: each command parses options and calls one library function.

Every failure is one line on stderr, never a traceback: library errors
(:class:`~edgetrain.errors.EdgetrainError`, bad quantities, files that cannot be written) and
bad options exit with code 2, anything unexpected with 1 (``--verbose`` adds its traceback).
Heavy imports happen inside the commands that need them.

This module assembles the app from one module per command group; what they share is in
:mod:`edgetrain.cli.common`.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import typer
import typer.main

from .bench import bench_app
from .cluster import cluster_app
from .common import click_exceptions, error, refuse_non_finite
from .federated import federated_command
from .fit import devices, memory, plan_command
from .insitu import insitu_app
from .power import power_app
from .reproduce import reproduce_app
from .train import demo, train_command

__all__ = ["app", "main"]

app = typer.Typer(help="Make deep-learning training fit and run well on small edge machines.",
                  no_args_is_help=True, add_completion=False)


def main(argv: list[str] | None = None) -> None:
    """The ``edgetrain`` script (``argv`` default: the process's): usage errors on one line too."""
    # Huge pages for large tensors; PyTorch reads this at its first allocation, so before any
    # command imports torch (NOTE [ Returning freed memory ] in profile/process.py).
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    try:
        code = refuse_non_finite(typer.main.get_command(app)).main(args=argv, standalone_mode=False,
                                                                   prog_name="edgetrain")
    except click_exceptions.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "edgetrain"
        error(f"{exc.format_message()} (see {command} --help)")
        sys.exit(2)
    except click_exceptions.ClickException as exc:
        error(exc.format_message())
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


@app.callback()
def root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what the library does."),
         devices_file: list[Path] | None = typer.Option(
             None, "--devices-file", help="A device file (e.g. from `edgetrain bench device`) whose devices join the "
             "catalog, replacing shipped ones of the same name; repeatable. Same as EDGETRAIN_DEVICES.")) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(name)s: %(message)s")
    if devices_file:
        from ..devices.catalog import DEVICES_ENV

        earlier = [p for p in os.environ.get(DEVICES_ENV, "").split(os.pathsep) if p]
        os.environ[DEVICES_ENV] = os.pathsep.join([*earlier, *map(str, devices_file)])


# typer lists a group's commands in the order they are added: --help shows them so.
app.command()(devices)
app.command()(memory)
app.command("plan")(plan_command)
app.command("train")(train_command)
app.command()(demo)
app.add_typer(reproduce_app, name="reproduce")
app.add_typer(bench_app, name="bench")
app.add_typer(insitu_app, name="insitu")
app.add_typer(power_app, name="power")
cluster_app.command("federated")(federated_command)
app.add_typer(cluster_app, name="cluster")
