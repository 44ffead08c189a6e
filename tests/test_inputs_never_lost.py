"""Nothing the input consists of is lost, whatever a command drops; nothing in /dev or /proc is
replaced; a DQL with an attribute is refused by the API as by the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import MODELS, Result, assert_bad_input, digest, dql_model, files_of, quantized_model, run_cli, session
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass.files import check_output_path


def outputs_of(path: Path) -> list[np.ndarray]:
    x = np.linspace(-3, 5, 128, dtype=np.float32).reshape(2, 64)
    return session(os.fspath(path)).run({"x": x})


def write(how: str, command: str, source: Path, output: Path | str) -> Result:
    """Run ``command`` through the CLI, or its *_file function (an InputError becomes exit 2)."""
    if how == "cli":
        return run_cli(command, source, "-o", output)
    try:
        getattr(dql_pass, f"{command}_file")(source, output)
    except dql_pass.InputError as error:
        return Result(2, "", f"dql-pass: error: {error}\n")
    return Result(0, "", "")


# an output over the input's data file is refused, though the output drops it.

@pytest.mark.parametrize("how", ["cli", "api"])
@pytest.mark.parametrize("spelling", ["m.onnx.data", "./m.onnx.data", "sub/../m.onnx.data", "w/weights.bin"])
def test_lower_onto_the_inputs_data_is_refused(tmp_path, how, spelling):
    (tmp_path / "sub").mkdir()
    location = "w/weights.bin" if spelling.startswith("w/") else "m.onnx.data"
    source = quantized_model(tmp_path / "m.onnx", location)
    expected, before = outputs_of(source), files_of(tmp_path / Path(location).parent)
    run = write(how, "lower", source, tmp_path / spelling)
    assert_bad_input(run, "would overwrite the input or its external data")
    assert files_of(tmp_path / Path(location).parent) == before
    assert [a.tobytes() for a in outputs_of(source)] == [a.tobytes() for a in expected]


def _expanded_with_external_constants(folder: Path) -> Path:
    """An expansion whose constants (and all else) sit in e.onnx.data: fuse drops them all."""
    expanded = dql_pass.expand(dql_model(13))[0]
    path = folder / "e.onnx"
    onnx.save(expanded, path, save_as_external_data=True, location="e.onnx.data", size_threshold=0)
    assert onnx.load(path, load_external_data=False).graph.initializer[0].data_location == TensorProto.EXTERNAL
    return path


@pytest.mark.parametrize("how", ["cli", "api"])
def test_fuse_onto_the_inputs_data_is_refused(tmp_path, how):
    source = _expanded_with_external_constants(tmp_path)
    before = files_of(tmp_path)
    assert_bad_input(write(how, "fuse", source, tmp_path / "e.onnx.data"),
                     "would overwrite the input or its external data")
    assert files_of(tmp_path) == before


def test_the_input_reached_through_a_bind_mount_is_refused(tmp_path):
    """The input's folder mounted again elsewhere: its path there resolves to no input file, but
    replacing that name replaces the input (and an output named as its data file, the data)."""
    source_folder, view = tmp_path / "src", tmp_path / "view"
    source_folder.mkdir(), view.mkdir()
    source = quantized_model(source_folder / "m.onnx", "m.onnx.data")
    before = files_of(source_folder)
    script = (f"mount --bind {source_folder} {view} || exit 99; "
              f"{sys.executable} -m dql_pass lower {source} -o {view / 'm.onnx'}; echo $?; "
              f"{sys.executable} -m dql_pass lower {source} -o {view / 'm.onnx.data'}; echo $?")
    try:  # a mount namespace of its own, gone with the process: nothing stays mounted
        run = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                             capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        pytest.skip("no unshare(1) here to make a mount namespace")
    if run.returncode == 99 or "unshare failed" in run.stderr:
        pytest.skip(f"cannot bind-mount here (not root, or no mount namespace): {run.stderr.strip()}")
    assert run.stdout.split() == ["2", "2"], run.stderr
    assert "the output path is the input path" in run.stderr and "would overwrite the input" in run.stderr
    assert files_of(source_folder) == before


def test_save_model_protects_the_source_it_did_not_load(tmp_path):
    """The model handed to save_model came from a ModelProto: the source's files are read from disk."""
    source = quantized_model(tmp_path / "m.onnx", "m.onnx.data")
    lowered, _ = dql_pass.lower(onnx.load(source))
    before = files_of(tmp_path)
    with pytest.raises(dql_pass.InputError, match="would overwrite the input or its external data"):
        dql_pass.save_model(ir.from_proto(lowered), tmp_path / "m.onnx.data", source=source)
    assert files_of(tmp_path) == before


