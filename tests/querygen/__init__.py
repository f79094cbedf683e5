"""Tests of envfactory/querygen/ (one test file per module where one module is under test)."""
