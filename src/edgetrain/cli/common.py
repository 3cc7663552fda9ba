"""What every ``edgetrain`` command module shares: the consoles, the one-line error handling, the progress bar,
the options of a training step and the device look-ups several commands make.

Every failure is one line on stderr, never a traceback: library errors
(:class:`~edgetrain.errors.EdgetrainError`, bad quantities, files that cannot be written) exit
with code 2, anything unexpected with 1 (``--verbose`` adds its traceback).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import math
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from ..errors import EdgetrainError

__all__ = ["console", "err_console", "error", "clean_errors", "click_exceptions", "click_types", "finite",
           "refuse_non_finite", "ModelOpt", "ModelArgOpt", "model_name", "BatchOpt", "SizeOpt", "DeviceOpt",
           "OptimizerOpt", "UpdateOpt", "with_progress", "memory_of", "host_for"]

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)  # soft_wrap: an error stays one line in any terminal width
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
# typer < 0.21 (pinned in pyproject.toml, as Flower, the `federated` extra, pins it) runs on click itself; a typer
# that carries its own click (typer._click) is used through that one.
_CLICK = "typer._click" if importlib.util.find_spec("typer._click") else "click"
click_exceptions: Any = importlib.import_module(f"{_CLICK}.exceptions")
click_types: Any = importlib.import_module(f"{_CLICK}.types")
log = logging.getLogger("edgetrain.cli")


def error(message: str) -> None:
    """One line on stderr, whatever the message holds (no markup, no wrapping)."""
    err_console.print(Text.assemble(("error: ", "bold red"), " ".join(message.split())), highlight=False)


def clean_errors(command: F) -> F:
    """Turn expected errors into one message and exit code 2, unexpected ones into one line and 1."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (EdgetrainError, ValueError) as exc:
            error(str(exc))
            raise typer.Exit(2) from None
        except OSError as exc:
            error(f"{exc.strerror or exc}: {exc.filename or ''}")
            raise typer.Exit(2) from None
        except MemoryError:
            error("out of memory: the request is larger than this machine can hold")
            raise typer.Exit(2) from None
        except (typer.Exit, click_exceptions.ClickException, KeyboardInterrupt):
            raise
        except Exception as exc:  # a bug: still one line for the node's log, the traceback with --verbose
            log.debug("unexpected error", exc_info=True)
            error(f"unexpected {type(exc).__name__}: {exc} (please report it; --verbose shows the traceback)")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def finite(option: str, least: float | None = None, *,
           above: float | None = None) -> Callable[[float | None], float | None]:
    """A typer callback refusing NaN, infinities, values below ``least`` and values not above ``above``."""

    def check(value: float | None) -> float | None:
        if value is None:
            return value
        if not math.isfinite(value) or (least is not None and value < least) or (above is not None and value <= above):
            bound = f" >= {least:g}" if least is not None else f" > {above:g}" if above is not None else ""
            raise typer.BadParameter(f"must be a finite number{bound}, got {value}", param_hint=option)
        return value

    return check


class _FiniteFloat(click_types.ParamType):
    """A float option's own type (its range, its name in --help), refusing NaN and the infinities."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        number = self.inner.convert(value, param, ctx)
        if isinstance(number, float) and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number

    def get_metavar(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.get_metavar(*args, **kwargs)

    def __repr__(self) -> str:
        return repr(self.inner)


def refuse_non_finite(command: Any) -> Any:
    """``command`` (a click command or group, walked through) with every float option refusing NaN and infinity.

    click's float type takes ``nan`` and ``inf``, and a range's bounds let NaN through (no comparison with NaN is
    true): a deadline or a rate of NaN would run as if unconstrained. Done once over the whole tree, so an option
    added later is covered too.
    """
    for param in command.params:
        if isinstance(param.type, click_types.FloatParamType):
            param.type = _FiniteFloat(param.type)
    for sub in getattr(command, "commands", {}).values():
        refuse_non_finite(sub)
    return command


# The training step that memory, plan, train and bench batch describe: the same flags and help in each.
ModelOpt = typer.Option(..., "--model", "-m", help="A model of the zoo (resnet50, mobilenet_v2, transformer, ...) or "
                        "your own as package.module:factory, a callable that returns it.")
ModelArgOpt = typer.Option([], "--model-arg", help="KEY=VALUE for the factory of --model (repeat for more); a value "
                           "that reads as a Python literal is that literal.")
BatchOpt = typer.Option(..., "--batch", "-b", min=1, help="Batch size.")
SizeOpt = typer.Option(224, "--image", "--size", "--seq-len", min=1,
                       help="Image side in pixels (sequence length for transformer models).")
DeviceOpt = typer.Option(None, "--device", "-d", help="Device from `edgetrain devices`, e.g. odroid-xu4.")
OptimizerOpt = typer.Option("sgd", "--optimizer", help="sgd (with momentum) or adam.")
UpdateOpt = typer.Option("all", "--update", help="The parameters that train: all, bias (biases and norm layers), "
                         "last:K (the last K stages), comma-separated parameter patterns (layer4,fc; bias,fc adds "
                         "the biases) or, for train, auto (chosen by probes on the data); the rest is frozen, and "
                         "a frozen start runs once without recording.")


def with_progress(description: str, work: Callable[[Callable[[int, int], None]], T]) -> T:
    """Run ``work(progress)`` under a progress bar on stderr; ``progress(done, total)`` advances it."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task(description, total=None)
        return work(lambda done, total: bar.update(task, completed=done, total=total))


def memory_of(device: str) -> int:
    """Memory of a catalog device, for commands that need it as a budget."""
    from ..devices import get_device

    memory_bytes = get_device(device).memory_bytes
    if memory_bytes is None:
        raise EdgetrainError(f"device {device!r} has no known memory size")
    return memory_bytes


def host_for(target: Any) -> Any:
    """This machine's calibration when ``target``'s training rate needs it (NOTE [ One time model ]), else None."""
    from ..costs.timemodel import needs_calibration

    if target is None or not needs_calibration(target):
        return None
    from ..profiling.host import host_calibration

    return with_progress("calibrating this machine (DGEMM and a ResNet-18 step)", lambda _: host_calibration())


def model_name(model: str, model_args: list[str]) -> str:
    """The model's one name: a zoo name, or a factory with its arguments (NOTE [ A model by its factory ])."""
    if not model_args:
        return model
    from ..models.factory import factory_name, is_factory_name, parse_model_args

    if not is_factory_name(model):
        raise EdgetrainError(f"--model-arg is for a factory (package.module:callable); {model!r} is a zoo name")
    return factory_name(model, parse_model_args(model_args))
