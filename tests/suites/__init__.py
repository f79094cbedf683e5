"""Tests of envfactory/suites/ (one test file per module where one module is under test)."""
