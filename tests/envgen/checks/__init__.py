"""Tests of envfactory/envgen/checks/ (one test file per module where one module is under test)."""
