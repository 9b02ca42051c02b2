"""What the commands print to."""
import sys

from rich.console import Console

out = Console(width=None if sys.stdout.isatty() else 140)  # piped output: room for the tables
# a plan of more thread blocks than this is announced before the engine runs every block of it (--exact)
SLOW_BLOCKS = 2_000_000
