"""``python -m duet``: the ``duet`` command, for when the script is not on PATH."""

import os
import sys

# As pip's own __main__ does: ``python -m`` puts the current directory first on the import
# path, so a reviewed repository's own ``workers/`` or ``orchestration/`` package would
# shadow ours. Drop it, unless it is where this very package is imported from.
if sys.path and sys.path[0] in ("", os.getcwd()):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.abspath(sys.path[0] or os.getcwd()) != here:
        sys.path.pop(0)

from duet.commands.main import main  # noqa: E402

if __name__ == "__main__":
    main()
