"""``python -m carina`` runs the CLI."""

from carina.cli.app import main

main()
