"""``python -m edgetrain``: the same command line as the ``edgetrain`` script."""

from .cli import app

app(prog_name="edgetrain")
