"""`python -m harness` is the `harness` command."""
from harness.cli import main

if __name__ == "__main__":
    main()
