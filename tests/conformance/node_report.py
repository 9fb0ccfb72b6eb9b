"""Developer report: run ONNX backend node cases against Kiln, print pass/fail per case.

    python tests/conformance/node_report.py [REGEX] [--kind node|simple|pytorch-converted|pytorch-operator|real]
        [--fails] [--summary]

REGEX filters case names (e.g. 'test_conv|test_maxpool'). The checks are the ones ONNX's BackendTest
makes (its own comparison function), so a case that passes here passes in the pytest suite.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
import traceback
import warnings

import numpy as np


def _load_dir(model_dir: str):
    """A model directory's model.onnx and test_data_set_*/{input,output}_N.pb (real cases need the pytest suite)."""
    import glob
    import os

    import onnx
    from onnx import numpy_helper

    if model_dir is None:
        raise RuntimeError("real-model cases run only in the pytest suite")
    model = onnx.load(os.path.join(model_dir, "model.onnx"))

    def read(path):
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        return numpy_helper.to_array(t)

    sets = []
    for d in sorted(glob.glob(os.path.join(model_dir, "test_data_set*"))):
        ins = [read(p) for p in sorted(glob.glob(os.path.join(d, "input_*.pb")), key=lambda p: int(p[:-3].rsplit("_", 1)[1]))]
        outs = [read(p) for p in sorted(glob.glob(os.path.join(d, "output_*.pb")), key=lambda p: int(p[:-3].rsplit("_", 1)[1]))]
        sets.append((ins, outs))
    return model, sets


def main(argv=None) -> int:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("regex", nargs="?", default=".")
    ap.add_argument("--kind", default="node")
    ap.add_argument("--fails", action="store_true", help="print only failures")
    ap.add_argument("--summary", action="store_true", help="only counts, and failures grouped by message")
    ap.add_argument("--tb", action="store_true", help="print tracebacks")
    args = ap.parse_args(argv)

    import onnx.backend.test.loader as loader
    from onnx.backend.test.runner import Runner, _normalize_tensor

    from compiler.tools.onnx_backend import KilnBackend

    cases = [c for c in loader.load_model_tests(kind=args.kind) if re.search(args.regex, c.name)]
    passed = 0
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for c in cases:
        try:
            model, data_sets = (c.model, c.data_sets) if c.model is not None else _load_dir(c.model_dir)
            rep = KilnBackend.prepare(model)
            for inputs, refs in data_sets:
                outs = rep.run([_normalize_tensor(i) for i in inputs])
                Runner.assert_similar_outputs([_normalize_tensor(r) for r in refs], list(outs),
                                              rtol=c.rtol, atol=c.atol)
            passed += 1
            if not (args.fails or args.summary):
                print(f"PASS {c.name}")
        except Exception as e:  # report and go on
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]
            groups[re.sub(r"\d+", "N", msg)[:90]].append(c.name)
            if not args.summary:
                print(f"FAIL {c.name}: {msg}")
                if args.tb:
                    traceback.print_exc()
    print(f"{passed} passed, {len(cases) - passed} failed of {len(cases)} {args.kind} cases matching {args.regex!r}")
    if args.summary:
        for msg, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"{len(names):4d}  {msg}   e.g. {names[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