@pytest.mark.parametrize("how", ["cli", "api"])
def test_an_output_at_the_link_named_as_the_input_is_refused(tmp_path, how):
    """The input given through a link: -o that same link would leave the input's name to the output."""
    source = quantized_model(tmp_path / "real.onnx", "real.onnx.data")
    (tmp_path / "in.onnx").symlink_to("real.onnx")
    before = files_of(tmp_path)
    assert_bad_input(write(how, "lower", tmp_path / "in.onnx", tmp_path / "in.onnx"),
                     "the output path is the input path")
    assert (tmp_path / "in.onnx").is_symlink() and files_of(tmp_path) == before and source.exists()


# the sweep keeps what the input, or any model that stays, refers to.

@pytest.mark.parametrize("how", ["cli", "api"])
@pytest.mark.parametrize(("command", "kept_weight"), [("lower", False), ("lower", True), ("expand", False)])
def test_writing_over_the_model_an_input_was_copied_from_keeps_the_inputs_data(tmp_path, how, command, kept_weight):
    """lower drops every weight of the input (without ``kept_weight``): nothing in the output named its data."""
    # a.onnx as an earlier write of -o a.onnx left it: its data file has the name the sweep removes.
    quantized_model(tmp_path / "a.onnx", "a.onnx.0123456789ab.data", kept_weight=kept_weight)
    shutil.copy(tmp_path / "a.onnx", tmp_path / "a_backup.onnx")
    expected, data = outputs_of(tmp_path / "a_backup.onnx"), digest(tmp_path / "a.onnx.0123456789ab.data")
    run = write(how, command, tmp_path / "a_backup.onnx", tmp_path / "a.onnx")
    assert run.returncode == 0, run.stderr
    assert digest(tmp_path / "a.onnx.0123456789ab.data") == data
    assert [a.tobytes() for a in outputs_of(tmp_path / "a_backup.onnx")] == [a.tobytes() for a in expected]


def test_writing_over_a_model_keeps_the_data_of_its_copy(tmp_path):
    """Another model of the folder survives the write: its data file stays though nobody named it."""
    quantized_model(tmp_path / "a.onnx", "a.onnx.0123456789ab.data")
    shutil.copy(tmp_path / "a.onnx", tmp_path / "a_backup.onnx")
    expected = outputs_of(tmp_path / "a_backup.onnx")
    other = quantized_model(tmp_path / "other" / "o.onnx", "o.onnx.data")
    for _ in range(2):  # the second write sweeps what the first left, and only that
        run = run_cli("expand", other, "-o", tmp_path / "a.onnx")
        assert run.returncode == 0, run.stderr
    assert [a.tobytes() for a in outputs_of(tmp_path / "a_backup.onnx")] == [a.tobytes() for a in expected]
    written = {p.name for p in tmp_path.glob("a.onnx.*.data")}
    assert len(written) == 2 and "a.onnx.0123456789ab.data" in written  # the copy's, and the new model's


def test_a_link_to_an_old_data_file_keeps_it(tmp_path):
    quantized_model(tmp_path / "a.onnx", "a.onnx.0123456789ab.data")
    (tmp_path / "a_backup.onnx").write_bytes(
        (tmp_path / "a.onnx").read_bytes().replace(b"a.onnx.0123456789ab.data", b"backup.dat.data.data.dat"))
    (tmp_path / "backup.dat.data.data.dat").symlink_to("a.onnx.0123456789ab.data")
    expected = outputs_of(tmp_path / "a_backup.onnx")
    other = quantized_model(tmp_path / "other" / "o.onnx", "o.onnx.data")
    assert run_cli("expand", other, "-o", tmp_path / "a.onnx").returncode == 0
    assert [a.tobytes() for a in outputs_of(tmp_path / "a_backup.onnx")] == [a.tobytes() for a in expected]


def test_gen_tests_keeps_the_data_of_a_model_named_like_the_suite(tmp_path):
    """suite.onnx was once written as -o suite: gen-tests suite swept its data."""
    quantized_model(tmp_path / "suite", "suite.0123456789ab.data")
    os.rename(tmp_path / "suite", tmp_path / "model.onnx")
    expected = outputs_of(tmp_path / "model.onnx")
    dql_pass.generate_suite(tmp_path / "suite", opsets=[13], forms=["native"], include_large=False, names=["zeros"])
    assert [a.tobytes() for a in outputs_of(tmp_path / "model.onnx")] == [a.tobytes() for a in expected]


