"""Tests of envfactory/serve/ (one test file per module where one module is under test)."""
