"""Tests of envfactory/envgen/ (one test file per module where one module is under test)."""
