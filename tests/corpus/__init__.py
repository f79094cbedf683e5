"""Tests of envfactory/corpus/ (one test file per module where one module is under test)."""
