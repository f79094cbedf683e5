"""Tests of envfactory/scaling/ (one test file per module where one module is under test)."""
