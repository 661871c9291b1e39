"""`python -m scalelab.cli` runs the scalelab command."""

import sys

from scalelab.cli.main import main

sys.exit(main())