def test_the_sweep_still_removes_what_nothing_refers_to(tmp_path):
    source = quantized_model(tmp_path / "in" / "m.onnx", "m.onnx.data")
    (tmp_path / "out").mkdir()
    for _ in range(3):
        assert run_cli("expand", source, "-o", tmp_path / "out" / "x.onnx").returncode == 0
    assert len(list((tmp_path / "out").glob("x.onnx.*.data"))) == 1


def test_every_model_is_read_for_references_and_weights_are_not(tmp_path):
    """The sweep reads through only what parses as protobuf to its end: every model, and no weights."""
    from dql_pass.files.references import _may_be_model

    models = [*Path(__file__).resolve().parent.parent.joinpath("models").glob("*.onnx")]
    models.append(quantized_model(tmp_path / "m.onnx", "m.onnx.data"))
    inline = tmp_path / "inline.onnx"
    onnx.save(onnx.load(models[-1]), inline)
    weights = [tmp_path / "m.onnx.data", tmp_path / "random.bin", tmp_path / "zeros.bin"]
    weights[1].write_bytes(np.random.default_rng(0).bytes(1 << 20))
    weights[2].write_bytes(bytes(1 << 20))
    for path in [*models, inline]:
        with open(path, "rb") as file:
            assert _may_be_model(file), path
    for path in weights:
        with open(path, "rb") as file:
            assert not _may_be_model(file), path


def test_a_new_data_name_that_is_taken_is_never_written_over(tmp_path, monkeypatch):
    """The new data file's name must be free: here it is the input's data file (a forced draw)."""
    quantized_model(tmp_path / "a.onnx", "a.onnx.0123456789ab.data", kept_weight=True)
    os.rename(tmp_path / "a.onnx", tmp_path / "in.onnx")
    before = files_of(tmp_path)
    monkeypatch.setattr("dql_pass.files.safe.secrets.token_hex", lambda n: "0123456789ab")
    with pytest.raises(dql_pass.InputError, match="name is taken"):
        dql_pass.lower_file(tmp_path / "in.onnx", tmp_path / "a.onnx")
    assert files_of(tmp_path) == before


# nothing in /dev or /proc is replaced, nor through a link of any length.

@pytest.mark.parametrize("path", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "/dev/null", "/dev/dql_pass_new"])
def test_system_files_are_never_outputs(path):
    # Checked without a write: a write would replace them, and /dev/stdout is the machine's.
    with pytest.raises(dql_pass.InputError, match="in /dev or /proc"):
        check_output_path(path)


@pytest.mark.parametrize("target", ["/proc/self/fd/1", "/dev/fd/1", "/dev/stdout", "chain", "fds/1"])
@pytest.mark.parametrize("command", ["lower", "expand", "fuse", "verify --json"])
def test_a_link_into_dev_or_proc_is_refused_whatever_it_points_to(tmp_path, capfd, target, command):
    source = quantized_model(tmp_path / "in.onnx", "in.onnx.data")
    (tmp_path / "fds").symlink_to("/proc/self/fd")
    (tmp_path / "chain").symlink_to("/dev/stdout")
    out = tmp_path / "out"
    if target == "fds/1":
        out = tmp_path / "fds" / "1"
    else:
        out.symlink_to(target if target.startswith("/") else tmp_path / target)
    args = ["verify", source, source, "--json", out] if command == "verify --json" else [command, source, "-o", out]
    run = run_cli(*args)  # descriptor 1 is capfd's file: a regular file, as in `> log`
    assert_bad_input(run, "in /dev or /proc")
    assert capfd.readouterr().out == ""
    links = {"chain", "fds"} | ({"out"} if target != "fds/1" else set())
    assert {p.name for p in tmp_path.iterdir() if p.is_symlink()} == links
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(links | {"in.onnx", "in.onnx.data"})


def test_a_link_to_a_file_outside_dev_is_still_replaced(tmp_path):
    source = quantized_model(tmp_path / "in.onnx", "in.onnx.data")
    (tmp_path / "elsewhere").write_bytes(b"kept")
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")
    assert run_cli("lower", source, "-o", tmp_path / "out").returncode == 0
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "elsewhere").read_bytes() == b"kept"


def test_gen_tests_never_writes_into_dev():
    suite = Path("/dev/dql_pass_suite_test")
    try:
        with pytest.raises(dql_pass.InputError, match="in /dev or /proc"):
            dql_pass.generate_suite(suite, opsets=[13], forms=["native"], include_large=False, names=["zeros"])
        assert not os.path.lexists(suite)
    finally:
        shutil.rmtree(suite, ignore_errors=True)


# a DQL with an attribute is refused by the API as by the CLI, before anything changes.

