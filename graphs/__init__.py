"""The LangGraph wiring of the two LLM pipelines: EnvGen (`envgen.py`) and QueryGen (`querygen.py`,
`querygen_batch.py`, `routing.py`), their checkpointers (`checkpoint.py`) and their commands (`cli/main.py`:
`envfactory envgen`; `synth_cli.py`: `envfactory synth --mode llm`). Nodes are thin wrappers over
`agents/`; the library (`envfactory/`) never imports this package."""
