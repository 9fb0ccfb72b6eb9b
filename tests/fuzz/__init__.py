"""Kiln's fuzzers (issue 21): random valid ONNX graphs run by ONNX Runtime and by Kiln at every -O level
(``gen.py``, ``harness.py``), and malformed or hostile model files and tampered artifacts
(``mutate.py``). Every Kiln run happens in a worker process (``pool.py``), so a crash by a signal or a
hang is caught and classified like any other outcome.

    python -m tests.fuzz 200 --seed 1 --mutants 300 --out tests/fuzz/failures
    make fuzz N=1000

``test_fuzz.py`` runs a fixed-seed batch of both in the test suite.
"""
