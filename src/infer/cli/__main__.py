"""``python -m infer.cli`` is the ``infer`` command."""

import sys

from infer.cli import main

if __name__ == "__main__":  # a spawned process (the server's engine) imports this module too
    sys.exit(main())
