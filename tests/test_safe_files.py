"""Safe writing has one home, dql_pass/files/; gen-tests and the model save share
its stage folders, their names and the sweep. (That no other module writes safely on its own is
tests/test_layers.py's.)"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import subprocess
import sys
import textwrap

import onnx
import pytest
from helpers import MODELS, files_of, quantized_model

import dql_pass
from dql_pass import files, suites
from dql_pass.files import models, safe

ONE_FOLDER = {"opsets": (13,), "forms": ("native",), "names": ("rank_0",)}


def test_the_package_exports_what_its_modules_do():
    assert files.__all__ == sorted(safe.__all__ + models.__all__)
    assert all(getattr(files, name) is getattr(safe if name in safe.__all__ else models, name)
               for name in files.__all__)


@pytest.mark.parametrize("one_step", [True, False])
def test_a_suite_folder_with_a_long_name_is_written_and_replaced(tmp_path, monkeypatch, one_step):
    """gen-tests writes a suite into an OUTDIR whose name is 250 bytes long, then replaces it, by one
    exchange and by two renames: its stage beside OUTDIR has a name within the 255-byte limit, and
    only the new suite is left."""
    if not one_step:
        monkeypatch.setattr(safe, "exchange", lambda a, b: False)
    outdir = tmp_path / ("s" * 250)
    for opset in (13, 11):  # the second run replaces the first suite
        suites.generate_suite(outdir, **{**ONE_FOLDER, "opsets": (opset,)})
        assert [p.name for p in tmp_path.iterdir()] == [outdir.name]
    assert [p.name for p in outdir.iterdir() if p.is_dir()] == ["test_dynamicquantizelinear_rank_0_opset11"]


_KILLED_WHILE_WRITING = textwrap.dedent("""
    import os, signal, sys
    from dql_pass import suites
    from dql_pass.suites import generate

    def killed(*args, **kwargs):  # kill -9 while the suite is being written into its stage
        os.kill(os.getpid(), signal.SIGKILL)

    generate._write_cases = killed
    suites.generate_suite(sys.argv[1], opsets=(13,), forms=("native",), names=("rank_0",))
""")


@pytest.mark.parametrize("length", [3, 220])
def test_a_stage_that_a_killed_gen_tests_left_is_swept_by_the_next_run(tmp_path, length):
    """The stage that a gen-tests killed (kill -9) while writing leaves beside OUTDIR is swept by the
    next run, for a short OUTDIR name and for one of 220 bytes, whose stage name is shortened."""
    outdir = tmp_path / ("s" * length)
    run = subprocess.run([sys.executable, "-c", _KILLED_WHILE_WRITING, str(outdir)], capture_output=True, text=True)
    assert run.returncode == -9, run.stderr
    assert [p.name.endswith(".stage") for p in tmp_path.iterdir()] == [True]
    suites.generate_suite(outdir, **ONE_FOLDER)
    assert [p.name for p in tmp_path.iterdir()] == [outdir.name]


def test_a_folder_named_like_a_stage_but_for_mkdtemp_s_random_part_is_kept(tmp_path):
    """The sweep removes a stage whole: a user's folder `.m.onnx.notes.stage` went with everything in it."""
    notes = tmp_path / ".m.onnx.notes.stage"
    notes.mkdir()
    (notes / "n.txt").write_text("mine")
    dql_pass.expand_file(MODELS / "mlp_dynamic.onnx", tmp_path / "m.onnx")
    assert (notes / "n.txt").read_text() == "mine"


def test_a_failed_write_never_removes_a_file_that_holds_the_new_data_name(tmp_path, monkeypatch):
    """A write whose random draw for the new data file's name gives the input's data file's name, and
    which then fails (a full disk), leaves the folder as it was: the clean-up removes only a data
    file that the write itself put in place."""
    quantized_model(tmp_path / "a.onnx", "a.onnx.0123456789ab.data", kept_weight=True)
    os.rename(tmp_path / "a.onnx", tmp_path / "in.onnx")
    before = files_of(tmp_path)
    monkeypatch.setattr(secrets, "token_hex", lambda n: "0123456789ab")  # the draw: the input's data file

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(onnx, "save_model", full_disk)
    with pytest.raises(dql_pass.InputError, match="No space left"):
        dql_pass.lower_file(tmp_path / "in.onnx", tmp_path / "a.onnx")
    assert files_of(tmp_path) == before


