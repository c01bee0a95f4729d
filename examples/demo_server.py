"""The demo help desk, run from a checkout: ``python -m examples.demo_server [--http HOST:PORT]``.

The code lives in the package (``agentwake.demo``) and ships in the wheel as the
``agentwake-demo`` program; this module re-exports it so the tests, the benchmarks and
``examples/webhook_demo.py`` keep importing and running it from here.
"""

from __future__ import annotations

from agentwake.demo import *  # noqa: F403 - this module is agentwake.demo under its old name
from agentwake.demo import __all__ as __all__
from agentwake.demo import main

if __name__ == "__main__":
    main()
