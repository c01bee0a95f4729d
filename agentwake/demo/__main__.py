"""``python -m agentwake.demo``: the demo server, as the ``agentwake-demo`` program runs it."""

from agentwake.demo.server import main

if __name__ == "__main__":
    main()
