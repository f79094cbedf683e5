"""Helpers the test folders share (servers, chains, scripted projects, paths) and the slow-first plugin;
no tests of envfactory."""