@pytest.mark.parametrize("one_step", [True, False])
def test_put_folder_replaces_a_folder_whole_or_not_at_all(tmp_path, monkeypatch, one_step):
    """What gen-tests and the web setup (onnxruntime-web's unpacked package) put in place: the new
    folder at the target and the old one at the stage, and where the second of two renames fails,
    the old folder back at the target."""
    if not one_step:
        monkeypatch.setattr(safe, "exchange", lambda a, b: False)
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "old").write_text("old")
    (tmp_path / "stage").mkdir()
    (tmp_path / "stage" / "new").write_text("new")
    safe.put_folder(tmp_path / "stage", tmp_path / "target")
    assert [p.name for p in (tmp_path / "target").iterdir()] == ["new"]
    assert [p.name for p in (tmp_path / "stage").iterdir()] == ["old"]
    safe.put_folder(tmp_path / "stage", tmp_path / "fresh")  # no folder there yet: one rename
    assert [p.name for p in (tmp_path / "fresh").iterdir()] == ["old"] and not (tmp_path / "stage").exists()
    if one_step:
        return
    (tmp_path / "stage").mkdir()
    rename, calls = os.rename, []

    def second_fails(source, target):
        calls.append(source)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        rename(source, target)

    monkeypatch.setattr(os, "rename", second_fails)
    with pytest.raises(OSError):
        safe.put_folder(tmp_path / "stage", tmp_path / "target")
    assert [p.name for p in (tmp_path / "target").iterdir()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "stage", "target"]


