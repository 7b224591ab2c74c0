"""The `harness` command line (`harness.cli.main`): one module per command group."""
