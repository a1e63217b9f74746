"""``python -m pycoll``: the ``pycoll`` command line."""

import sys

from pycoll.cli import main

if __name__ == "__main__":
    sys.exit(main())
