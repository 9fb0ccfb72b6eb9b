"""Kiln: a deep-learning graph compiler.

    import compiler
    exe = compiler.compile("model.onnx", opt_level=2, input_shapes={"x": (1, 3, 224, 224)})
    outs = exe.run({"x": x})            # dict name -> array; exe(x) also works
    exe.save("model.kiln"); exe2 = compiler.load("model.kiln")   # load compiles nothing

The IR lives in ``compiler.ir``; ONNX models come in through ``frontends.onnx``; the pass pipeline is
``compiler.passes``; native code ``compiler.codegen``; artifacts and executables ``compiler.runtime``.
"""
__version__ = "0.1.0"


def compile(model, opt_level: int = 2, input_shapes=None, **options):
    """Compile a model to native code; see ``compiler.driver.compile``."""
    from .driver import compile as _compile

    return _compile(model, opt_level, input_shapes, **options)


def profile(exe, feeds, runs=20, **options):
    """Time every kernel of ``exe`` (compiled with ``profile=True``) over ``runs`` runs; see
    ``compiler.profiling.profile``."""
    from .profiling import profile as _profile

    return _profile(exe, feeds, runs, **options)


def load(path, nthreads=None, cluster=None):
    """Load a compiled artifact; see ``compiler.runtime.executable.load``. An artifact of a model with
    symbolic input dimensions loads as a ``compiler.specialize.Specializing`` executable; a
    multi-device one (``compile(..., devices=...)``) as a ``runtime.multidevice.MultiDeviceExecutable``,
    or with ``cluster="ray"`` / ``"ray://HOST:PORT"`` as a ``runtime.cluster.RayExecutable`` (its parts
    as Ray actors)."""
    import os

    from .runtime.executable import load as _load
    from .specialize import is_specializing, load_specializing

    from .runtime.multidevice import is_multidevice, load_multidevice

    if is_multidevice(path):
        return load_multidevice(path, nthreads, cluster)
    if cluster is not None:
        from .errors import KilnError

        raise KilnError(f"{path}: cluster= runs a multi-device artifact (compile with devices=...); this one "
                        f"is for one device")
    exe = _load(path, nthreads)
    manifest = getattr(exe, "manifest", None)
    if manifest is not None and hasattr(manifest, "files") and is_specializing(manifest):
        return load_specializing(os.fspath(path), exe, nthreads)
    return exe
