"""The repository's own scripts: benchmarks, the sample models and a check on real models.

Run each as a module from the repository root, ``python -m tools.NAME``:

- ``bench``: the benchmarks behind ``BENCHMARKS.md``; ``bench_fuse`` writes its *Fusion* section
  and ``bench_verify`` times ``dql-pass verify``.
- ``make_models``: the sample models in ``models/``.
- ``check_real_model``: dql_pass end to end on one quantized model.

The scripts share two modules, imported explicitly (``from tools import harness, models``):

- ``harness``: the timing loop, medians, whole-process timing and the BENCHMARKS.md report;
- ``models``: the synthetic models (one-node, chains, external weights, a MiniLM-sized encoder),
  ``quantize_dynamic`` and random inputs.

The package is not installed with dql_pass; it is found through the repository root, which is
the current folder of ``python -m`` and is on pytest's ``pythonpath``.
"""