def _with_attribute() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((4, 4), np.int8), "w")
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], to=TensorProto.INT8),
         helper.make_node("MatMulInteger", ["q", "w", "z"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 4])], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("rewrite", [dql_pass.expand, dql_pass.lower])
def test_a_dql_with_an_attribute_is_refused_by_the_api(rewrite):
    model = ir.from_proto(_with_attribute())
    before = ir.to_proto(model).SerializeToString()
    with pytest.raises(dql_pass.InputError, match="has the attribute\\(s\\) 'to'; it takes none"):
        rewrite(model)
    assert ir.to_proto(model).SerializeToString() == before  # lower rewrote MatMulInteger first
    with pytest.raises(dql_pass.InputError, match="'to'"):
        rewrite(_with_attribute())


@pytest.mark.parametrize("command", ["expand", "lower"])
def test_a_dql_with_an_attribute_is_refused_by_the_cli(tmp_path, command):
    onnx.save(_with_attribute(), tmp_path / "m.onnx")
    assert_bad_input(run_cli(command, tmp_path / "m.onnx", "-o", tmp_path / "o.onnx"), "attribute")
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("suffix", [".textproto", ".json"])
def test_the_sweep_keeps_the_data_of_a_copy_in_a_text_format(tmp_path, suffix):
    # The sweep once read only binary models for the names of their data files.
    source = tmp_path / "m.onnx"
    onnx.save(onnx.load(MODELS / "mlp_dynamic.onnx"), source, save_as_external_data=True, location="m.data",
              size_threshold=0)
    out, keep = tmp_path / f"out{suffix}", tmp_path / f"keep{suffix}"
    dql_pass.lower_file(source, out)
    shutil.copy(out, keep)
    dql_pass.lower_file(source, out)
    onnx.checker.check_model(onnx.load(keep), full_check=True)  # its data is still there


def _loads_with_its_data(path: Path, format: str | None = None) -> None:
    model = onnx.load(path, format=format)  # reads the external data: raises when a data file is gone
    onnx.checker.check_model(model, full_check=True)


def test_the_sweep_reads_a_textproto_copy_whatever_its_name_and_escapes(tmp_path):
    # textproto writes ' as \' (and non-ASCII as octal escapes); a copy named .onnx is text all the same.
    source = quantized_model(tmp_path / "src" / "m.onnx", "m.onnx.data")
    (tmp_path / "w").mkdir()
    out = tmp_path / "w" / "mod'elè.onnx"
    dql_pass.expand_file(source, out)
    copy = onnx.load(out, load_external_data=False)
    onnx.save(copy, tmp_path / "w" / "copy.textproto")
    onnx.save(copy, tmp_path / "w" / "copy.onnx", format="textproto")
    assert b"\\'" in (tmp_path / "w" / "copy.textproto").read_bytes()
    dql_pass.expand_file(source, out)
    _loads_with_its_data(tmp_path / "w" / "copy.textproto")
    _loads_with_its_data(tmp_path / "w" / "copy.onnx", "textproto")
    assert len(list((tmp_path / "w").glob("*.data"))) == 2  # the copies' and the new output's


def test_the_sweep_reads_a_json_copy_with_escaped_characters(tmp_path):
    # JSON writes è as \u00e8: `cp modèle.json backup.json`, then the same lower again.
    source = quantized_model(tmp_path / "src" / "m.onnx", "m.onnx.data", kept_weight=True)
    out = tmp_path / "modèle.json"
    dql_pass.lower_file(source, out)
    shutil.copy(out, tmp_path / "backup.json")
    assert b"\\u00e8" in (tmp_path / "backup.json").read_bytes()
    dql_pass.lower_file(source, out)
    _loads_with_its_data(tmp_path / "backup.json")


def test_the_sweep_reads_an_onnxtxt_copy(tmp_path):
    source = quantized_model(tmp_path / "src" / "m.onnx", "m.onnx.data")
    out = tmp_path / 'x"y.onnx'
    dql_pass.expand_file(source, out)
    text = onnx.printer.to_text(onnx.load(out, load_external_data=False))
    (tmp_path / "copy.txt").write_text(text)
    assert '\\"' in text
    dql_pass.expand_file(source, out)
    model = onnx.parser.parse_model((tmp_path / "copy.txt").read_text())
    onnx.load_external_data_for_model(model, os.fspath(tmp_path))


