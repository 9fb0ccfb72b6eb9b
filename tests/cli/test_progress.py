"""Progress on long work: ``compile(progress=True)`` (what ``kiln compile``, ``kiln profile`` and
``kiln bench`` turn on when stderr is a terminal) shows the phase and the pass running on one line of
stderr and clears it at the end; off, and off the terminal, nothing is written."""
from __future__ import annotations

import compiler
from compiler.tools.cli import main
from tests.cli.test_profile import _model


def test_progress_names_each_pass_and_clears_its_line(capsys):
    compiler.compile(_model(), progress=True)
    err = capsys.readouterr().err
    assert "importing the model" in err and "pass 1/" in err and " fuse (" in err
    assert "compiling" in err and "with LLVM" in err
    assert err.endswith("\r\033[K")  # the line is cleared: the command's own output follows on a clean line


def test_no_progress_when_off_or_not_on_a_terminal(tmp_path, capsys):
    compiler.compile(_model())
    assert capsys.readouterr().err == ""
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(_model(), str(path))
    assert main(["compile", str(path), "-o", str(tmp_path / "m.kiln")]) == 0  # stderr is captured: no terminal
    assert "\r" not in capsys.readouterr().err
