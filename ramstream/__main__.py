"""``python -m ramstream`` runs the CLI."""

from ramstream.cli import main

main()