def test_strings_of_every_text_format_are_read_in_every_spelling():
    import io

    from dql_pass.files.references import _quoted

    key = "d'è\".0123456789ab.data".encode()
    spellings = [
        b'location: "d\\\'\\303\\250\\".0123456789ab.data"\n',  # textproto, as protobuf writes it
        b"value: 'd\\'\\u00e8\"' \".0123\" # a comment's ' quote\n '456789ab\\x2edata'\n",  # joined, hex escape
        b'{"value": "d\'\\u00e8\\".0123456789ab\\u002edata"}',  # JSON
        b'<ir_version: 8>\n# a comment\'s " quote\ng () => () '
        b'<float[1] w = ["location": "d\'\xc3\xa8\\".0123456789ab.data"]> {}',
    ]
    tensor = "raw_data: '" + "\\000\\\\\\'\"" * 20_000 + "' location: "  # too long to be a location, read past
    spellings.append(tensor.encode() + spellings[0].split(b": ", 1)[1])
    for text in spellings:
        for block in (3, 1000, 1 << 20):  # strings cut between blocks
            assert _quoted(io.BytesIO(text), {key}, block) == {key}, (text, block)
    weights = np.random.default_rng(0).bytes(1 << 16) + b'"' + key + b'"'
    assert _quoted(io.BytesIO(weights), {key}) == set()  # not UTF-8: no text format
    assert _quoted(io.BytesIO(bytes(1 << 16) + b'"' + key + b'"'), {key}) == set()  # zeros: no text outside strings


def test_a_string_too_long_for_a_location_is_read_past_wherever_its_cut_falls():
    """A string past the length of any location is no longer collected but searched for its end:
    the cut falls at every place of its escapes (each shift), and the location after it is read."""
    import io

    from dql_pass.files.references import _quoted, _Strings

    key = "d'è\".0123456789ab.data".encode()
    location = b'"d\\\'\\303\\250\\".0123456789ab.data"\n'
    for shift in range(9):  # the repeated escapes take 9 bytes
        text = ("x" * shift + "raw_data: '" + "\\000\\\\\\'\"" * 20_000 + "' location: ").encode() + location
        for block in (1000, 1 << 20):
            assert _quoted(io.BytesIO(text), {key}, block) == {key}, (shift, block)
        strings, spelt = _Strings(b"\"'", multiline=False), [[], [], []]  # textproto's
        strings.feed(text, spelt)
        assert spelt[0] == [location.strip()[1:-1]], shift  # the location alone: the long string ended where it ends


@pytest.mark.parametrize("archive", ["beside", "/dev/shm"])
def test_a_linked_model_in_the_folder_keeps_the_data_it_reads_beside_the_link(tmp_path, archive):
    """v1.onnx -> archive/v1.onnx, a copy of an earlier output: onnx reads its data beside the link, and the sweep
    read links only for the file they lead to, so it removed that data. /dev/shm is a folder for files, not one
    of the system's."""
    source = quantized_model(tmp_path / "in" / "m.onnx", "m.onnx.data")
    out = tmp_path / "out"
    out.mkdir()
    assert run_cli("expand", source, "-o", out / "x.onnx").returncode == 0
    if archive == "beside":
        (out / "archive").mkdir()
        kept = out / "archive" / "v1.onnx"
    else:
        if not Path("/dev/shm").is_dir():
            pytest.skip("no /dev/shm here")
        kept = Path(tempfile.mkdtemp(dir="/dev/shm")) / "v1.onnx"
    shutil.copy(out / "x.onnx", kept)
    (out / "v1.onnx").symlink_to(kept)
    expected = outputs_of(out / "v1.onnx")
    try:
        assert run_cli("lower", source, "-o", out / "x.onnx").returncode == 0
        assert [a.tobytes() for a in outputs_of(out / "v1.onnx")] == [a.tobytes() for a in expected]
    finally:
        if archive != "beside":
            shutil.rmtree(kept.parent)


@pytest.mark.parametrize("how", ["cli", "api"])
def test_the_data_beside_the_file_a_linked_input_leads_to_is_the_inputs_too(tmp_path, how):
    """a/in.onnx -> ../b/m.onnx: the data read is a/m.onnx.data, but b/m.onnx needs b/m.onnx.data, which an
    output there overwrote."""
    quantized_model(tmp_path / "b" / "m.onnx", "m.onnx.data")
    (tmp_path / "a").mkdir()
    shutil.copy(tmp_path / "b" / "m.onnx.data", tmp_path / "a")
    (tmp_path / "a" / "in.onnx").symlink_to("../b/m.onnx")
    before = files_of(tmp_path / "b")
    assert_bad_input(write(how, "expand", tmp_path / "a" / "in.onnx", tmp_path / "b" / "m.onnx.data"),
                     "would overwrite the input or its external data")
    assert files_of(tmp_path / "b") == before
