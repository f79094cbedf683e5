"""Tests of envfactory/env/sandbox/ (one test file per module where one module is under test)."""
