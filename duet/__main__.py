"""``python -m duet``: the ``duet`` command, for when the script is not on PATH."""

from duet.cli import main

if __name__ == "__main__":
    main()
