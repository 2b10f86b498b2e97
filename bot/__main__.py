"""`python -m bot` does what `steward` does."""

import sys

from bot.cli import main

sys.exit(main())
