"""`python -m gradalign`."""

from .cli import main

main()
