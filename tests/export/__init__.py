"""Tests of envfactory/export/ (one test file per module where one module is under test)."""
