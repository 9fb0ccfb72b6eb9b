"""Tools built on the compiler: the ``kiln`` command and what only it, the tests and the benchmarks use.

    cli.py           the ``kiln`` command (``main``; ``kiln dump``, and the commands of the modules below)
    cli_compile.py   ``kiln compile``, ``kiln run`` and ``kiln inspect``
    bench.py         ``kiln bench`` and ``bench_model``, Kiln against ONNX Runtime and PyTorch
    zoo.py           the models Kiln builds with PyTorch (``zoo:NAME`` specs)
    feeds.py         seeded random inputs a model can take (``kiln run``, ``dump --check``, ``bench``)
    onnx_backend.py  ``onnx.backend.base.Backend`` for Kiln (ONNX's backend test suite)

The tools sit on top of the layers (``compiler/ir`` <- ``compiler/passes`` <- ``compiler/codegen``
<- ``compiler/runtime`` <- the driver): they may import any of them, and nothing below imports them
(docs/design.md, "Layers").
"""
