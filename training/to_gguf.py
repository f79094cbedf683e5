"""Convert a checkpoint to GGUF for fast evaluation with llama.cpp (the `transformers` provider's `gguf_path`).

    python training/to_gguf.py --model .envfactory/train/sft --out sft.gguf \\
        --converter /tmp/llama.cpp/convert_hf_to_gguf.py [--outtype f16]

`--model` is what `training/loading.py` reads (a checkpoint folder, a `.gguf` file, an alias). A model that is
not a plain transformers folder (a quantized GGUF that transformers dequantizes) is first written out as one, so
a base model and its fine-tune go through the same conversion. The converter is llama.cpp's
`convert_hf_to_gguf.py`; it ships in the llama-cpp-python sdist:
`pip download --no-deps --no-binary :all: llama-cpp-python==<installed version>`, under `vendor/llama.cpp/`
(it needs the `gguf` package). It runs as a subprocess; nothing here writes Python source.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from training.loading import load_model_and_tokenizer


def convert(model: str, out: Path, converter: Path, outtype: str = "f16") -> Path:
    """Write `model` as a GGUF file at `out` through llama.cpp's converter; returns `out`."""
    if not converter.is_file():
        raise FileNotFoundError(f"no converter at {converter}: see `python training/to_gguf.py --help`")
    out.parent.mkdir(parents=True, exist_ok=True)
    source = Path(model)
    with tempfile.TemporaryDirectory(prefix="to-gguf-") as scratch:
        if not (source.is_dir() and (source / "config.json").is_file()):
            loaded, tokenizer, _ = load_model_and_tokenizer(model, "float32")
            source = Path(scratch)
            loaded.save_pretrained(source)
            tokenizer.save_pretrained(source)
        argv = [sys.executable, str(converter), str(source), "--outfile", str(out), "--outtype", outtype]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {done.returncode}):\n{tail}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--converter", type=Path, required=True, help="llama.cpp's convert_hf_to_gguf.py")
    parser.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"])
    args = parser.parse_args()
    print(convert(args.model, args.out, args.converter, args.outtype))


if __name__ == "__main__":
    main()
