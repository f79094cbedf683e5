"""Tests across the packages: the layer rule, the CLI mistakes walk, terminal safety, the attack suites,
hostile inputs, examples, the README and the quickstart."""
