"""Tests of envfactory/eval/ (one test file per module where one module is under test)."""
