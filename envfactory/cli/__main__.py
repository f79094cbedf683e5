"""`python -m envfactory.cli`: the same command as `envfactory`."""

from envfactory.cli.main import main

main()
