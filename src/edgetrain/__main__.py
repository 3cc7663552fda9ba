"""``python -m edgetrain``: the same command line as the ``edgetrain`` script."""

from .cli import main

main()
