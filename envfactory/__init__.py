"""EnvFactory: executable, stateful, verifiable tool environments for tool-use agents."""

__version__ = "0.1.0"
