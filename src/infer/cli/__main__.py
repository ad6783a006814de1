"""``python -m infer.cli`` is the ``infer`` command."""

import sys

from infer.cli import main

sys.exit(main())
