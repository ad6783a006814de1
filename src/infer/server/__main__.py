"""``python -m infer.server [flags]`` is ``infer serve [flags]``."""

import sys

from infer.cli import main

if __name__ == "__main__":  # the engine process (spawned) imports this module too
    sys.exit(main(["serve", *sys.argv[1:]]))
