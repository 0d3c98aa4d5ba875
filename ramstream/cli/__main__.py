"""``python -m ramstream.cli`` runs the CLI."""

from ramstream.cli import main

if __name__ == "__main__":  # not when a spawned process (a Dask worker) imports this as its main
    main()
