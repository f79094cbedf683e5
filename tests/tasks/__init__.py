"""Tests of envfactory/tasks/ (one test file per module where one module is under test)."""