def test_the_temporary_file_that_a_killed_small_write_left_is_swept_by_the_next_write(tmp_path):
    """The temporary file that an atomic_path write killed (kill -9) inside its block leaves is swept
    by the next atomic_path write of that file; one in flight (locked by its writer) is kept."""
    report = tmp_path / "r.json"
    killed = textwrap.dedent(f"""
        import os, signal
        from dql_pass.files import atomic_path
        with atomic_path({str(report)!r}) as temporary:
            open(temporary, "w").write("half")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert subprocess.run([sys.executable, "-c", killed]).returncode == -9
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".r.json.") and left[0].endswith(".tmp")
    with safe.atomic_path(report) as in_flight, open(in_flight, "w") as file:
        file.write("a")
        with safe.atomic_path(report) as temporary:  # a second writer, done while the first is in flight
            open(temporary, "w").write("b")
        assert os.path.exists(in_flight) and report.read_text() == "b"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"] and report.read_text() == "a"


def _constant_and_initializer_model(path, elements: int, *, small: int = 0):
    """y = (x + c) * w: c a Constant node's tensor and w an initializer, ``elements`` float32 each;
    and ``small`` initializers under the external-data threshold, added to y one by one."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = numpy_helper.from_array(np.arange(elements, dtype=np.float32), "c")
    w = numpy_helper.from_array(np.full(elements, 3.0, np.float32), "w")
    nodes = [helper.make_node("Constant", [], ["c"], value=c), helper.make_node("Add", ["x", "c"], ["a"]),
             helper.make_node("Mul", ["a", "w"], ["y0"])]
    initializers = [w]
    for i in range(small):
        initializers.append(numpy_helper.from_array(np.full(elements, i, np.float32), f"s{i}"))
        nodes.append(helper.make_node("Add", [f"y{i}", f"s{i}"], [f"y{i + 1}"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [elements])],
                              [helper.make_tensor_value_info(f"y{small}", TensorProto.FLOAT, [elements])],
                              initializer=initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_a_one_file_output_counts_its_constants_and_graph_toward_the_protobuf_limit(tmp_path, monkeypatch):
    # 40 kB of initializer and 40 kB of Constant, against a limit of 60 kB: the initializers alone are under it.
    import numpy as np
    import onnx

    from helpers import session

    source = _constant_and_initializer_model(tmp_path / "in.onnx", 10_000)
    monkeypatch.setattr(models, "INLINE_LIMIT", 60_000)
    out = tmp_path / "out.onnx"
    models.save_model(models.load_model(source), out, source=source)
    assert out.stat().st_size <= 60_000
    written = onnx.load(out, load_external_data=False)
    constant = written.graph.node[0].attribute[0].t
    assert constant.data_location == onnx.TensorProto.EXTERNAL  # the Constant's tensor went too
    x = np.linspace(-1, 1, 10_000, dtype=np.float32)
    assert session(onnx.load(out)).run({"x": x})[0].tobytes() == session(onnx.load(source)).run({"x": x})[0].tobytes()


def test_a_model_past_the_protobuf_limit_without_its_large_tensors_is_refused(tmp_path, monkeypatch, capsys):
    # 32 tensors of 200 bytes (under the threshold of external data) against a limit of 4 kB.
    from dql_pass.cli import main

    source = _constant_and_initializer_model(tmp_path / "in.onnx", 50, small=30)
    monkeypatch.setattr(models, "INLINE_LIMIT", 4_000)
    assert main(["expand", str(source), "-o", str(tmp_path / "out.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "past protobuf's limit of 4,000" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx"]


def test_a_tensors_metadata_stays_one_entry_per_key_through_expand_fuse_and_lower(tmp_path):
    import onnx

    # onnx_ir (1.1) writes the entries of a tensor read from a one-file model twice: 2, 3, 4 copies.
    model = onnx.load(quantized_model(tmp_path / "m.onnx", "m.onnx.data", kept_weight=True))
    (v,) = [tensor for tensor in model.graph.initializer if tensor.name == "v"]
    v.metadata_props.add(key="tag", value="kept")
    source = tmp_path / "inline.onnx"
    onnx.save(model, source)
    path = source
    for command in ("expand", "fuse", "lower"):
        written = tmp_path / f"{command}.onnx"
        getattr(dql_pass, f"{command}_file")(path, written)
        (v,) = [t for t in onnx.load(written, load_external_data=False).graph.initializer if t.name == "v"]
        assert [(e.key, e.value) for e in v.metadata_props] == [("tag", "kept")], command
        path = written


# A signal while a write cleans up or sweeps: held back until that is done.

@pytest.fixture
def ctrl_c():
    """SIGINT at Python's default (a KeyboardInterrupt), where pytest runs in the background with it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _second_signal_in(monkeypatch, module, name: str) -> None:
    """``module.name`` sends this process SIGINT as it starts, then runs."""
    real = getattr(module, name)

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, interrupted)


def test_a_second_ctrl_c_while_a_stage_is_removed_leaves_none_of_it(tmp_path, monkeypatch, ctrl_c):
    """gen-tests' stage holds thousands of files: a second Ctrl-C landed in the first one's rmtree and left it."""
    _second_signal_in(monkeypatch, safe.shutil, "rmtree")
    with pytest.raises(KeyboardInterrupt):
        with safe.staged(tmp_path, "out.onnx") as stage:
            (stage / "weights").write_bytes(b"x" * 1000)
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_the_sweep_after_a_write_still_removes_the_old_data(tmp_path, monkeypatch, ctrl_c):
    """Once the new model is in place the write stands; the sweep of the old model's data went unfinished."""
    source = quantized_model(tmp_path / "in" / "m.onnx", "m.onnx.data")
    (tmp_path / "out").mkdir()
    dql_pass.expand_file(source, tmp_path / "out" / "x.onnx")
    (old,) = (tmp_path / "out").glob("x.onnx.*.data")
    _second_signal_in(monkeypatch, safe, "sweep")
    with pytest.raises(KeyboardInterrupt):
        dql_pass.lower_file(source, tmp_path / "out" / "x.onnx")
    (new,) = (tmp_path / "out").glob("x.onnx.*.data")
    assert new != old and sorted(p.name for p in (tmp_path / "out").iterdir()) == ["x.onnx", new.name]
    onnx.checker.check_model(os.fspath(tmp_path / "out" / "x.onnx"), full_check=True)


def test_ctrl_c_while_the_folder_is_read_for_references_undoes_the_write(tmp_path, monkeypatch, ctrl_c):
    """Reading every file of the folder removes nothing and may take minutes (a large linked file): it comes before
    the new output is in place, with the signals not held back, so an interrupt there leaves the old output."""
    source = quantized_model(tmp_path / "in" / "m.onnx", "m.onnx.data")
    (tmp_path / "out").mkdir()
    dql_pass.expand_file(source, tmp_path / "out" / "x.onnx")
    before = files_of(tmp_path / "out")
    _second_signal_in(monkeypatch, safe, "referred_to")
    with pytest.raises(KeyboardInterrupt):
        dql_pass.lower_file(source, tmp_path / "out" / "x.onnx")
    assert files_of(tmp_path / "out") == before


def test_a_link_loop_in_the_folder_stops_no_sweep(tmp_path):
    """A link that leads nowhere is no model: a loop read as 'cannot read, keep every data file'."""
    source = quantized_model(tmp_path / "in" / "m.onnx", "m.onnx.data")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "loop_a").symlink_to("loop_b")
    (tmp_path / "out" / "loop_b").symlink_to("loop_a")
    for _ in range(2):
        dql_pass.expand_file(source, tmp_path / "out" / "x.onnx")
    assert len(list((tmp_path / "out").glob("x.onnx.*.data"))) == 1
