"""The converter process of the LiteRT runtimes: ONNX to ``.tflite`` with onnx2tf's flatbuffer_direct
backend, run by the Python of the converter's virtual environment, never imported by dql_pass.

Usage: ``python -I convert.py MODEL.onnx FOLDER``. MODEL is a private copy (onnx2tf writes over
the file it is given); the ``.tflite`` and onnx2tf's reports go to FOLDER. Exit code 0 when
``FOLDER/model_float32.tflite`` was written; anything else is a refusal, with onnx2tf's last lines
on stderr. onnx2tf names the file after its input: give it ``model.onnx``.

Before onnx2tf is imported, an audit hook refuses every socket connection, name lookup and new
process: onnx2tf (and onnxsim, which it would run as a command, and which pip-installs
onnxruntime when it cannot import it) is never let to reach the network or install a package.
onnxsim is not used (``not_use_onnxsim``), so no process needs starting.
"""

import sys

_REFUSED = frozenset({
    "socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.sendto",
    "socket.sendmsg", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "urllib.Request",
})


def _refuse(event: str, args: tuple) -> None:
    if event in _REFUSED:
        raise PermissionError(f"the LiteRT converter may not {event} {args[:2]!r}")


def main(argv: list[str]) -> int:
    source, folder = argv
    sys.addaudithook(_refuse)
    import onnx2tf

    # Inputs keep their ONNX layout: by default onnx2tf makes 3- to 5-d inputs channels-last.
    import onnx
    names = [value.name for value in onnx.load(source, load_external_data=False).graph.input]
    onnx2tf.convert(
        input_onnx_file_path=source, output_folder_path=folder,
        tflite_backend="flatbuffer_direct", copy_onnx_input_output_names_to_tflite=True,
        keep_shape_absolutely_input_names=names or None, not_use_onnxsim=True, non_verbose=True,
        verbosity="error",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
