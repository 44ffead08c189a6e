"""Write dql_pass/bodies/ again from the onnxscript functions of dql_pass/onnxscript_bodies.py.

Run from the repository root after changing a variant: ``python -m tools.make_bodies``. The test
``test_the_shipped_bodies_are_what_the_onnxscript_functions_build`` fails until the files match.
"""

from __future__ import annotations

from dql_pass import decomposition
from dql_pass.files import atomic_path
from dql_pass.op import VARIANTS, ZERO_RANGE_POLICIES


def main() -> None:
    for variant in VARIANTS:
        for zero_range in ZERO_RANGE_POLICIES:
            path = decomposition.body_path(variant, zero_range)
            with atomic_path(path, "body") as temporary, open(temporary, "wb") as file:
                file.write(decomposition.build_body(variant, zero_range))
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
