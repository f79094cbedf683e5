"""The commands that run LangGraph graphs (`envfactory envgen`, `envfactory synth`), registered with the
`envfactory` CLI through the `envfactory.cli` entry point group (`envfactory/` never imports LangGraph).
"""
