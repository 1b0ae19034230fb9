"""`python -m turnkeep`: the `turnkeep` command."""

from turnkeep.cli.main import entry

if __name__ == "__main__":
    entry()
