"""`elasticrun`: the command line (`main`), its flags and the `status` subcommand."""

from elastic.driver.cli.main import main

__all__ = ["main"]
