"""`python -m gradalign` and the `gradalign` command. Importing the command line takes a moment
(numpy, typer, rich): a Ctrl-C then is exit 130 as everywhere else, never a traceback."""

import sys


def run() -> None:
    """Import the command line and run it; interrupted while importing: exit 130, one line."""
    try:
        from .cli import main
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
