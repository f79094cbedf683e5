"""Tests of envfactory/metatools/ (one test file per module where one module is under test)."""
