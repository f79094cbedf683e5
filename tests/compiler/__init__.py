"""Tests of envfactory/compiler/ (one test file per module where one module is under test)."""
