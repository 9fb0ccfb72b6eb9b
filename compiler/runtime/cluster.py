"""A multi-device artifact on a Ray cluster: each part a Ray actor, the same API.

    exe = compiler.load("m.kiln", cluster="ray")              # this machine's Ray (or RAY_ADDRESS's)
    exe = compiler.load("m.kiln", cluster="ray://head:10001") # a Ray cluster elsewhere (Ray Client)
    kiln run m.kiln --cluster ray

Every part of the artifact (a pipeline stage, or a replica) becomes an actor that asks for as many
CPUs as its device has cores, so Ray places it where they are free: on this machine or another. The
driver sends each actor its part as bytes (a tar of the part's directory, through Ray's object
store), and the actor unpacks it to a temporary directory and loads it as ``load`` does (checksums,
CPU features) and checks it against the index's SHA-256 of its manifest. Nodes need only Kiln
installed (``pip install 'kiln[distributed]'``), not the artifact.

``run`` and ``run_many`` behave as the local ``MultiDeviceExecutable``'s: a pipeline chains each
item's stage calls (an actor runs its calls in order, so the stages work on consecutive items at
once; at most two items per stage in flight), replicas take their rows of each item. Values move
between actors through the object store. Ray is optional: without it, ``cluster=`` says how to get
it.
"""
from __future__ import annotations

import io
import os
import tarfile
import tempfile
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import KilnError
from .artifact import ArtifactError
from .multidevice import INDEX, MultiDeviceExecutable, Part, _rows, _stage


def ray_module():
    """``ray``, or a ``KilnError`` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise KilnError("running on a Ray cluster needs the ray package: pip install 'kiln[distributed]' "
                        "(or pip install ray)") from None
    return ray


def connect(cluster: str):
    """Join the Ray cluster ``cluster`` names ("ray": the one this process already joined, else
    RAY_ADDRESS's or a new local one; "ray://HOST:PORT": a remote one through Ray Client)."""
    if cluster != "ray" and not cluster.startswith("ray://"):
        raise KilnError(f"cluster {cluster!r}: expected 'ray' or 'ray://HOST:PORT'")
    ray = ray_module()
    if not ray.is_initialized():
        ray.init(address=None if cluster == "ray" else cluster, include_dashboard=False, log_to_driver=False)
    return ray


class PartActor:
    """A part of a multi-device artifact, loaded in a Ray worker (see the module docstring)."""

    def __init__(self, name: str, blob: bytes, manifest_sha256: str, nthreads: int):
        from .executable import load

        self._dir = tempfile.TemporaryDirectory(prefix="kiln-ray-")
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(self._dir.name, filter="data")  # no links out, no absolute paths
        self.exe = load(os.path.join(self._dir.name, name), nthreads)
        if self.exe.manifest.manifest_sha256 != manifest_sha256:
            raise ArtifactError(f"part {name} is not the one its index was written with")

    def stage(self, part: Part, env: dict) -> dict:
        part.exe = self.exe
        return _stage(part, env)

    def rows(self, start: int, stop: int, items: list[dict]) -> list[dict]:
        return [self.exe.run(_rows(f, start, stop)) for f in items]

    def node(self) -> str:
        import socket

        return socket.gethostname()


def _pack(path: str, name: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(os.path.join(path, name), arcname=name)
    return buf.getvalue()


class RayExecutable(MultiDeviceExecutable):
    """A ``MultiDeviceExecutable`` whose parts run as Ray actors (see the module docstring)."""

    def __init__(self, path: str, index: dict, parts: list[Part], cluster: str, nthreads: int | None = None):
        self._setup(path, index, parts)
        self.cluster = cluster
        ray = connect(cluster)
        self._ray = ray
        actor = ray.remote(PartActor)
        cores = {d["name"]: max(1, len(d["cores"])) for d in index["devices"]}
        blobs: dict[str, Any] = {}
        self._actors: list = []  # one per part: replicas of one artifact are one actor each
        for p in parts:
            if p.name not in blobs:
                blobs[p.name] = ray.put(_pack(path, p.name))
            n = cores[p.device]
            self._actors.append(actor.options(num_cpus=n).remote(p.name, blobs[p.name], index_sha(index, p.name),
                                                                 nthreads or n))
        try:
            ray.get([a.node.remote() for a in self._actors])  # loaded (or the load's error)
        except Exception as e:
            self.close()
            last = str(e).strip().splitlines()[-1:] or [type(e).__name__]  # the actor's own error, as Ray ends it
            raise ArtifactError(f"{path}: a part failed to load on the Ray cluster: {last[0]}") from None

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self.run_many([inputs])[0]

    def run_many(self, items: Sequence[Mapping[str, Any]]) -> list[dict[str, np.ndarray]]:
        ray = self._ray
        checked = [self._check(x) for x in items]
        if self.parallel == "data":
            refs = [a.rows.remote(p.rows[0], p.rows[1], checked) for p, a in zip(self.parts, self._actors)]
            per_part = _get(ray, refs)
            return [{n: np.concatenate([outs[i][n] for outs in per_part]) for n in self.output_names}
                    for i in range(len(checked))]
        if self.micro is not None:
            pieces = [_rows(f, s, s + self.micro) for f in checked for s in range(0, self.batch, self.micro)]
        else:
            pieces = checked
        depth, last = 2 * len(self.parts), []
        for env in pieces:
            if len(last) >= depth:
                ray.wait([last[len(last) - depth]])  # at most `depth` items in flight
            ref = env
            for p, a in zip(self.parts, self._actors):
                ref = a.stage.remote(_bare(p), ref)
            last.append(ref)
        outs = [{n: o[n] for n in self.output_names} for o in _get(ray, last)]
        if self.micro is None:
            return outs
        k = self.batch // self.micro
        return [{n: np.concatenate([o[n] for o in outs[i * k:(i + 1) * k]]) for n in self.output_names}
                for i in range(len(checked))]

    def save(self, path: str | os.PathLike) -> str:
        from .multidevice import load_multidevice

        return load_multidevice(self.path).save(path)

    def nodes(self) -> list[tuple[str, str, str]]:
        """(part, device, the host its actor runs on) of each part."""
        hosts = self._ray.get([a.node.remote() for a in self._actors])
        return [(p.name, p.device, h) for p, h in zip(self.parts, hosts)]

    def close(self) -> None:
        for a in getattr(self, "_actors", []):
            self._ray.kill(a)
        self._actors = []

    def __repr__(self) -> str:
        return f"<RayExecutable {self.index.get('model')} {self.parallel} on {self.cluster}: {len(self.parts)} part(s)>"


def _bare(p: Part) -> Part:
    """The part as an actor call needs it: names only (its actor holds the executable)."""
    return Part(p.name, p.device, p.cores, p.inputs, p.outputs, p.rows, None, p.keep)


def _get(ray, refs):
    """``ray.get``, a stage's own error raised as it is (not wrapped in Ray's task error)."""
    try:
        return ray.get(refs)
    except Exception as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, BaseException):
            raise cause from None
        raise


def index_sha(index: dict, name: str) -> str:
    return next(p["manifest_sha256"] for p in index["parts"] if p["path"] == name)


__all__ = ["INDEX", "PartActor", "RayExecutable", "connect", "ray_module"]
