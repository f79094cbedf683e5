"""Tests of envfactory/reward/ (one test file per module where one module is under test)."""
