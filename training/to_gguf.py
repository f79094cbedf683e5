"""Convert a checkpoint to GGUF for fast evaluation with llama.cpp (the `transformers` provider's `gguf_path`).

    python training/to_gguf.py --model .envfactory/train/sft --out sft.gguf [--outtype f16] [--converter PATH]

`--model` is what `training/loading.py` reads (a checkpoint folder, a `.gguf` file, an alias). A model that is
not a plain transformers folder (a quantized GGUF that transformers dequantizes) is first written out as one, so
a base model and its fine-tune go through the same conversion. The converter is llama.cpp's
`convert_hf_to_gguf.py` from the sdist of the installed llama-cpp-python (`make setup-external` unpacks it with
its `conversion/` and `gguf-py/` under `.venv/share/llama.cpp/`, the default `--converter`); it runs as a
subprocess with the vendored `gguf-py` first on its path, so converter and GGUF writer are of one commit.
Nothing here writes Python source.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from envfactory.errors import ConfigError, EnvFactoryError
from training.loading import load_model_and_tokenizer

OUTTYPES = ("f32", "f16", "bf16", "q8_0")


class ConversionError(ConfigError):
    """The checkpoint could not be converted (no converter, a bad output place, the converter failed)."""


def default_converter() -> Path:
    """Where `make setup-external` unpacks llama.cpp's converter: under this environment's prefix."""
    return Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"


def convert(model: str, out: Path, converter: Path | None = None, outtype: str = "f16") -> Path:
    """Write `model` as a GGUF file at `out` through llama.cpp's converter; returns `out`. The file appears
    whole or not at all (written beside, then renamed)."""
    converter = converter or default_converter()
    if not converter.is_file():
        raise ConversionError(
            f"no converter at {converter}: `make setup-external` unpacks llama.cpp's convert_hf_to_gguf.py there, "
            "or pass --converter"
        )
    if outtype not in OUTTYPES:
        raise ConversionError(f"--outtype must be one of {', '.join(OUTTYPES)}, not '{outtype}'")
    if out.is_dir():
        raise ConversionError(f"{out} is a folder: --out names the .gguf file to write")
    out.parent.mkdir(parents=True, exist_ok=True)
    source = Path(model)
    with tempfile.TemporaryDirectory(prefix="to-gguf-", dir=out.parent) as scratch:
        if not (source.is_dir() and (source / "config.json").is_file()):
            loaded, tokenizer, _ = load_model_and_tokenizer(model, "float32")
            source = Path(scratch) / "hf"
            loaded.save_pretrained(source)
            tokenizer.save_pretrained(source)
        partial = Path(scratch) / out.name
        argv = [sys.executable, str(converter), str(source), "--outfile", str(partial), "--outtype", outtype]
        path = os.pathsep.join(p for p in (str(converter.parent / "gguf-py"), os.environ.get("PYTHONPATH")) if p)
        done = subprocess.run(argv, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": path})
        if done.returncode != 0 or not partial.is_file():
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            raise ConversionError(f"convert_hf_to_gguf.py failed (exit {done.returncode}): {tail}")
        partial.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--converter", type=Path, default=None, help="llama.cpp's convert_hf_to_gguf.py")
    parser.add_argument("--outtype", default="f16", choices=OUTTYPES)
    args = parser.parse_args(argv)
    try:
        print(convert(args.model, args.out, args.converter, args.outtype))
    except (EnvFactoryError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
