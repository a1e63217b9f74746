"""``python -m pycoll``: the ``pycoll`` command line."""

from pycoll.cli import main

if __name__ == "__main__":
    main()
