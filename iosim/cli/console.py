"""What the commands print to."""
import sys

from rich.console import Console

out = Console(width=None if sys.stdout.isatty() else 140)  # piped output: room for the tables
# a plan of more thread blocks than this is announced before the engine runs every block of it (--exact)
SLOW_BLOCKS = 2_000_000

# notes for stderr, printed once the command has succeeded (an error is then the one line a user sees)
NOTES: list[str] = []


def note(text: str) -> None:
    NOTES.append(f"iosim: note: {text}")
