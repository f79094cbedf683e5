"""Tests of envfactory/cli/ (one test file per module where one module is under test)."""
