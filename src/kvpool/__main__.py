"""`python -m kvpool` is the `kvpool` command."""

import sys

from kvpool.cli.main import main

sys.exit(main())
