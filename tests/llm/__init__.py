"""Tests of envfactory/llm/ (one test file per module where one module is under test)."""
