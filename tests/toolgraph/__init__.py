"""Tests of envfactory/toolgraph/ (one test file per module where one module is under test)."""
