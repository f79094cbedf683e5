"""Tests of envfactory/suites/bfcl/ (one test file per module where one module is under test)."""
