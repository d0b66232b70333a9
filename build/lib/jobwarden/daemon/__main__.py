"""``python -m jobwarden.daemon``: the same as ``wardend``."""

import sys

from jobwarden.daemon.cli import main

sys.exit(main())
