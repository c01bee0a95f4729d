"""``python -m agentwake.cli``: the same as the ``agentwake`` command."""

from agentwake.cli import main

main()
