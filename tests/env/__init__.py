"""Tests of envfactory/env/ (one test file per module where one module is under test)."""
