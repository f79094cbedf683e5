"""Tests of envfactory/hubs/ (one test file per module where one module is under test)."""
